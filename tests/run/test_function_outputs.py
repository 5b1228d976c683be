"""What a jd.function returns is this call's: an element of an iterator it read and returns as
it is (a one-replica ``run`` returns its argument) included."""

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import mirrored

import jaxdist as jd


@pytest.mark.parametrize("n", (0, 1, 2, 8))  # 0: OneDeviceStrategy
def test_an_element_returned_unchanged_is_this_calls_element(n):
    """An evaluation loop pairing outputs with labels (``return x * 10, x``): on one replica
    the labels were the first call's on every call (loss 2.0123 where 1.7743 is right)."""
    strategy = jd.OneDeviceStrategy("/cpu:0") if n == 0 else mirrored(n)
    rows = max(n, 1)
    data = [np.full((rows,), float(i), np.float32) for i in range(4)]
    it = iter(strategy.experimental_distribute_dataset(data))

    @jd.function
    def step(it):
        x = next(it)
        return strategy.run(lambda x: (x * 10.0, x), args=(x,)), x

    for i in range(4):
        (scaled, same), whole = step(it)
        local = strategy.experimental_local_results
        assert [float(jnp.sum(v)) for v in local(same)] == [float(i)] * rows
        assert [float(jnp.sum(v)) for v in local(scaled)] == [10.0 * i] * rows
        assert float(np.sum([np.sum(np.asarray(v)) for v in local(whole)])) == float(i) * rows
    assert step.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("n", (1, 2, 8))
def test_a_plain_dataclass_assigned_holding_computed_values_is_written_back(n):
    """``self.state = State(w - lr * g, step + 1)`` with ``State`` a plain (unregistered)
    dataclass: JAX does not see into it; it used to leave dead tracers in the trainer, then
    was refused. It is written back as a new ``State`` after each call (its class's code
    not run), its int as an int, with one trace for every value of its numbers: 2 traces
    at most (the first, then the one where the changing numbers are inputs)."""
    import dataclasses

    @dataclasses.dataclass
    class State:
        w: object
        step: int
        lr: float

    strategy = mirrored(n)

    class T:
        def __init__(self):
            self.state = State(jnp.zeros(()), 0, 0.5)

        @jd.function
        def train(self, g):
            per = strategy.run(lambda g: g * 2.0, args=(g,))
            total = strategy.reduce("SUM", per, axis=0)
            s = self.state
            self.state = State(s.w - s.lr * total, s.step + 1, s.lr * 0.5)
            return self.state.w

    t, w, lr = T(), 0.0, 0.5
    for i in range(4):
        got = t.train(jnp.ones((n,)))
        w, lr = w - lr * 2.0 * n * n, lr * 0.5  # (each replica is given all n rows)
        assert float(got) == pytest.approx(w)
        assert type(t.state) is State and float(t.state.w) == pytest.approx(w)
        assert t.state.step == i + 1 and type(t.state.step) is int
        assert t.state.lr == pytest.approx(lr) and type(t.state.lr) is float
    # (2 at most: 1 where an earlier test's trace of this code found its numbers change)
    assert t.train.experimental_get_tracing_count() <= 2


def test_a_plain_object_assigned_holding_computed_values_is_named():
    """An object of a plain class (not a dataclass) holding values the trace computed
    cannot be made again without its code: refused, naming the place, the state as it was
    (no tracer left)."""

    class State:
        def __init__(self, w, step):
            self.w, self.step = w, step

    class T:
        def __init__(self):
            self.state = State(jnp.zeros(()), 0)

        @jd.function
        def train(self, g):
            self.state = State(self.state.w - 0.1 * g, self.state.step + 1)
            return self.state.w

    t = T()
    with pytest.raises(RuntimeError, match=r"assigned self\.state a State .* not a pytree"):
        t.train(jnp.ones(()))
    assert float(t.state.w) == 0.0 and t.state.step == 0  # as it was: no tracer left


@pytest.mark.parametrize("n", (1, 2, 8))
@pytest.mark.parametrize("how", ["jd.function", "eager"])
def test_an_array_of_the_state_put_at_another_place_is_written_back_with_one_trace(n, how):
    """``self.prev = self.w; self.w = self.w + g``: the trace reads ``self.w`` as a constant, so
    the assignment to ``self.prev`` was no output of it; the trace left the array there and
    every later call traced again ("two names that held one array ... now hold two")."""
    strategy = mirrored(n)

    class T:
        def __init__(self):
            self.w, self.prev = jnp.ones(()), jnp.zeros(())

        def step(self, x):
            self.prev = self.w
            self.w = self.w + 1.0
            return x * self.w

        def call(self, x):
            return strategy.run(self.step, args=(x,))

    t = T()
    call = jd.function(t.call) if how == "jd.function" else t.call
    x = strategy.experimental_distribute_values_from_function(lambda ctx: jnp.ones(()))
    for k in range(4):
        out = call(x)
        assert float(t.prev) == 1.0 + k and float(t.w) == 2.0 + k
        assert [float(v) for v in strategy.experimental_local_results(out)] == [2.0 + k] * n
    traces = (
        call.experimental_get_tracing_count()
        if how == "jd.function"
        else jd.experimental.step_count(t.step)
    )
    assert traces == 1


@pytest.mark.parametrize("n", (1, 2))
def test_arrays_swapped_stored_under_a_new_key_and_appended_are_pythons(n):
    """``self.a, self.b = self.b, self.a``, ``self.d["last"] = self.w`` and
    ``self.hist.append(self.w)`` in a jd.function: Python's values after every call (an
    append to a list is no place to write back: it runs where the function is traced)."""
    strategy = mirrored(n)

    class T:
        def __init__(self):
            self.w, self.a, self.b = jnp.ones(()), jnp.zeros(()), jnp.ones(())
            self.d, self.hist = {}, []

        @jd.function
        def step(self, x):
            self.hist.append(self.w)
            self.d["last"] = self.w
            self.a, self.b = self.b, self.a
            self.w = self.w + 1.0
            return strategy.run(lambda x: x * self.w, args=(x,))

    t = T()
    x = strategy.experimental_distribute_values_from_function(lambda ctx: jnp.ones(()))
    for k in range(3):
        t.step(x)
        assert float(t.d["last"]) == 1.0 + k and float(t.w) == 2.0 + k
        assert (float(t.a), float(t.b)) == ((1.0, 0.0) if k % 2 == 0 else (0.0, 1.0))
        assert [float(h) for h in t.hist] == [1.0 + i for i in range(k + 1)]
