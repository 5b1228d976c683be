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


# An int SUM stays int and an int MEAN is a float, on every in-step path: test_rules.py
# (test_accumulation_fn_is_used_in_steps_except_for_int32, test_mean_of_integers_...).


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


# accumulation_fn inside the step: test_rules.py, test_accumulation_fn_is_used_in_steps_...
