"""The seed's MirroredStrategy method listing (TF1-era methods included) and OneDeviceStrategy.

Seeds: ../shared/seeds/001_11d2dd490ac22b5f.txt (MirroredStrategy methods) and
003_d0e480e9dbd16e5a.txt (OneDeviceStrategy, with the logical-device annotations).
"""

import contextlib
import re
import types
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import devices_of
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import jaxdist as jd
from jaxdist._strategy.logical_devices import NUM_LOGICAL_DEVICES_PER_REPLICA

REPO = Path(__file__).resolve().parents[2]
SEED_001 = REPO.parent / "shared" / "seeds" / "001_11d2dd490ac22b5f.txt"
TESTS = Path(__file__).resolve().parents[1]

# The method names under "Methods" in seed 001, without the .NET binding's `_dyn` variants.
SEED_METHODS = (
    "colocate_vars_with",
    "configure",
    "experimental_distribute_dataset",
    "experimental_distribute_datasets_from_function",
    "experimental_local_results",
    "experimental_make_numpy_dataset",
    "experimental_run",
    "experimental_run_v2",
    "group",
    "reduce",
    "scope",
    "unwrap",
    "update_config_proto",
)

# The methods TF deprecates, with what jaxdist's DeprecationWarning names as the replacement.
DEPRECATED = {
    "colocate_vars_with": "extended.colocate_vars_with",
    "configure": "update_config_proto",
    "experimental_run": "run(fn, args=(next(iterator),))",
    "experimental_run_v2": "run",
    "group": "jax.block_until_ready",
    "unwrap": "experimental_local_results",
    "update_config_proto": "nothing",
    "experimental_distribute_datasets_from_function": "distribute_datasets_from_function",
    "experimental_make_numpy_dataset": "experimental_distribute_dataset",
}

has_input = pytest.mark.skipif(
    not hasattr(jd.Strategy, "experimental_distribute_dataset"),
    reason="input distribution (jaxdist/_input/) is not built yet",
)


@contextlib.contextmanager
def quiet():
    """Silences the TF1-era methods' DeprecationWarning (tested separately)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def dvf(s, fn):
    return s.experimental_distribute_values_from_function(fn)


def rid_values(s, scale=1.0):
    """PerReplica float32 scalars scale * replica_id."""
    return dvf(s, lambda c: jnp.asarray(scale * c.replica_id_in_sync_group, jnp.float32))


def local(s, value):
    return [np.asarray(x).tolist() for x in s.experimental_local_results(value)]


def parse_seed_methods(text: str) -> tuple:
    """Method names listed under "Methods" (before "Properties"), `_dyn` variants skipped."""
    lines = text.splitlines()
    start, stop = lines.index("Methods") + 1, lines.index("Properties")
    names = []
    for line in lines[start:stop]:
        m = re.fullmatch(r"- (\w+)", line.strip())
        if m and not m.group(1).endswith("_dyn") and m.group(1) not in names:
            names.append(m.group(1))
    return tuple(names)


# -- the seed walk ----------------------------------------------------------------------


def _check_colocate(s):
    n = s.num_replicas_in_sync
    anchor = jd.MirroredStrategy([f"/cpu:{7 - i}" for i in range(n)])
    target = anchor.experimental_distribute_values_from_function(lambda c: 0.0)
    with s.colocate_vars_with(target):
        # OneDeviceStrategy returns value_fn's result as is (as TF): use broadcast_to there.
        if isinstance(s, jd.OneDeviceStrategy):
            v = s.extended.broadcast_to(1.0)
        else:
            v = dvf(s, lambda c: c.replica_id_in_sync_group)
    devices = devices_of(v) if n > 1 else tuple(s.experimental_local_results(v)[0].devices())
    assert [d.id for d in devices] == [7 - i for i in range(n)]


def _check_configure(s):
    assert s.configure() is None
    assert s.configure(session_config={}, cluster_spec=None) is None


def _check_distribute_dataset(s):
    n = s.num_replicas_in_sync
    batches = [np.arange(2 * n), np.arange(2 * n, 4 * n)]
    out = [local(s, x) for x in s.experimental_distribute_dataset(batches)]
    assert out == [
        [list(range(2 * i, 2 * i + 2)) for i in range(n)],
        [list(range(2 * n + 2 * i, 2 * n + 2 * i + 2)) for i in range(n)],
    ]


def _check_distribute_datasets_from_function(s):
    n = s.num_replicas_in_sync
    seen = []

    def dataset_fn(ctx):
        seen.append(ctx.num_replicas_in_sync)
        return [np.full((2,), i) for i in range(n)]

    first = next(iter(s.experimental_distribute_datasets_from_function(dataset_fn)))
    assert local(s, first) == [[i, i] for i in range(n)]
    assert seen == [n]


def _check_local_results(s):
    n = s.num_replicas_in_sync
    assert local(s, rid_values(s)) == [float(i) for i in range(n)]
    assert s.experimental_local_results(3) == (3,)


def _check_make_numpy_dataset(s):
    # Seed 001/003 example and TF oracle tf1.make_numpy_dataset (batch(4) of arange(10)).
    d = s.experimental_make_numpy_dataset(np.arange(10, dtype=np.float32))
    assert [np.asarray(x).tolist() for x in d.batch(4)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    dropped = [np.asarray(x).tolist() for x in d.batch(4, drop_remainder=True)]
    assert dropped == [[0, 1, 2, 3], [4, 5, 6, 7]]


def _check_experimental_run(s):
    n = s.num_replicas_in_sync
    it = iter([rid_values(s), rid_values(s, 10.0)])
    assert local(s, s.experimental_run(lambda x: x + 1, it)) == [i + 1.0 for i in range(n)]
    assert local(s, s.experimental_run(lambda x: x + 1, it)) == [10.0 * i + 1 for i in range(n)]
    out = s.experimental_run(lambda: jd.get_replica_context().replica_id_in_sync_group)
    assert local(s, out) == list(range(n))


def _check_experimental_run_v2(s):
    n = s.num_replicas_in_sync
    out = s.experimental_run_v2(
        lambda x, y=0.0: x * 2 + y, args=(rid_values(s),), kwargs={"y": 1.0}
    )
    assert local(s, out) == [2.0 * i + 1 for i in range(n)]


def _check_group(s):
    out = s.run(lambda: jnp.ones(3) * jd.get_replica_context().replica_id_in_sync_group)
    assert s.group(out) is None
    assert s.group([out, {"x": jnp.ones(2)}, 1], name="g") is None


def _check_reduce(s):
    n = s.num_replicas_in_sync
    assert float(s.reduce("SUM", rid_values(s), axis=None)) == sum(range(n))
    vec = dvf(s, lambda c: jnp.arange(4.0) + 4 * c.replica_id_in_sync_group)
    assert float(s.reduce(jd.ReduceOp.SUM, vec, axis=0)) == sum(range(4 * n))
    assert float(s.reduce(jd.ReduceOp.MEAN, vec, axis=0)) == (4 * n - 1) / 2


def _check_scope(s):
    with s.scope() as entered:
        assert entered is s
        assert jd.get_strategy() is s and jd.in_cross_replica_context()
    assert not jd.has_strategy()


def _check_unwrap(s):
    n = s.num_replicas_in_sync
    assert [float(x) for x in s.unwrap(rid_values(s))] == [float(i) for i in range(n)]
    plain = jnp.asarray(4.0)
    assert s.unwrap(plain) == (plain,)


def _check_update_config_proto(s):
    config = {"allow_soft_placement": True}
    assert s.update_config_proto(config) == {
        "allow_soft_placement": True,
        "isolate_session_state": True,
    }
    assert config == {"allow_soft_placement": True}


SEED_CALLS = {
    "colocate_vars_with": _check_colocate,
    "configure": _check_configure,
    "experimental_distribute_dataset": _check_distribute_dataset,
    "experimental_distribute_datasets_from_function": _check_distribute_datasets_from_function,
    "experimental_local_results": _check_local_results,
    "experimental_make_numpy_dataset": _check_make_numpy_dataset,
    "experimental_run": _check_experimental_run,
    "experimental_run_v2": _check_experimental_run_v2,
    "group": _check_group,
    "reduce": _check_reduce,
    "scope": _check_scope,
    "unwrap": _check_unwrap,
    "update_config_proto": _check_update_config_proto,
}


def test_seed_method_list_matches_the_seed_file():
    assert len(set(SEED_METHODS)) == len(SEED_METHODS)
    if SEED_001.exists():
        assert parse_seed_methods(SEED_001.read_text()) == SEED_METHODS


def test_every_seed_method_has_a_check_and_a_call_in_the_tests():
    assert set(SEED_CALLS) == set(SEED_METHODS)
    sources = "\n".join(p.read_text() for p in TESTS.rglob("test_*.py"))
    for name in SEED_METHODS:
        assert re.search(rf"\.{name}\(", sources), f"no test calls .{name}("


@pytest.mark.parametrize("name", SEED_METHODS)
def test_seed_method_exists_and_works(strategy, name):
    assert callable(getattr(jd.MirroredStrategy, name, None)), f"MirroredStrategy lacks {name}"
    with quiet():
        SEED_CALLS[name](strategy)


@pytest.mark.parametrize("name", SEED_METHODS)
def test_seed_method_on_one_device_strategy(name):
    with quiet():
        SEED_CALLS[name](jd.OneDeviceStrategy("/cpu:0"))


# -- deprecation ------------------------------------------------------------------------


def _call_deprecated(s, name):
    n = s.num_replicas_in_sync
    calls = {
        "colocate_vars_with": lambda: s.colocate_vars_with(rid_values(s)),
        "configure": lambda: s.configure(),
        "experimental_run": lambda: s.experimental_run(lambda: jnp.ones(())),
        "experimental_run_v2": lambda: s.experimental_run_v2(lambda: jnp.ones(())),
        "group": lambda: s.group(rid_values(s)),
        "unwrap": lambda: s.unwrap(rid_values(s)),
        "update_config_proto": lambda: s.update_config_proto({}),
        "experimental_distribute_datasets_from_function": lambda: (
            s.experimental_distribute_datasets_from_function(lambda ctx: [np.zeros(2)])
        ),
        "experimental_make_numpy_dataset": lambda: s.experimental_make_numpy_dataset(np.zeros(3)),
    }
    result = calls[name]()
    if name == "unwrap":
        assert len(result) == n
    return result


@pytest.mark.parametrize("name", sorted(DEPRECATED))
def test_deprecated_methods_warn_at_the_caller_and_name_the_replacement(name):
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with pytest.warns(DeprecationWarning) as record:
        _call_deprecated(s, name)
    assert len(record) == 1
    assert record[0].filename == __file__
    message = str(record[0].message)
    assert name in message and DEPRECATED[name] in message


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.experimental_assign_to_logical_device(jnp.ones(2), 0),
        lambda s: s.experimental_replicate_to_logical_devices(jnp.ones(2)),
        lambda s: s.experimental_split_to_logical_devices(jnp.ones(2), [1]),
        lambda s: s.run(lambda: jnp.ones(())),
        lambda s: s.experimental_local_results(1.0),
    ],
)
def test_current_methods_do_not_warn(call):
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert call(s) is not None


# -- experimental_run ---------------------------------------------------------------------


class _TF1Iterator:
    """A TF1-style iterator: `get_next()` and no `__next__`."""

    def __init__(self, elements):
        self._elements = list(elements)
        self.calls = 0

    def get_next(self):
        self.calls += 1
        return self._elements.pop(0)


def test_experimental_run_takes_one_element_per_call(strategy):
    n = strategy.num_replicas_in_sync
    it = iter([rid_values(strategy), rid_values(strategy, 2.0)])
    with quiet():
        first = strategy.experimental_run(lambda x: x * 3, it)
        second = strategy.experimental_run(lambda x: x * 3, it)
        with pytest.raises(StopIteration):
            strategy.experimental_run(lambda x: x * 3, it)
    assert local(strategy, first) == [3.0 * i for i in range(n)]
    assert local(strategy, second) == [6.0 * i for i in range(n)]


def test_experimental_run_structured_element_and_get_next(strategy):
    n = strategy.num_replicas_in_sync
    element = {"x": rid_values(strategy), "y": (rid_values(strategy, 10.0), 1.0)}
    it = _TF1Iterator([element])
    with quiet():
        out = strategy.experimental_run(lambda e: e["x"] + e["y"][0] + e["y"][1], it)
    assert it.calls == 1
    assert local(strategy, out) == [11.0 * i + 1 for i in range(n)]


def test_experimental_run_without_input_matches_run(strategy):
    n = strategy.num_replicas_in_sync

    def fn():
        ctx = jd.get_replica_context()
        return ctx.all_reduce("SUM", jnp.asarray(ctx.replica_id_in_sync_group, jnp.float32))

    with quiet():
        out = strategy.experimental_run(fn)
    assert local(strategy, out) == [float(sum(range(n)))] * n
    assert local(strategy, out) == local(strategy, strategy.run(fn))


@pytest.mark.parametrize("bad", [[1, 2], 3, "abc"])
def test_experimental_run_rejects_non_iterators(bad):
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    got = type(bad).__name__
    with (
        quiet(),
        pytest.raises(TypeError, match=f"input_iterator must be an iterator .*; got {got}"),
    ):
        s.experimental_run(lambda x: x, bad)


@has_input
def test_experimental_run_with_a_distributed_dataset_iterator(strategy):
    # TF oracle tf1.experimental_run_distribute_dataset_iter: range(8).batch(8), x * 2,
    # on 4 replicas -> [0, 2], [4, 6], [8, 10], [12, 14].
    n = strategy.num_replicas_in_sync
    it = iter(strategy.experimental_distribute_dataset([np.arange(2 * n)] * 2))
    with quiet():
        out = strategy.experimental_run(lambda x: x * 2, it)
    assert local(strategy, out) == [[4 * i, 4 * i + 2] for i in range(n)]


# -- experimental_run_v2 / unwrap ------------------------------------------------------------


def test_experimental_run_v2_is_run(strategy):
    n = strategy.num_replicas_in_sync
    opts = jd.RunOptions()
    with quiet():
        out = strategy.experimental_run_v2(
            lambda x, *, b: x - b, args=(rid_values(strategy),), kwargs={"b": 1.0}, options=opts
        )
        assert local(strategy, out) == [i - 1.0 for i in range(n)]
        with pytest.raises(
            TypeError, match="options must be a jaxdist.RunOptions or None; got str"
        ):
            strategy.experimental_run_v2(lambda: 1.0, options="fast")
        with pytest.raises(TypeError, match="args must be a tuple or list .*; got float"):
            strategy.experimental_run_v2(lambda x: x, args=1.0)


def test_unwrap_is_experimental_local_results(strategy):
    n = strategy.num_replicas_in_sync
    v = rid_values(strategy)
    with quiet():
        assert [float(x) for x in strategy.unwrap(v)] == [float(i) for i in range(n)]
        nested = strategy.unwrap({"a": v, "b": 1})
        assert [(float(d["a"]), d["b"]) for d in nested] == [(float(i), 1) for i in range(n)]
        assert strategy.unwrap(7) == (7,)
        assert len(strategy.unwrap(v)) == len(strategy.experimental_local_results(v)) == n


# -- group ------------------------------------------------------------------------------------


def test_group_waits_for_every_array_and_returns_none(strategy, monkeypatch):
    n = strategy.num_replicas_in_sync
    out = strategy.run(lambda: jnp.ones(4) * jd.get_replica_context().replica_id_in_sync_group)
    waited = []
    real = jax.block_until_ready
    monkeypatch.setattr(jax, "block_until_ready", lambda x: waited.append(x) or real(x))
    plain = jnp.arange(3)
    with quiet():
        assert strategy.group({"out": out, "plain": plain, "step": 5, "none": None}) is None
    (arrays,) = waited
    blocked = {id(a) for a in arrays}
    assert {id(leaf) for leaf in jax.tree.leaves(out)} <= blocked and id(plain) in blocked
    assert all(isinstance(a, jax.Array) for a in arrays)
    assert local(strategy, out) == [[float(i)] * 4 for i in range(n)]


def test_group_inside_run_is_a_no_op_and_name_is_checked(strategy):
    n = strategy.num_replicas_in_sync

    def fn(x):
        assert strategy.group(x, name="deps") is None
        return x + 1

    with quiet():
        out = strategy.run(fn, args=(rid_values(strategy),))
        assert strategy.group([]) is None
        with pytest.raises(TypeError, match="name"):
            strategy.group(out, name=3)
    assert local(strategy, out) == [i + 1.0 for i in range(n)]


# -- colocate_vars_with --------------------------------------------------------------------------


def _anchor_devices(n):
    return [jax.devices()[7 - i] for i in range(n)]


def test_colocate_vars_with_places_created_values_and_restores(strategy):
    n = strategy.num_replicas_in_sync
    want = _anchor_devices(n)
    anchor = jd.MirroredStrategy(want).experimental_distribute_values_from_function(
        lambda c: jnp.zeros(2)
    )
    own = list(jax.devices()[:n])
    with quiet(), strategy.colocate_vars_with(anchor):
        ragged = dvf(strategy, lambda c: jnp.ones(c.replica_id_in_sync_group + 1))
        same = dvf(strategy, lambda c: jnp.full(3, c.replica_id_in_sync_group))
        broadcast = strategy.extended.broadcast_to(jnp.arange(2.0))
        explicit = strategy.extended.broadcast_to(jnp.arange(2.0), "/cpu:0")
    for value in (ragged, same):
        assert [list(x.devices())[0] for x in strategy.experimental_local_results(value)] == want
    assert local(strategy, same) == [[i] * 3 for i in range(n)]
    assert local(strategy, ragged) == [[1.0] * (i + 1) for i in range(n)]
    bdevs = devices_of(broadcast) if n > 1 else tuple(broadcast.devices())
    assert list(bdevs) == want and np.asarray(broadcast.values[0] if n > 1 else broadcast).tolist()
    assert explicit.devices() == {jax.devices()[0]}
    # Restored: the strategy's own devices again.
    after = dvf(strategy, lambda c: jnp.zeros(2))
    assert [list(x.devices())[0] for x in strategy.experimental_local_results(after)] == own
    assert strategy.extended.placement is strategy.extended.replicas


def test_colocate_vars_with_restores_on_error_and_nests():
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    a = jd.MirroredStrategy(["/cpu:2", "/cpu:3"]).extended.broadcast_to(0.0)
    b = jd.MirroredStrategy(["/cpu:5", "/cpu:4"]).extended.broadcast_to(0.0)
    with quiet():
        with pytest.raises(RuntimeError, match="boom"), s.colocate_vars_with(a):
            raise RuntimeError("boom")
        assert s.extended.placement is s.extended.replicas
        with s.colocate_vars_with(a):
            with s.colocate_vars_with(b):
                inner = dvf(s, lambda c: 1.0)
            outer = dvf(s, lambda c: 1.0)
    assert [d.id for d in devices_of(inner)] == [5, 4]
    assert [d.id for d in devices_of(outer)] == [2, 3]
    assert s.extended.placement is s.extended.replicas


def test_colocate_vars_with_a_sharded_jax_array_and_a_run_output(strategy):
    n = strategy.num_replicas_in_sync
    want = _anchor_devices(n)
    sharding = NamedSharding(Mesh(np.asarray(want), ("r",)), PartitionSpec("r"))
    array = jax.device_put(np.zeros((n, 2)), sharding)
    with quiet(), strategy.colocate_vars_with(array):
        v = dvf(strategy, lambda c: 2.0)
    assert [list(x.devices())[0] for x in strategy.experimental_local_results(v)] == want
    # A run output lives on the strategy's own devices.
    out = strategy.run(lambda: jnp.ones(()))
    if n > 1:
        with quiet(), strategy.colocate_vars_with(out):
            w = dvf(strategy, lambda c: 2.0)
        assert list(devices_of(w)) == list(jax.devices()[:n])


def test_extended_colocate_vars_with_does_not_warn():
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    anchor = jd.MirroredStrategy(["/cpu:6", "/cpu:7"]).extended.broadcast_to(1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with s.extended.colocate_vars_with(anchor):
            v = s.extended.broadcast_to(3.0)
    assert [d.id for d in devices_of(v)] == [6, 7]
    assert [float(x) for x in v.values] == [3.0, 3.0]


@pytest.mark.parametrize("bad", [3, "/cpu:0", [jnp.ones(())], np.ones(2), None])
def test_colocate_vars_with_rejects_non_distributed_values(bad):
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with quiet(), pytest.raises(TypeError, match="DistributedValues|PerReplica"):
        s.colocate_vars_with(bad)
    assert s.extended.placement is s.extended.replicas


def test_colocate_vars_with_rejects_a_device_count_mismatch():
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    three = jd.MirroredStrategy(["/cpu:0", "/cpu:1", "/cpu:2"]).extended.broadcast_to(0.0)
    with quiet():
        with pytest.raises(ValueError, match=r"2 replica\(s\)"):
            s.colocate_vars_with(three)
        with pytest.raises(ValueError, match="one component"):
            s.colocate_vars_with(jnp.ones(2))  # one device
        # A value the user built from arrays on the default device (as a TF variable created
        # in the scope would be) stands for the strategy's own replicas (issue 12).
        same_device = jd.PerReplica((jnp.ones(()), jnp.ones(())))
        with s.colocate_vars_with(same_device):
            v = s.experimental_distribute_values_from_function(lambda ctx: 1.0)
        assert [x.devices().pop().id for x in v.values] == [0, 1]


# -- configure / update_config_proto ------------------------------------------------------------


def test_configure_without_cluster_is_a_no_op(strategy):
    with quiet():
        assert strategy.configure() is None
        assert strategy.configure(cluster_spec={}) is None
    assert strategy.cluster_resolver is None
    assert strategy.num_replicas_in_sync == len(strategy.extended.worker_devices)


def test_configure_updates_a_session_config_in_place_like_tf():
    s = jd.MirroredStrategy(["/cpu:0"])
    config = {"allow_soft_placement": True, "isolate_session_state": False}
    frozen = types.MappingProxyType({"a": 1})
    with quiet():
        assert s.configure(session_config=config) is None
        assert s.configure(session_config=frozen) is None
        with pytest.raises(TypeError, match="session_config"):
            s.configure(session_config=["allow_soft_placement"])
    assert config == {"allow_soft_placement": True, "isolate_session_state": True}
    assert dict(frozen) == {"a": 1}


class _SpecLike:
    def as_dict(self):
        return {"worker": ["h0:1", "h1:1"], "chief": ["c:1"]}


def test_configure_with_a_one_task_cluster_stores_it_and_starts_nothing():
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    cluster = {"worker": ["h0:2222"]}
    with quiet():
        assert s.configure(cluster_spec=cluster, task_type="worker", task_id=0) is None
    r = s.cluster_resolver
    assert (r.cluster_spec().as_dict(), r.task_type, r.task_id) == (
        {"worker": ["h0:2222"]},
        "worker",
        0,
    )
    cluster["worker"].append("h2:2222")  # the stored spec is a copy
    assert s.cluster_resolver.cluster_spec().as_dict() == {"worker": ["h0:2222"]}
    assert s.num_replicas_in_sync == 2  # nothing was started


def test_configure_with_a_real_cluster_takes_the_multi_worker_path():
    # Here JAX already runs, so joining is refused clearly (the 2-process path is tested in
    # test_multi_worker.py); a ps cluster is rejected as MultiWorkerMirroredStrategy does.
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with quiet(), pytest.raises(RuntimeError, match="before any JAX computation"):
        s.configure(cluster_spec=_SpecLike(), task_type="chief", task_id=0)
    with quiet(), pytest.raises(ValueError, match=r"unsupported jobs \['ps'\]"):
        s.configure(cluster_spec={"ps": {3: "p3:1"}}, task_type="ps", task_id=3)
    assert s.cluster_resolver is None
    assert s.num_replicas_in_sync == 2


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"cluster_spec": ["h0:1"]}, TypeError, "cluster_spec must be a dict .*; got list"),
        ({"cluster_spec": {"worker": ["h0:1"]}}, TypeError, "task_type must be .*; got None"),
        (
            {"cluster_spec": {"worker": ["h0:1"]}, "task_type": "worker"},
            TypeError,
            "task_id must be an int .*; got None",
        ),
        (
            {"cluster_spec": {"worker": ["h0:1"]}, "task_type": "worker", "task_id": "0"},
            TypeError,
            "task_id must be an int .*; got '0'",
        ),
        (
            {"cluster_spec": {"worker": ["h0:1"]}, "task_type": "ps", "task_id": 0},
            ValueError,
            r"task_type 'ps' is not a job of cluster_spec \(jobs: \['worker'\]\)",
        ),
        (
            {"cluster_spec": {"worker": ["h0:1"]}, "task_type": "worker", "task_id": 1},
            ValueError,
            r"task_id 1 .* \[0\]",
        ),
        (
            {"cluster_spec": {"worker": "h0:1"}, "task_type": "worker", "task_id": 0},
            ValueError,
            r"cluster_spec\['worker'\] must be a list of 'host:port' addresses .*; got 'h0:1'",
        ),
        (
            {"cluster_spec": {3: ["h0:1"]}, "task_type": "worker", "task_id": 0},
            ValueError,
            "job names must be non-empty strings; got 3",
        ),
    ],
)
def test_configure_validates_the_cluster(kwargs, error, match):
    s = jd.MirroredStrategy(["/cpu:0"])
    with quiet(), pytest.raises(error, match=match):
        s.configure(**kwargs)
    assert s.cluster_resolver is None


def test_update_config_proto_returns_a_new_dict(strategy):
    # TF oracle tf1.update_config_proto: "isolate_session_state: true", input untouched,
    # result is not the same object.
    nested = {"device_count": {"CPU": 4}, "isolate_session_state": False}
    with quiet():
        empty = strategy.update_config_proto({})
        new = strategy.update_config_proto(nested)
        from_proxy = strategy.update_config_proto(types.MappingProxyType({"x": 1}))
    assert empty == {"isolate_session_state": True}
    assert new == {"device_count": {"CPU": 4}, "isolate_session_state": True}
    assert nested == {"device_count": {"CPU": 4}, "isolate_session_state": False}
    assert new is not nested and new["device_count"] is not nested["device_count"]
    assert type(from_proxy) is dict and from_proxy == {"x": 1, "isolate_session_state": True}


@pytest.mark.parametrize("bad", [None, [("a", 1)], "isolate_session_state", 1])
def test_update_config_proto_rejects_non_mappings(bad):
    s = jd.MirroredStrategy(["/cpu:0"])
    with quiet(), pytest.raises(TypeError, match="Mapping"):
        s.update_config_proto(bad)


# -- logical devices ---------------------------------------------------------------------------


def test_one_logical_device_per_replica():
    assert NUM_LOGICAL_DEVICES_PER_REPLICA == 1


def test_logical_device_annotations_accept_the_consistent_values(any_strategy):
    s = any_strategy
    t = jnp.asarray([[1.0, 2.0], [3.0, 4.0]])
    assert s.experimental_assign_to_logical_device(t, 0) is t
    assert s.experimental_assign_to_logical_device(t, np.int64(0)) is t
    assert s.experimental_replicate_to_logical_devices(t) is t
    assert s.experimental_split_to_logical_devices(t, [1, 1]) is t
    assert s.experimental_split_to_logical_devices(t, (1, 1)) is t
    assert s.experimental_split_to_logical_devices(t, np.array([1, 1])) is t
    scalar = np.float32(2.0)
    assert s.experimental_split_to_logical_devices(scalar, []) is scalar
    v = rid_values(s)
    assert s.experimental_split_to_logical_devices(v, []) is v
    assert s.experimental_assign_to_logical_device(v, 0) is v


@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda s, t: s.experimental_assign_to_logical_device(t, 1),
            "Received logical device id 1 but there are only total of 1 logical devices",
        ),
        (
            lambda s, t: s.experimental_assign_to_logical_device(t, -1),
            "Received logical device id -1 but there are only total of 1 logical devices",
        ),
        (
            lambda s, t: s.experimental_split_to_logical_devices(t, [1]),
            r"rank of `tensor.shape` \(2\). Received len\(partition_dimensions\)=1",
        ),
        (
            lambda s, t: s.experimental_split_to_logical_devices(t, [1, 1, 1]),
            r"rank of `tensor.shape` \(2\). Received len\(partition_dimensions\)=3",
        ),
        (
            lambda s, t: s.experimental_split_to_logical_devices(t, [2, 1]),
            r"number of logical devices \(=1\). Received `partition_dimensions`=\[2, 1\], "
            "and their product is 2",
        ),
        (
            lambda s, t: s.experimental_split_to_logical_devices(t, [1, 3]),
            r"`partition_dimensions\[1\]` must be divisible .* \(3\). Received: 2",
        ),
        (
            lambda s, t: s.experimental_split_to_logical_devices(t, [0, 1]),
            "positive",
        ),
        (
            lambda s, t: s.experimental_split_to_logical_devices(t, [-1, -1]),
            "positive",
        ),
    ],
)
def test_logical_device_annotations_raise_with_the_numbers(any_strategy, call, match):
    s = any_strategy
    t = jnp.asarray([[1.0, 2.0], [3.0, 4.0]])
    with pytest.raises(ValueError, match=match):
        call(s, t)
    # Inside run (traced, static shapes) the same checks apply: never a silent no-op.
    with pytest.raises(ValueError, match=match):
        s.run(lambda: call(s, t))
    with pytest.raises(ValueError, match=match):
        s.run(lambda x: call(s, x), args=(dvf(s, lambda c: t),))


def test_logical_device_annotations_inside_run_keep_the_value(any_strategy):
    s = any_strategy
    n = s.num_replicas_in_sync
    x = dvf(s, lambda c: jnp.full((2, 3), float(c.replica_id_in_sync_group)))

    def fn(x):
        y = s.experimental_split_to_logical_devices(x * 2, [1, 1])
        y = s.experimental_assign_to_logical_device(y, 0)
        return s.experimental_replicate_to_logical_devices(y + 1)

    assert local(s, s.run(fn, args=(x,))) == [[[2.0 * i + 1] * 3] * 2 for i in range(n)]


@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda s: s.experimental_assign_to_logical_device(jnp.ones(2), 0.0),
            "id must be an int; got 0.0",
        ),
        (
            lambda s: s.experimental_assign_to_logical_device(jnp.ones(2), True),
            "id must be an int; got True",
        ),
        (
            lambda s: s.experimental_assign_to_logical_device("t", 0),
            "device takes an array .*; got str",
        ),
        (
            lambda s: s.experimental_replicate_to_logical_devices({"a": 1}),
            "takes an array .*; got dict",
        ),
        (
            lambda s: s.experimental_split_to_logical_devices(jnp.ones(2), 1),
            "unnested list of integers.*; got 1\\.$",
        ),
        (
            lambda s: s.experimental_split_to_logical_devices(jnp.ones(2), [1.0]),
            r"integers.*; got \[1.0\]",
        ),
        (
            lambda s: s.experimental_split_to_logical_devices(jnp.ones(2), [[1]]),
            r"unnested.*; got \[\[1\]\]",
        ),
        (
            lambda s: s.experimental_split_to_logical_devices(None, [1]),
            "takes an array .*; got NoneType",
        ),
    ],
)
def test_logical_device_annotations_check_types(call, match):
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with pytest.raises(TypeError, match=match):
        call(s)


# -- OneDeviceStrategy: every method of seed 003 ------------------------------------------------

ONE_DEVICE_SEED_METHODS = (
    "experimental_assign_to_logical_device",
    "experimental_distribute_dataset",
    "experimental_distribute_datasets_from_function",
    "experimental_distribute_values_from_function",
    "experimental_local_results",
    "experimental_make_numpy_dataset",
    "experimental_replicate_to_logical_devices",
    "experimental_split_to_logical_devices",
    "reduce",
    "run",
    "scope",
)


@pytest.fixture
def od():
    return jd.OneDeviceStrategy("/cpu:0")


@pytest.mark.parametrize("name", ONE_DEVICE_SEED_METHODS)
def test_one_device_strategy_has_every_seed_003_method(name):
    assert callable(getattr(jd.OneDeviceStrategy, name, None))


def test_one_device_attributes(od):
    assert od.num_replicas_in_sync == 1
    assert od.cluster_resolver is None
    assert isinstance(od.extended, jd.StrategyExtended)
    assert od.extended.worker_devices == ("/job:localhost/replica:0/task:0/device:CPU:0",)


def test_one_device_class_example_run_accumulates_to_90(od):
    result = 0
    for i in range(10):
        result += od.run(lambda x: x * 2, args=(i,))
    assert int(result) == 90


def test_one_device_run_places_on_its_device():
    od = jd.OneDeviceStrategy("/cpu:3")
    out = od.run(lambda x, y=0.0: x + y, args=(jnp.asarray(1.0),), kwargs={"y": 2.0})
    assert float(out) == 3.0 and out.devices() == {jax.devices()[3]}
    assert int(od.run(lambda: jd.get_replica_context().replica_id_in_sync_group)) == 0


# OneDeviceStrategy.reduce's doc example (seed 003): test_tf_vectors.py,
# test_onedevice_reductions_match_tf, against TF's recorded answers.


def test_one_device_local_results_and_values_from_function(od):
    one = jnp.asarray(1.0)
    assert od.experimental_local_results(one) == (one,)
    v = od.experimental_distribute_values_from_function(lambda c: c.replica_id_in_sync_group)
    assert [int(x) for x in od.experimental_local_results(v)] == [0]
    v = od.experimental_distribute_values_from_function(lambda c: jnp.asarray(1.0))
    assert float(od.experimental_local_results(v)[0]) == 1.0
    v = od.experimental_distribute_values_from_function(lambda c: c.num_replicas_in_sync)
    assert od.experimental_local_results(v) == (1,)
    array_value = np.array([3.0, 2.0, 1.0])
    v = od.experimental_distribute_values_from_function(
        lambda c: array_value[c.replica_id_in_sync_group]
    )
    assert [float(x) for x in od.experimental_local_results(v)] == [3.0]


def test_one_device_scope(od):
    with od.scope():
        assert jd.get_strategy() is od
        assert jd.in_cross_replica_context()
        assert od.run(lambda: jd.get_replica_context() is not None)


@has_input
def test_one_device_distribute_dataset_doc_example(od):
    batches = [np.arange(10)[i : i + 2] for i in range(0, 10, 2)]
    out = [local(od, x) for x in od.experimental_distribute_dataset(batches)]
    assert out == [[[0, 1]], [[2, 3]], [[4, 5]], [[6, 7]], [[8, 9]]]


@has_input
def test_one_device_distribute_datasets_from_function_calls_fn_once(od):
    contexts = []

    def dataset_fn(ctx):
        contexts.append((ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync))
        return [np.ones((ctx.get_per_replica_batch_size(4), 1))] * 3

    with quiet():
        out = list(od.experimental_distribute_datasets_from_function(dataset_fn))
    assert contexts == [(1, 0, 1)]
    assert [local(od, x) for x in out] == [[[[1.0]] * 4]] * 3


def test_one_device_values_from_function_returns_the_plain_value_like_tf(od):
    v = od.experimental_distribute_values_from_function(lambda c: c.replica_id_in_sync_group)
    assert not isinstance(v, jd.DistributedValues) and int(v) == 0
