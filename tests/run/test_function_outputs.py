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


def test_assigning_an_unregistered_dataclass_holding_computed_values_is_named():
    """``self.state = State(w - lr * g, step + 1)`` with ``State`` a plain dataclass: JAX
    does not see into it, so the values cannot be written back; it left dead tracers in the
    trainer (a JAX error on the next call, advising strategy.run)."""
    import dataclasses

    @dataclasses.dataclass
    class State:
        w: object
        step: object

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
