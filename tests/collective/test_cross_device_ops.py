"""Cross-device ops: ReductionToOneDevice, NcclAllReduce/HierarchicalCopyAllReduce, extended API."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdist as jd
from jaxdist._collective.all_reduce import split_packs

SUM, MEAN = jd.ReduceOp.SUM, jd.ReduceOp.MEAN
OPS = [jd.ReductionToOneDevice(), jd.NcclAllReduce(), jd.HierarchicalCopyAllReduce(num_packs=2)]


def pr(strategy, fn):
    return strategy.experimental_distribute_values_from_function(fn)


def ids(strategy, base=0.0):
    return pr(strategy, lambda c: jnp.float32(base + c.replica_id_in_sync_group))


def device_of(x):
    (d,) = x.devices()
    return d


@pytest.mark.parametrize("cdo", OPS, ids=repr)
@pytest.mark.parametrize("op", [SUM, MEAN])
def test_reduce_to_one_device_and_all_devices(strategy, cdo, op):
    n = strategy.num_replicas_in_sync
    v = ids(strategy, 1.0)
    expected = n * (n + 1) / 2 / (n if op is MEAN else 1)
    one = cdo.reduce(op, v, "/cpu:0")
    assert not isinstance(one, jd.DistributedValues)
    assert device_of(one) == jax.devices()[0] and float(one) == pytest.approx(expected)
    every = cdo.reduce(op, v, v)
    values = every.values if n > 1 else (every,)
    assert isinstance(every, jd.Mirrored) if n > 1 else isinstance(every, jax.Array)
    assert [device_of(x) for x in values] == list(strategy.extended.replicas.devices)
    np.testing.assert_allclose([float(x) for x in values], [expected] * n)


def test_r1d_result_on_reduce_device_then_destinations(strategy):
    n = strategy.num_replicas_in_sync
    seen = {}
    reduce_device = jax.devices()[7]

    def acc(xs):
        seen["inputs"] = [device_of(x) for x in xs]
        out = sum(xs[1:], xs[0])
        seen["result"] = device_of(out)
        return out

    cdo = jd.ReductionToOneDevice(reduce_to_device="/cpu:7", accumulation_fn=acc)
    v = ids(strategy)
    out = cdo.reduce(SUM, v, v)
    if n == 1:  # TF: one component already at its destination is returned as is
        assert seen == {}
    else:
        assert seen["inputs"] == [reduce_device] * n
        assert seen["result"] == reduce_device
    values = out.values if n > 1 else (out,)
    assert [device_of(x) for x in values] == list(strategy.extended.replicas.devices)
    assert [float(x) for x in values] == [n * (n - 1) / 2] * n


def test_r1d_default_reduce_device_is_first_destination():
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1", "/cpu:2"])
    seen = []
    cdo = jd.ReductionToOneDevice(accumulation_fn=lambda xs: seen.append(device_of(xs[0])) or xs[0])
    cdo.reduce(SUM, ids(s), "/cpu:5")
    assert seen == [jax.devices()[5]]


def test_accumulation_fn_marker_tf_vectors():
    """TF 2.21, 4 logical CPUs: accumulation_fn = add_n + 100 (conformance cdo.* and oracle accfn.*)."""
    s = jd.MirroredStrategy([f"/cpu:{i}" for i in range(4)])
    cdo = jd.ReductionToOneDevice(accumulation_fn=lambda xs: sum(xs[1:], xs[0]) + 100.0)
    v = ids(s)
    assert float(cdo.reduce(SUM, v, "/cpu:0")) == 106.0
    assert float(cdo.reduce(MEAN, v, "/cpu:0")) == 26.5
    s2 = jd.MirroredStrategy([f"/cpu:{i}" for i in range(4)], cross_device_ops=cdo)
    v2 = ids(s2)
    # TF uses the user's accumulation_fn for batch_reduce_to and replica all_reduce ...
    assert [float(x) for x in s2.extended.batch_reduce_to(SUM, [(v2, v2)])[0].values] == [106.0] * 4
    # ... but swaps in a plain ReductionToOneDevice for reduce/reduce_to to CPU destinations,
    assert float(s2.reduce(SUM, v2, axis=None)) == 6.0
    assert [float(x) for x in s2.extended.reduce_to(SUM, v2, v2).values] == [6.0] * 4
    # and never uses it for int32 values.
    out = s2.run(
        lambda: jd.get_replica_context().all_reduce(
            SUM, jd.get_replica_context().replica_id_in_sync_group
        )
    )
    assert [int(x) for x in out.values] == [6] * 4
    iv = pr(s2, lambda c: jnp.int32(c.replica_id_in_sync_group))
    with pytest.raises(ValueError, match="cannot mix int32"):
        s2.extended.batch_reduce_to(SUM, [(v2, v2), (iv, iv)])


@pytest.mark.parametrize("cdo", OPS, ids=repr)
def test_nested_batch_reduce(strategy, cdo):
    n = strategy.num_replicas_in_sync
    a = ids(strategy)
    b = pr(
        strategy, lambda c: jnp.stack([jnp.float32(c.replica_id_in_sync_group), jnp.float32(10.0)])
    )
    c = pr(strategy, lambda c: jnp.full((3, 2), c.replica_id_in_sync_group, jnp.int32))
    out = cdo.batch_reduce(MEAN, [(a, a), (b, "/cpu:0"), (c, c)])
    mean_id = (n - 1) / 2
    assert len(out) == 3
    first = out[0].values if n > 1 else (out[0],)
    assert [float(x) for x in first] == [mean_id] * n
    np.testing.assert_allclose(out[1], [mean_id, 10.0])
    third = out[2].values if n > 1 else (out[2],)
    for x in third:
        np.testing.assert_allclose(x, np.full((3, 2), mean_id))
        # TF 2.21: MEAN of one int32 component is that int32 (cross-device ops included)
        assert np.asarray(x).dtype.kind == ("i" if n == 1 else "f")


def test_packing_splits():
    assert split_packs([10, 10, 10, 10], 1, 0, 4) == [[0, 1, 2, 3]]
    assert split_packs([10, 10, 10, 10], 2, 0, 4) == [[0, 1], [2, 3]]
    assert split_packs([10, 10, 10], 0, 0, 4) == [[0], [1], [2]]
    assert split_packs([10, 10, 10], 1, 80, 4) == [[0, 1], [2]]
    assert split_packs([100, 1], 1, 8, 4) == [[0], [1]]


@pytest.mark.parametrize("num_packs, bytes_per_pack", [(1, 0), (3, 0), (0, 0), (1, 1024)])
def test_batch_reduce_with_packs_is_exact(num_packs, bytes_per_pack):
    s = jd.MirroredStrategy([f"/cpu:{i}" for i in range(4)])
    shapes = [(10,), (256,), (4, 8), (7,), (300,)] * 4
    values = [
        pr(
            s,
            lambda c, shape=shape, k=k: jnp.full(
                shape, c.replica_id_in_sync_group + k, jnp.float32
            ),
        )
        for k, shape in enumerate(shapes)
    ]
    options = jd.experimental.CommunicationOptions(bytes_per_pack=bytes_per_pack)
    out = jd.NcclAllReduce(num_packs=num_packs).batch_reduce(SUM, [(v, v) for v in values], options)
    for k, (shape, res) in enumerate(zip(shapes, out)):
        for x in res.values:
            np.testing.assert_allclose(x, np.full(shape, 6.0 + 4 * k))


def test_strategy_uses_its_cross_device_ops():
    calls = []

    class Spy(jd.ReductionToOneDevice):
        def _reduce(self, op, value, devices, options):
            calls.append("reduce")
            return super()._reduce(op, value, devices, options)

        def _batch_reduce(self, op, pairs, options):
            calls.append("batch_reduce")
            return super()._batch_reduce(op, pairs, options)

        def broadcast(self, tensor, destinations):
            calls.append("broadcast")
            return super().broadcast(tensor, destinations)

    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"], cross_device_ops=Spy())
    v = ids(s)
    assert float(s.reduce(SUM, v, axis=None)) == 1.0
    assert [float(x) for x in s.extended.reduce_to(MEAN, v, v).values] == [0.5, 0.5]
    s.extended.batch_reduce_to(SUM, [(v, v)])
    m = s.extended.broadcast_to(jnp.float32(3.0), v)
    assert type(m) is jd.Mirrored and [float(x) for x in m.values] == [3.0, 3.0]
    assert calls == ["reduce", "reduce", "batch_reduce", "reduce", "broadcast"]


def test_broadcast(strategy):
    n = strategy.num_replicas_in_sync
    v = ids(strategy)
    out = jd.ReductionToOneDevice().broadcast(jnp.float32(1.0), v)
    if n > 1:
        assert type(out) is jd.Mirrored
        assert [device_of(x) for x in out.values] == list(strategy.extended.replicas.devices)
    one = jd.NcclAllReduce().broadcast(jnp.arange(3), "/cpu:2")
    assert device_of(one) == jax.devices()[2] and one.tolist() == [0, 1, 2]


def test_plain_values_are_one_component():
    assert float(jd.ReductionToOneDevice().reduce(SUM, jnp.float32(3.0), "/cpu:0")) == 3.0
    assert float(jd.NcclAllReduce().reduce(MEAN, 3.0, "/cpu:1")) == 3.0


@pytest.mark.parametrize(
    "call, error, match",
    [
        (
            lambda v: jd.ReductionToOneDevice().reduce("SUM", v, "/cpu:0"),
            ValueError,
            "reduce_op must be a jaxdist.ReduceOp here .*; got the string 'SUM'",
        ),
        (
            lambda v: jd.NcclAllReduce().batch_reduce("MEAN", [(v, v)]),
            ValueError,
            "reduce_op must be a jaxdist.ReduceOp here .*; got the string 'MEAN'",
        ),
        (
            lambda v: jd.ReductionToOneDevice().reduce(SUM, v, ["/cpu:0", "/cpu:1"]),
            ValueError,
            r"destinations must be a device string, .*; got list \['/cpu:0', '/cpu:1'\]",
        ),
        (
            lambda v: jd.ReductionToOneDevice().reduce(SUM, v, None),
            ValueError,
            "destinations must be a device string, .*; got NoneType None",
        ),
        (
            lambda v: jd.ReductionToOneDevice().reduce(SUM, v, ""),
            ValueError,
            "destinations must be a device string, .*; got str ''",
        ),
        (
            lambda v: jd.ReductionToOneDevice().batch_reduce(SUM, v),
            ValueError,
            r"value_destination_pairs must be a list of \(value, destinations\) tuples; got PerReplica",
        ),
        (
            lambda v: jd.ReductionToOneDevice().batch_reduce(SUM, [(v,)]),
            ValueError,
            r"value_destination_pairs\[0\] must be a \(value, destinations\) pair; got \(PerReplica",
        ),
        (
            lambda v: jd.ReductionToOneDevice().reduce(SUM, v, "/cpu:0", options="fast"),
            TypeError,
            "options must be a jaxdist.experimental.CommunicationOptions or None; got str",
        ),
    ],
)
def test_bad_arguments(call, error, match):
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with pytest.raises(error, match=match):
        call(ids(s))


def test_constructor_validation():
    with pytest.raises(ValueError, match="num_packs must be an int >= 0; got -1"):
        jd.NcclAllReduce(num_packs=-1)
    with pytest.raises(ValueError, match="num_packs must be an int >= 0"):
        jd.HierarchicalCopyAllReduce(num_packs=-1)
    assert jd.NcclAllReduce(num_packs=0).num_packs == 0
    with pytest.raises(TypeError, match="accumulation_fn must be callable"):
        jd.ReductionToOneDevice(accumulation_fn=3)
    with pytest.raises(ValueError, match="not a device string"):
        jd.ReductionToOneDevice(reduce_to_device="somewhere")


def test_communication_options():
    CO, CI = jd.experimental.CommunicationOptions, jd.experimental.CommunicationImplementation
    o = CO()
    assert (o.bytes_per_pack, o.timeout_seconds, o.implementation) == (0, None, CI.AUTO)
    assert CO(implementation="ring").implementation is CI.RING
    with pytest.raises(ValueError, match="bytes_per_pack must be non-negative"):
        CO(bytes_per_pack=-1)
    with pytest.raises(ValueError, match="implementation must be"):
        CO(implementation="carrier-pigeon")
    with pytest.raises(ValueError, match="timeout_seconds must be positive"):
        CO(timeout_seconds=0)
    assert CO(bytes_per_pack=8).merge(CO(timeout_seconds=5.0)) == CO(8, 5.0)


def test_mirrored_reduce_rules():
    s = jd.MirroredStrategy([f"/cpu:{i}" for i in range(4)])
    v = ids(s)
    m = s.extended.reduce_to(SUM, v, v)
    assert float(s.reduce(MEAN, m, axis=None)) == 6.0
    with pytest.raises(ValueError, match="Cannot SUM a Mirrored"):
        s.reduce(SUM, m, axis=None)
    with pytest.raises(ValueError, match="Cannot SUM a Mirrored"):
        s.extended.reduce_to(SUM, m, m)
    assert s.extended.reduce_to(MEAN, m, m) is m
    vec = s.extended.reduce_to(SUM, pr(s, lambda c: jnp.ones(2)), pr(s, lambda c: 0.0))
    assert float(s.reduce(SUM, vec, axis=0)) == 32.0  # TF: 4 replicas x sum([4, 4])


# Non-distributed values (TF 2.21 oracle nondist.*): test_rules.py,
# test_non_distributed_values_on_every_path.


def test_ragged_reduce_axis_none_raises_axis0_works():
    s = jd.MirroredStrategy([f"/cpu:{i}" for i in range(4)])
    x = next(iter(s.experimental_distribute_dataset([np.arange(3.0, dtype=np.float32)])))
    with pytest.raises(ValueError, match="axis=0"):
        s.reduce(MEAN, x, axis=None)
    assert float(s.reduce(MEAN, x, axis=0)) == 1.0  # TF: [0], [1], [2], [] -> 3 / 3
