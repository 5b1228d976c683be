"""Behaviours that no test pinned (issue 24, item 6): each was changed on purpose in a copy of
the code and the suite still passed. Every expected value here is independent of jaxdist
(NumPy, or the replica count)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import mirrored

import jaxdist as jd


def components(s, shape=(2, 3)):
    """Replica i holds arange(prod(shape)).reshape(shape) + 100 * i (every value distinct)."""
    base = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    value = s.experimental_distribute_values_from_function(
        lambda ctx: jnp.asarray(base + 100 * ctx.replica_id_in_sync_group)
    )
    return value, [base + 100 * i for i in range(s.num_replicas_in_sync)]


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])
def test_gather_concatenates_along_the_axis(n, axis, jitted):
    s = mirrored(n)
    value, parts = components(s)
    gather = (
        (lambda v: s.gather(v, axis=axis))
        if not jitted
        else jax.jit(lambda v: s.gather(v, axis=axis))
    )
    got = np.asarray(gather(value))
    np.testing.assert_array_equal(got, np.concatenate(parts, axis=axis))  # not replica-major


def test_a_captured_number_that_changes_type_but_not_value_is_traced_again():
    s = mirrored(2)
    k = 3

    def step():
        return jnp.asarray(k) * 1

    first = s.experimental_local_results(s.run(step))[0]
    k = 3.0  # noqa: F841  (read by step through its closure)
    second = s.experimental_local_results(s.run(step))[0]
    assert jnp.issubdtype(first.dtype, jnp.integer), first.dtype
    assert jnp.issubdtype(second.dtype, jnp.floating), second.dtype  # not the int trace's


@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])
def test_strategies_whose_accumulation_fns_differ_do_not_share_a_step(jitted):
    """ReductionToOneDevice(accumulation_fn=...): the same step under two strategies that differ
    only in that function gives each function's answer (one compiled step would give one)."""
    devices = ["/cpu:0", "/cpu:1"]
    plain = jd.MirroredStrategy(devices, jd.ReductionToOneDevice(accumulation_fn=sum))
    tenfold = jd.MirroredStrategy(
        devices, jd.ReductionToOneDevice(accumulation_fn=lambda xs: 10 * sum(xs))
    )

    def step():
        ctx = jd.get_replica_context()
        return ctx.all_reduce("SUM", jnp.float32(ctx.replica_id_in_sync_group + 1))

    def call(s):
        out = jax.jit(lambda: s.run(step))() if jitted else s.run(step)
        return [float(v) for v in s.experimental_local_results(out)]

    assert call(plain) == [3.0, 3.0]  # 1 + 2
    assert call(tenfold) == [30.0, 30.0]
    assert call(plain) == [3.0, 3.0]


class _Program:
    """A stand-in for a dispatched program's output: records when it is waited for."""

    def __init__(self, log, i):
        self.log, self.i = log, i

    def block_until_ready(self):
        self.log.append(self.i)
        return self

    def is_ready(self):
        return True


@pytest.mark.parametrize("cap", [1, 2, 3])
def test_the_in_flight_bound_lets_exactly_cap_programs_run(cap):
    """With a cap of n, dispatching program k waits for program k - n: n are in flight, not n + 1."""
    from jaxdist._base.inflight import throttle

    old = jd.experimental.get_max_steps_in_flight()
    waited = []
    jd.experimental.set_max_steps_in_flight(cap)
    try:
        for k in range(6):
            throttle(_Program(waited, k))
            assert waited == list(range(max(0, k + 1 - cap))), (k, waited)
    finally:
        jd.experimental.set_max_steps_in_flight(1)
        for _ in range(cap + 1):  # push the stand-ins out with finished programs
            throttle(jnp.zeros(()))
        jd.experimental.set_max_steps_in_flight(old)
