"""Device specifications, strategy construction, and the distributed value types."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdist as jd


@pytest.mark.parametrize(
    "spec", ["/cpu:3", "cpu:3", "/device:CPU:3", "/job:localhost/replica:0/task:0/device:CPU:3"]
)
def test_device_strings(spec):
    s = jd.MirroredStrategy([spec])
    assert s.extended.replicas.devices == (jax.devices("cpu")[3],)
    assert s.extended.worker_devices == ("/job:localhost/replica:0/task:0/device:CPU:3",)


def test_devices_mix_strings_and_objects():
    s = jd.MirroredStrategy(["/cpu:0", jax.devices()[5]])
    assert [d.id for d in s.extended.replicas.devices] == [0, 5]
    assert s.num_replicas_in_sync == 2
    assert s.extended.parameter_devices == s.extended.worker_devices
    assert s.cluster_resolver is None


def test_default_devices_are_all_local_devices():
    assert jd.MirroredStrategy().num_replicas_in_sync == len(jax.local_devices())


@pytest.mark.parametrize(
    "devices, error, match",
    [
        (["/cpu:0", "/cpu:0"], ValueError, "more than once"),
        (["/cpu:0", "/device:CPU:0"], ValueError, "more than once"),
        ([], ValueError, "at least one device"),
        (["/cpu:99"], ValueError, "has 8 CPU"),
        (["/gpu:0"], ValueError, "GPU device 0"),
        (["banana"], ValueError, "not a device string"),
        ([3], TypeError, "device string"),
        (7, TypeError, "list of device strings"),
    ],
)
def test_bad_devices(devices, error, match):
    with pytest.raises(error, match=match):
        jd.MirroredStrategy(devices)


def test_one_device_strategy_device_forms():
    assert jd.OneDeviceStrategy("/device:CPU:2").extended.replicas.devices[0].id == 2
    with pytest.raises(ValueError, match="not a device string"):
        jd.OneDeviceStrategy("gpu")


def test_cross_device_ops_validation():
    with pytest.raises(TypeError, match=r"instance, e.g. NcclAllReduce\(\)"):
        jd.MirroredStrategy(["/cpu:0"], cross_device_ops=jd.NcclAllReduce)
    with pytest.raises(TypeError, match="CrossDeviceOps instance"):
        jd.MirroredStrategy(["/cpu:0"], cross_device_ops="nccl")


def test_per_replica_constructor_and_values():
    a, b = jnp.float32(1.0), jnp.float32(2.0)
    v = jd.PerReplica((a, b))
    assert v.values == (a, b)
    with pytest.raises(TypeError):  # as TF: a PerReplica is not a sequence (use .values)
        len(v)
    # as TF's: == and hash are the object's identity (no element-wise comparison)
    assert bool(v) and (v == v) is True and (v == jd.PerReplica((a, b))) is False
    assert {v: "found"}[v] == "found"
    assert isinstance(v, jd.DistributedValues) and not isinstance(v, jd.Mirrored)
    with pytest.raises(ValueError, match="at least one value"):
        jd.PerReplica(())
    with pytest.raises(TypeError, match="tuple with one value per replica"):
        jd.Mirrored(jnp.ones(2))
    assert repr(v).startswith("PerReplica:{\n  0: Array(1.")


def test_values_are_pytrees(strategy):
    n = strategy.num_replicas_in_sync
    v = strategy.experimental_distribute_values_from_function(lambda c: jnp.ones(3))
    leaves = jax.tree.leaves(v)
    if n == 1:  # one replica: the value as run gives it there, a plain array
        assert leaves[0] is v and v.shape == (3,)
        return
    assert len(leaves) == 1 and leaves[0].shape == (n, 3)
    doubled = jax.tree.map(lambda x: x * 2, v)
    assert type(doubled) is jd.PerReplica
    np.testing.assert_allclose(
        np.stack([np.asarray(x) for x in doubled.values]), 2 * np.ones((n, 3))
    )


def test_stacked_values_are_committed_to_their_devices(strategy):
    v = strategy.experimental_distribute_values_from_function(
        lambda c: jnp.full((2,), c.replica_id_in_sync_group)
    )
    values = strategy.experimental_local_results(v)
    for r, (x, d) in enumerate(zip(values, strategy.extended.replicas.devices)):
        assert x.devices() == {d} and x.committed
        assert x.tolist() == [r, r]


def test_dvf_value_context_and_ragged(strategy):
    n = strategy.num_replicas_in_sync
    v = strategy.experimental_distribute_values_from_function(
        lambda c: jnp.asarray([c.replica_id_in_sync_group, c.num_replicas_in_sync])
    )
    assert [x.tolist() for x in strategy.experimental_local_results(v)] == [
        [r, n] for r in range(n)
    ]
    ragged = strategy.experimental_distribute_values_from_function(
        lambda c: jnp.zeros((c.replica_id_in_sync_group,))
    )
    assert [x.shape for x in strategy.experimental_local_results(ragged)] == [
        (r,) for r in range(n)
    ]
    ctx = jd.experimental.ValueContext()
    assert (ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync) == (0, 1)


def test_dvf_structure_mismatch():
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with pytest.raises(ValueError, match="same structure for every replica"):
        s.experimental_distribute_values_from_function(
            lambda c: (1.0,) if c.replica_id_in_sync_group else (1.0, 2.0)
        )
    with pytest.raises(TypeError, match="value_fn must be callable"):
        s.experimental_distribute_values_from_function(3)


def test_local_results(strategy):
    n = strategy.num_replicas_in_sync
    assert strategy.experimental_local_results(3) == (3,)
    assert strategy.experimental_local_results(None) == (None,)
    v = strategy.experimental_distribute_values_from_function(lambda c: c.replica_id_in_sync_group)
    nested = strategy.experimental_local_results({"a": v, "b": 1.0})
    assert len(nested) == n
    assert [int(x["a"]) for x in nested] == list(range(n)) and nested[0]["b"] == 1.0


def test_tuple_built_per_replica_is_stacked_once(strategy):
    """A PerReplica made from a tuple is stacked onto the devices once, not at every run:
    stacking copies the parts (a transfer), so later runs pass under a transfer guard that
    a fresh value's stacking trips."""
    n = strategy.num_replicas_in_sync
    v = jd.PerReplica(tuple(jnp.float32(r) for r in range(n)))
    fresh = jd.PerReplica(tuple(jnp.float32(r) for r in range(n)))
    first = strategy.run(lambda x: x * 2, args=(v,))
    with jax.transfer_guard("disallow_explicit"):
        second = strategy.run(lambda x: x * 2, args=(v,))
        if n == 1:  # one replica takes the one component as it is: nothing is stacked
            strategy.run(lambda x: x * 2, args=(fresh,))
        else:
            with pytest.raises(jax.errors.JaxRuntimeError, match="Disallowed .*transfer"):
                strategy.run(lambda x: x * 2, args=(fresh,))  # the guard sees a stacking
    assert jax.tree.leaves(v) == list(v.values)  # still the parts the user gave
    expected = [2.0 * r for r in range(n)]
    for out in (first, second):
        assert [float(x) for x in strategy.experimental_local_results(out)] == expected


@pytest.mark.parametrize("kind", ["PerReplica", "Mirrored"])
def test_a_distributed_value_is_not_iterable_and_says_what_to_use(kind):
    """TF 2.21: ``list(per_replica)`` is "TypeError: 'PerReplica' object is not iterable" and
    ``tf.nest`` treats a distributed value as a leaf; the message names the spellings."""
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    parts = (jnp.zeros(2), jnp.ones(2)) if kind == "PerReplica" else (jnp.ones(2), jnp.ones(2))
    value = getattr(jd, kind)(parts)
    with pytest.raises(TypeError, match=f"'{kind}' object is not iterable") as e:
        list(value)
    for fix in ("experimental_local_results", "strategy.gather", "is_leaf="):
        assert fix in str(e.value)
    leaves = jax.tree.map(
        s.experimental_local_results,
        {"a": value},
        is_leaf=lambda v: isinstance(v, jd.DistributedValues),
    )
    assert isinstance(leaves["a"], tuple)
