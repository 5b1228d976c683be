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
