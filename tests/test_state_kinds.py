"""Kinds of Python state a trace depends on (issue 46): an Enum member, a set changed in
place, a NumPy float scalar, a namedtuple of numbers replaced with ``_replace``, and a
weakly typed array replaced by a strongly typed one (or back). Each is current on every
call, eager and under `jd.function`, and the numbers among them do not compile every call.

Each replica's batch sums to 8 / R, so the all-reduced sum is 8 on every strategy; the
expected values are the same rules run as plain Python (or plain JAX for dtypes) on 8.
"""

import enum

import pytest
from conftest import mirrored, ones_batch, total

import jaxdist as jd

# the Runner's jd.function of each test has one code: its retrace warning counts them all
pytestmark = pytest.mark.filterwarnings("ignore:jd.function .* has been traced:UserWarning")


@pytest.fixture(params=[1, 2, 8], ids=lambda n: f"r{n}")
def s(request):
    return mirrored(request.param)


class Runner:
    """Runs steps eagerly (``strategy.run``) or from inside a `jd.function`, and counts
    the traces of a step."""

    def __init__(self, s, compiled):
        self.s, self.compiled, self._fns = s, compiled, {}

    def results(self, fn, x):
        if not self.compiled:
            return self.s.experimental_local_results(self.s.run(fn, args=(x,)))
        call = self._fns.get(fn)
        if call is None:
            call = self._fns[fn] = jd.function(lambda x: self.s.run(fn, args=(x,)))
        return self.s.experimental_local_results(call(x))

    def __call__(self, fn, x):
        """Replica 0's result (its only output)."""
        return self.results(fn, x)[0]

    def traces(self, fn):
        if not self.compiled:
            return jd.experimental.step_count(fn)
        return self._fns[fn].experimental_get_tracing_count()


@pytest.fixture(params=["eager", "function"])
def run(request, s):
    return Runner(s, request.param == "function")


# 1. an Enum member ---------------------------------------------------------------------


class Phase(enum.Enum):
    TRAIN = 1
    EVAL = 2


def phase_rule(phase, t):
    if phase is Phase.TRAIN:
        return t * 2.0
    return t - 1.0


class Phased:
    def __init__(self):
        self.phase = Phase.TRAIN

    def step(self, x):
        return phase_rule(self.phase, total(x))


def test_an_enum_member_in_state_gives_its_branch(s, run):
    m, x = Phased(), ones_batch(s)
    for phase in [Phase.TRAIN, Phase.EVAL, Phase.EVAL, Phase.TRAIN, Phase.EVAL]:
        m.phase = phase
        assert float(run(m.step, x)) == phase_rule(phase, 8.0)
    assert run.traces(m.step) == 2  # one per member: each trace is kept


# 2. a set changed in place -------------------------------------------------------------


def frozen_rule(frozen, t):
    return t * (0.0 if "a" in frozen else 1.0) + (10.0 if "b" in frozen else 0.0)


class Freezer:
    def __init__(self):
        self.frozen = set()

    def step(self, x):
        return frozen_rule(self.frozen, total(x))


def test_a_set_changed_in_place_gives_its_branch(s, run):
    m, x = Freezer(), ones_batch(s)
    for change in [None, ("add", "a"), None, ("add", "b"), ("discard", "a"), ("discard", "b")]:
        if change:
            getattr(m.frozen, change[0])(change[1])
        assert float(run(m.step, x)) == frozen_rule(m.frozen, 8.0)
    assert run.traces(m.step) == 4  # {}, {a}, {a, b}, {b}: back to {} reuses the first


def test_a_frozenset_replaced_gives_its_branch(s, run):
    m, x = Freezer(), ones_batch(s)
    for frozen in [frozenset(), frozenset("a"), frozenset("ab"), frozenset()]:
        m.frozen = frozen
        assert float(run(m.step, x)) == frozen_rule(frozen, 8.0)
    assert run.traces(m.step) == 3
