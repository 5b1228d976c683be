"""ReplicaContext.all_reduce inside run: ops, dtypes, pytrees, validation."""

import jax.numpy as jnp
import numpy as np
import pytest

import jaxdist as jd


def run_all_reduce(strategy, op, make):
    def step():
        rid = jd.get_replica_context().replica_id_in_sync_group
        return jd.get_replica_context().all_reduce(op, make(rid))

    return strategy.experimental_local_results(strategy.run(step))


@pytest.mark.parametrize("op", [jd.ReduceOp.SUM, "SUM", "sum", "Sum"])
def test_sum_float(strategy, op):
    n = strategy.num_replicas_in_sync
    out = run_all_reduce(strategy, op, lambda r: jnp.float32(r) + 1.0)
    assert [float(x) for x in out] == [n * (n + 1) / 2] * n


def test_mean_float_matrix(strategy):
    n = strategy.num_replicas_in_sync
    out = run_all_reduce(strategy, "MEAN", lambda r: jnp.float32(r) * jnp.ones((2, 2)))
    for x in out:
        np.testing.assert_allclose(x, np.full((2, 2), (n - 1) / 2))


def test_int_sum_keeps_int_mean_is_float(strategy):
    n = strategy.num_replicas_in_sync
    s = run_all_reduce(strategy, "SUM", lambda r: r)
    m = run_all_reduce(strategy, "MEAN", lambda r: r + 1)
    assert all(np.asarray(x).dtype.kind == "i" and int(x) == n * (n - 1) // 2 for x in s)
    kind = "i" if n == 1 else "f"  # TF: one replica's MEAN is the value itself (int32)
    assert all(np.asarray(x).dtype.kind == kind and float(x) == (n + 1) / 2 for x in m)


def test_nested_structure(strategy):
    n = strategy.num_replicas_in_sync
    out = run_all_reduce(
        strategy, "SUM", lambda r: {"a": [jnp.float32(1.0), jnp.float32(2.0)], "b": r}
    )
    for x in out:
        assert [float(v) for v in x["a"]] == [float(n), 2.0 * n]
        assert int(x["b"]) == n * (n - 1) // 2


@pytest.mark.parametrize("bad", ["MAX", "prod", 3, None])
def test_invalid_op_lists_valid_ones(bad):
    with pytest.raises(ValueError, match="SUM or jaxdist.ReduceOp.MEAN"):
        jd.get_replica_context().all_reduce(bad, 1.0)


def test_reduce_op_enum_is_exact():
    assert jd.ReduceOp("SUM") is jd.ReduceOp.SUM
    with pytest.raises(ValueError):
        jd.ReduceOp("sum")
    assert [m.name for m in jd.ReduceOp] == ["SUM", "MEAN"]


def test_accumulation_fn_is_honoured_in_step(strategy):
    n = strategy.num_replicas_in_sync
    acc = jd.ReductionToOneDevice(accumulation_fn=lambda xs: sum(xs[1:], xs[0]) + 100.0)
    s = jd.MirroredStrategy(strategy.extended.replicas.devices, cross_device_ops=acc)
    out = run_all_reduce(s, "SUM", lambda r: jnp.float32(r))
    mean = run_all_reduce(s, "MEAN", lambda r: jnp.float32(r))
    total = n * (n - 1) / 2 + 100.0
    assert [float(x) for x in out] == [total] * n
    np.testing.assert_allclose([float(x) for x in mean], [total / n] * n)
