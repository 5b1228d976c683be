"""The state check mode (issue 46, item 4): every call of a cached step is traced again and
compared with the cached program; a difference is a `StateCheckError` naming it.

The routes below are ones jaxdist does not track (a `contextvars.ContextVar`, an ``eval``):
without the mode the step computes with the first value (with a warning for an array);
under it, the second call raises before the stale program runs.
"""

import contextvars
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import mirrored, ones_batch, state_checks, total

import jaxdist as jd
from jaxdist._state import recheck

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

SCALE = contextvars.ContextVar("scale")


@pytest.fixture
def checks():
    with state_checks(True):
        yield


@pytest.fixture
def unchecked():
    with state_checks(False):  # (make test-checked runs this file with the mode on)
        yield


def _eager(strategy, step):
    x = ones_batch(strategy)
    return lambda: float(strategy.experimental_local_results(strategy.run(step, args=(x,)))[0])


def _function(strategy, step):
    x = ones_batch(strategy)
    f = jd.function(lambda x: strategy.reduce("SUM", strategy.run(step, args=(x,)), axis=None))
    return lambda: float(f(x)) / strategy.num_replicas_in_sync


CALLS = {"eager": _eager, "jd.function": _function}


def _array_step(x):
    return total(x) * SCALE.get()


def _number_step(x):  # (another code: a plain function's programs are its code's)
    return total(x) * SCALE.get()


# the step, the value it reads through the untracked route first and then, what the error names
VALUES = {
    "array": (_array_step, jnp.ones(()), jnp.full((), 5.0), "constant .* is now 5.0"),
    "number": (_number_step, 1.0, 5.0, "the program"),
}


@pytest.mark.parametrize("n", (1, 2, 8))
@pytest.mark.parametrize("how", list(CALLS))
@pytest.mark.parametrize("kind", list(VALUES))
def test_a_value_read_through_an_untracked_route_is_named(checks, n, how, kind):
    strategy = mirrored(n)
    step, first, then, named = VALUES[kind]
    call = CALLS[how](strategy, step)
    SCALE.set(first)
    assert call() == 8.0
    SCALE.set(then)
    with pytest.raises(jd.experimental.StateCheckError, match=named):
        call()


@pytest.mark.parametrize("n", (1, 2, 8))
@pytest.mark.parametrize("how", list(CALLS))
def test_without_the_mode_the_same_route_is_stale(unchecked, n, how):
    """What the mode is for: the same step, unchecked, keeps the first value."""
    strategy = mirrored(n)

    def step(x):
        return total(x) * SCALE.get()

    call = CALLS[how](strategy, step)
    SCALE.set(jnp.ones(()))
    assert call() == 8.0
    SCALE.set(jnp.full((), 5.0))
    assert call() == 8.0  # stale: the route is one jaxdist cannot see


@pytest.mark.parametrize("n", (1, 2, 8))
def test_a_tracked_trainer_runs_checked_as_unchecked(checks, n):
    """TF's trainer shape (state on self, assigned in the jd.function, a Python counter):
    the checked calls give the unchecked answers, and the check's traces are not counted."""
    strategy = mirrored(n)

    class Trainer:
        def __init__(self):
            self.w, self.lr, self.steps = jnp.zeros(()), 0.5, 0

        def replica_step(self, x):
            g = total(x) / 8.0
            return self.w - self.lr * g

        @jd.function
        def train(self, x):
            self.w = strategy.reduce("MEAN", strategy.run(self.replica_step, args=(x,)), axis=None)
            self.steps += 1
            return self.w

    t, x = Trainer(), ones_batch(strategy)
    out = [float(t.train(x)) for _ in range(3)]
    t.lr = 1.0  # a Python number the host changes: read afresh, checked
    out += [float(t.train(x)) for _ in range(2)]
    np.testing.assert_allclose(out, [-0.5, -1.0, -1.5, -2.5, -3.5])
    assert t.steps == 5
    assert t.train.experimental_get_tracing_count() <= 2


@pytest.mark.parametrize("n", (1, 8))
def test_an_eager_step_reading_state_on_self_is_checked_and_current(checks, n):
    strategy = mirrored(n)

    class T:
        def __init__(self):
            self.w = jnp.ones(())

        def step(self, x):
            return total(x) * self.w

    t = T()
    call = _eager(strategy, t.step)
    got = []
    for v in (1.0, 2.0, 3.0):
        t.w = jnp.full((), v)
        got.append(call())
    assert got == [8.0, 16.0, 24.0]
    assert jd.experimental.step_count(t.step) == 1


def test_dead_code_and_placement_do_not_make_two_traces_differ():
    def f(x, dead):
        if dead:
            _ = jnp.zeros(3) + 1.0
        return x * 2.0

    a = recheck.program_form(jax.make_jaxpr(lambda x: f(x, True))(1.0).jaxpr, [])
    b = recheck.program_form(jax.make_jaxpr(lambda x: f(x, False))(1.0).jaxpr, [])
    assert a == b
    placed = recheck.program_form(jax.make_jaxpr(lambda x: jax.device_put(x) * 2.0)(1.0).jaxpr, [])
    assert "device_put" in str(jax.make_jaxpr(lambda x: jax.device_put(x) * 2.0)(1.0))
    assert placed == a
    c = recheck.program_form(jax.make_jaxpr(lambda x: x * 3.0)(1.0).jaxpr, [])
    assert c[0] != a[0]


def test_set_state_checks_takes_a_bool():
    with pytest.raises(TypeError, match="takes a bool; got 1"):
        jd.experimental.set_state_checks(1)  # type: ignore[arg-type]


def test_the_environment_turns_the_mode_on():
    code = "import jaxdist as jd; print(jd.experimental.state_checks())"
    env = {**os.environ, "JAXDIST_CHECK_STATE": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "True", out.stderr[-2000:]


def test_a_one_replica_step_replayed_before_the_mode_was_on_is_checked(unchecked):
    """One replica replays a repeated call from a plan it kept; a plan kept before the mode
    was turned on is not replayed under it: the call is checked."""
    strategy = mirrored(1)

    def step(x):
        return total(x) * SCALE.get()

    call = _eager(strategy, step)
    SCALE.set(jnp.ones(()))
    assert [call(), call()] == [8.0, 8.0]  # the second call replays the kept plan
    SCALE.set(jnp.full((), 5.0))
    with state_checks(True):
        with pytest.raises(jd.experimental.StateCheckError, match="is now 5.0"):
            call()
