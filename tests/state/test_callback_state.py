"""A list that a ``jax.debug.callback`` appends to when the program runs (issue 46).

The trace never reads such a list (the callback's function runs after it, on every
call), so its growth must not trace the step again; a list the step DOES read while
traced (``len(self.log)`` in its Python, ``self.log[-1]`` as a value) stays an input of
the trace: its change traces the step again, and the step gives plain Python's answer.
Expected values are plain Python's (per replica: ``x``'s rows summed).
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import mirrored

import jaxdist as jd

CALLS = 4
LOG: list = []  # a module's list, appended to by the callback


def _batches(n):
    """``CALLS`` batches of 2 rows per replica: call ``i``, replica ``r`` sums to a
    value unique to both."""
    return [np.arange(2 * n, dtype=np.float32) + 100.0 * i for i in range(CALLS)]


def _sums(batch, n):
    return sorted(float(np.sum(part)) for part in np.split(batch, n))


class Logged:
    """A step whose replica step logs its loss through ``jax.debug.callback``, to a list
    on ``self`` or to the module's list; ``traces`` counts its traces."""

    def __init__(self, strategy, where):
        self.strategy, self.where = strategy, where
        self.log: list = []
        self.traces: list = []

    def replica_step(self, x):
        self.traces.append(1)  # runs when the step is traced only
        loss = jnp.sum(x)
        if self.where == "self":
            jax.debug.callback(lambda v: self.log.append(float(v)), loss)
        else:
            jax.debug.callback(lambda v: LOG.append(float(v)), loss)
        return loss

    def step(self, x):
        return self.strategy.run(self.replica_step, args=(x,))

    def logged(self):
        return self.log if self.where == "self" else LOG


@pytest.mark.parametrize("n", (1, 2, 8))
@pytest.mark.parametrize("how", ["jd.function", "eager"])
@pytest.mark.parametrize("where", ["self", "module"])
def test_a_list_a_callback_appends_to_does_not_trace_the_step_again(n, how, where):
    strategy = mirrored(n)
    LOG.clear()
    t = Logged(strategy, where)
    step = jd.function(t.step) if how == "jd.function" else t.step
    batches = _batches(n)
    for i, batch in enumerate(strategy.experimental_distribute_dataset(batches)):
        step(batch)
        jax.effects_barrier()
        # one entry per replica per call (in any order across replicas), the right values
        assert len(t.logged()) == n * (i + 1)
        assert sorted(t.logged()[n * i :]) == _sums(batches[i], n)
    assert len(t.traces) == 1  # one trace over the calls
    if how == "jd.function":
        assert step.experimental_get_tracing_count() == 1
    LOG.clear()


@pytest.mark.parametrize("n", (1, 2, 8))
def test_a_jd_function_logging_its_reduced_loss_logs_one_entry_per_call(n):
    strategy = mirrored(n)
    log: list = []

    class Model:
        def replica_step(self, x):
            return jnp.sum(x)

        @jd.function
        def step(self, x):
            loss = strategy.reduce("SUM", strategy.run(self.replica_step, args=(x,)), axis=None)
            jax.debug.callback(lambda v: self.log.append(float(v)), loss)
            return loss

    m = Model()
    m.log = log
    batches = _batches(n)
    for batch in strategy.experimental_distribute_dataset(batches):
        m.step(batch)
    jax.effects_barrier()
    assert log == [float(np.sum(b)) for b in batches]
    assert m.step.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("n", (1, 2, 8))
@pytest.mark.parametrize("how", ["jd.function", "eager"])
def test_a_list_in_a_closure_a_callback_appends_to_does_not_trace_the_step_again(n, how):
    strategy = mirrored(n)
    log: list = []
    traces: list = []

    def replica_step(x):
        traces.append(1)
        loss = jnp.sum(x)
        jax.debug.callback(lambda v: log.append(float(v)), loss)
        return loss

    def step(x):
        return strategy.run(replica_step, args=(x,))

    f = jd.function(step) if how == "jd.function" else step
    batches = _batches(n)
    for batch in strategy.experimental_distribute_dataset(batches):
        f(batch)
    jax.effects_barrier()
    assert sorted(log) == sorted(v for b in batches for v in _sums(b, n))
    assert len(traces) == 1


@pytest.mark.parametrize("n", (1, 2, 8))
@pytest.mark.parametrize("how", ["jd.function", "eager"])
def test_a_list_the_step_reads_when_traced_is_still_an_input(n, how):
    """The control: the step reads ``len(self.log)`` in its Python while the callback
    appends to it, so each call's trace sees the log's length then, as Python does."""
    strategy = mirrored(n)

    class Counted(Logged):
        def replica_step(self, x):
            self.traces.append(1)
            seen = len(self.log)  # read when traced: the program's constant
            jax.debug.callback(lambda v: self.log.append(float(v)), jnp.sum(x))
            return jnp.sum(x) * seen

    t = Counted(strategy, "self")
    step = jd.function(t.step) if how == "jd.function" else t.step
    batches = _batches(n)
    for i, batch in enumerate(strategy.experimental_distribute_dataset(batches)):
        before = len(t.log)
        out = step(batch)
        jax.effects_barrier()
        got = sorted(float(v) for v in strategy.experimental_local_results(out))
        assert before == n * i
        assert got == [s * before for s in _sums(batches[i], n)]
    assert len(t.traces) == CALLS  # a new length each call: traced each call


@pytest.mark.parametrize("n", (1, 2, 8))
@pytest.mark.parametrize("how", ["jd.function", "eager"])
def test_a_list_entry_the_step_reads_as_a_value_is_read_afresh(n, how):
    """The control: the host appends a scale, the step uses ``self.log[-1]``."""
    strategy = mirrored(n)

    class Scaled(Logged):
        def replica_step(self, x):
            jax.debug.callback(lambda v: self.traces.append(float(v)), jnp.sum(x))
            return jnp.sum(x) * self.log[-1]

    t = Scaled(strategy, "self")
    step = jd.function(t.step) if how == "jd.function" else t.step
    batches = _batches(n)
    for i, batch in enumerate(strategy.experimental_distribute_dataset(batches)):
        t.log.append(float(i + 2))
        out = step(batch)
        got = sorted(float(v) for v in strategy.experimental_local_results(out))
        assert got == [s * (i + 2) for s in _sums(batches[i], n)]
    jax.effects_barrier()
    assert len(t.traces) == n * CALLS


@pytest.mark.parametrize("n", (1, 2, 8))
@pytest.mark.parametrize("how", ["jd.function", "eager"])
def test_a_nested_function_the_trace_calls_still_reads_its_state(n, how):
    """The control: a lambda the trace runs (given to ``jax.grad``) reads ``self.mode``
    (a string: a constant of the trace), and a callback's lambda logs; a new mode traces
    the step again and gives plain Python's answer."""
    strategy = mirrored(n)

    class Moded(Logged):
        mode = "single"

        def replica_step(self, x):
            scale = lambda w: w * (2.0 if self.mode == "double" else 1.0)  # noqa: E731
            jax.debug.callback(lambda v: self.log.append(float(v)), jnp.sum(x))
            return jnp.sum(x) * jax.grad(scale)(1.0)

    t = Moded(strategy, "self")
    step = jd.function(t.step) if how == "jd.function" else t.step
    batches = _batches(n)
    for i, batch in enumerate(strategy.experimental_distribute_dataset(batches)):
        t.mode = "double" if i % 2 else "single"
        out = step(batch)
        got = sorted(float(v) for v in strategy.experimental_local_results(out))
        assert got == [s * (2.0 if i % 2 else 1.0) for s in _sums(batches[i], n)]
    jax.effects_barrier()
    assert len(t.log) == n * CALLS


@pytest.mark.parametrize("how", ["jd.function", "eager"])
def test_under_another_profiler_the_log_is_still_right(how):
    """Where the trace cannot be followed (a profiler is set), the log's values are
    watched as before: the step may trace again, and the log is still right."""
    n = 2
    strategy = mirrored(n)
    t = Logged(strategy, "self")
    step = jd.function(t.step) if how == "jd.function" else t.step
    batches = _batches(n)
    sys.setprofile(lambda frame, event, arg: None)
    try:
        for batch in strategy.experimental_distribute_dataset(batches):
            step(batch)
    finally:
        sys.setprofile(None)
    jax.effects_barrier()
    assert sorted(t.log) == sorted(v for b in batches for v in _sums(b, n))
    assert 1 <= len(t.traces) <= CALLS
