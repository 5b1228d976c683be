"""Kinds of Python state a trace depends on (issue 46): an Enum member, a set changed in
place, a NumPy float scalar, a namedtuple of numbers replaced with ``_replace``, and a
weakly typed array replaced by a strongly typed one (or back). Each is current on every
call, eager and under `jd.function`, and the numbers among them do not compile every call.

Each replica's batch sums to 8 / R, so the all-reduced sum is 8 on every strategy; the
expected values are the same rules run as plain Python (or plain JAX for dtypes) on 8.
"""

import collections
import enum

import jax
import jax.numpy as jnp
import numpy as np
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


def test_a_jd_function_toggling_an_enum_member_writes_it_back(s):
    """``m.phase = Phase.EVAL if m.phase is Phase.TRAIN else Phase.TRAIN`` in a jd.function
    that reads the Enum's class as a global: the member is written back after each call (an
    internal error, "Phase._use_args_ is not a slot", before)."""
    m, x = Phased(), ones_batch(s)

    @jd.function
    def toggle(x):
        out = s.reduce("SUM", s.run(m.step, args=(x,)), axis=None)
        m.phase = Phase.EVAL if m.phase is Phase.TRAIN else Phase.TRAIN
        return out

    expected, phase = [], Phase.TRAIN
    for _ in range(4):
        expected.append(s.num_replicas_in_sync * phase_rule(phase, 8.0))
        phase = Phase.EVAL if phase is Phase.TRAIN else Phase.TRAIN
    assert [float(toggle(x)) for _ in range(4)] == expected
    assert m.phase is Phase.TRAIN


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


# 3. a NumPy float scalar ---------------------------------------------------------------


class Cosine:
    def __init__(self):
        self.lr = np.cos(0.0)

    def step(self, x):
        return self.lr * total(x)


def test_a_numpy_float64_schedule_is_an_input_not_a_trace_per_call(s, run):
    m, x = Cosine(), ones_batch(s)
    for k in range(12):
        m.lr = np.cos(k * 0.1)  # an np.float64 each call
        assert float(run(m.step, x)) == pytest.approx(8.0 * np.cos(k * 0.1), rel=1e-6)
    assert type(m.lr) is np.float64
    assert run.traces(m.step) <= 2  # as a Python float's: one more trace at most


class BfloatCosine:
    def __init__(self, lr):
        self.lr = lr

    def step(self, x):
        return x.astype(jnp.bfloat16) * self.lr


@pytest.mark.parametrize("kind", [float, np.float64, np.float32])
def test_a_numpy_float_keeps_jax_dtype_rules(s, run, kind):
    """A Python float is weakly typed (bfloat16 times it stays bfloat16); a NumPy float
    is not (JAX gives float32): the same when it is a program input."""
    m, x = BfloatCosine(kind(0.5)), ones_batch(s)
    for k in range(4):
        m.lr = kind(np.cos(k * 0.1))
        out = run(m.step, x)
        plain = jnp.ones(2, jnp.bfloat16) * kind(np.cos(k * 0.1))  # plain JAX
        assert out.dtype == plain.dtype
        np.testing.assert_allclose(np.asarray(out, np.float32), float(plain[0]), rtol=1e-6)
    assert run.traces(m.step) <= 2


class Decay:
    def __init__(self):
        self.lr = np.float32(0.5)

    def step(self, x):
        self.lr = self.lr * np.float32(0.9)
        return self.lr * total(x)


def test_a_numpy_float32_the_step_writes_stays_a_numpy_float32(s, run):
    m, x = Decay(), ones_batch(s)
    lr = np.float32(0.5)
    for _ in range(6):
        lr = lr * np.float32(0.9)  # plain NumPy
        assert float(run(m.step, x)) == pytest.approx(8.0 * float(lr), rel=1e-6)
        assert type(m.lr) is np.float32 and m.lr == pytest.approx(lr, rel=1e-6)
    assert run.traces(m.step) <= 2


# 4. a namedtuple of numbers replaced with _replace -------------------------------------

Config = collections.namedtuple("Config", "lr scale")


class Configured:
    def __init__(self):
        self.cfg = Config(0.1, 2.0)

    def step(self, x):
        return self.cfg.lr * self.cfg.scale * total(x)


def test_a_namedtuple_replaced_each_call_is_fresh_and_not_a_trace_per_call(s, run):
    m, x = Configured(), ones_batch(s)
    original = m.cfg
    for k in range(12):
        m.cfg = m.cfg._replace(lr=0.1 * (k + 1))
        if k == 6:
            m.cfg = m.cfg._replace(scale=3.0)
        expected = m.cfg.lr * m.cfg.scale * 8.0
        held = m.cfg
        assert float(run(m.step, x)) == pytest.approx(expected, rel=1e-6)
        assert m.cfg is held  # the state is left as the program found it
    assert original == Config(0.1, 2.0)
    # as for numbers in attributes: one more trace when each of lr and scale first moves
    assert run.traces(m.step) <= 3


class Annealed:
    def __init__(self):
        self.cfg = Config(0.5, 2.0)

    def step(self, x):
        self.cfg = self.cfg._replace(lr=self.cfg.lr * 0.5)
        return self.cfg.lr * self.cfg.scale * total(x)


def test_a_namedtuple_the_step_replaces_holds_python_numbers(s, run):
    m, x = Annealed(), ones_batch(s)
    lr = 0.5
    for _ in range(6):
        lr *= 0.5  # plain Python
        assert float(run(m.step, x)) == pytest.approx(lr * 2.0 * 8.0, rel=1e-6)
        assert type(m.cfg) is Config and type(m.cfg.lr) is float
        assert m.cfg.lr == pytest.approx(lr, rel=1e-6) and m.cfg.scale == 2.0
    assert run.traces(m.step) <= 2


# 5. a weakly typed array replaced by a strongly typed one ------------------------------


class Weighted:
    def __init__(self, w):
        self.w = w

    def step(self, x):
        return x.astype(jnp.bfloat16) * self.w


def test_weak_and_strong_arrays_keep_their_dtype_rules(s, run):
    """``jnp.asarray(0.3)`` is weakly typed (bfloat16 times it stays bfloat16), a float32
    array is not (the product is float32): a trace of one does not serve the other."""
    m, x = Weighted(jnp.asarray(0.3)), ones_batch(s)
    for w in [jnp.asarray(0.3), jnp.asarray(0.3, jnp.float32), jnp.asarray(0.5)]:
        m.w = w
        out = run(m.step, x)
        plain = jnp.ones(2, jnp.bfloat16) * w  # plain JAX
        assert out.dtype == plain.dtype
        np.testing.assert_allclose(np.asarray(out, np.float32), float(plain[0]), rtol=1e-6)
    assert run.traces(m.step) == 2  # weak, strong; the weak trace again


# 6. a capture the function assigns (a new object each call) ----------------------------


def test_a_function_assigning_a_list_it_captures_traces_once(s):
    """``nonlocal held; held = [...]`` under `jd.function`: a new list in the closure cell
    each call, written by the function itself, fits its trace on the next call (the old
    lists are kept alive here, so no new one takes an old one's id)."""
    held, kept = [1.0, 2.0], []

    def step(x):
        return total(x) * held[0]

    @jd.function
    def f(x):
        nonlocal held
        out = s.reduce("MEAN", s.run(step, args=(x,)), axis=None)  # (each replica's: 8)
        held = [held[0] + 1.0, held[1]]
        return out

    x = ones_batch(s)
    outs = []
    for _ in range(4):
        kept.append(held)
        outs.append(float(f(x)))
    assert outs == [8.0, 16.0, 24.0, 32.0]  # plain Python: 8 * 1, 8 * 2, ...
    assert held == [5.0, 2.0]
    assert f.experimental_get_tracing_count() == 1


def test_a_change_during_the_call_of_a_function_assigning_its_captures_is_seen(s):
    """A host callback rebinds a global helper while the program runs, in a call of a
    function that assigns a list it captures: the next call uses the new helper (the
    helper's change is not taken as the function's own write)."""
    from jax.experimental import io_callback

    scale, calls = {"now": 2.0}, [0]
    held = [jnp.zeros(())]

    def helper(v):
        return v * scale["now"]

    def on_call(v):
        calls[0] += 1
        if calls[0] == 2:
            G["helper"] = lambda v: v * 3.0  # (a new function: its code, another object)
        return np.zeros((), np.float32)

    G = {"helper": helper}

    def step(x):
        return total(x)

    @jd.function
    def f(x):
        nonlocal held
        out = s.reduce("MEAN", s.run(step, args=(x,)), axis=None)
        out = G["helper"](out) + io_callback(on_call, jax.ShapeDtypeStruct((), jnp.float32), out)
        held = [held[0] + out]
        return out

    x = ones_batch(s)
    outs = [float(f(x)) for _ in range(4)]
    assert outs == [16.0, 16.0, 24.0, 24.0]  # plain Python: 8 * 2 twice, then 8 * 3
