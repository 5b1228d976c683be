"""Distributed input: experimental_distribute_dataset, distribute_datasets_from_function,
InputOptions / InputContext, prefetching, make_numpy_dataset, bad input.

Split vectors and end-of-data behaviour follow TF 2.21 (recorded in the TF oracle):
per-replica size ceil(b / R), filled greedily.
"""

import collections
import dataclasses
import itertools
import json
import pathlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdist as jd

Point = collections.namedtuple("Point", ["x", "y"])
ANSWERS = json.loads((pathlib.Path(__file__).parents[1] / "tf_oracle" / "answers.json").read_text())
TF_RUNS = (1, 2, 4)  # the replica counts the TF oracle recorded (`*_{n}r` case ids)


def batches(n, batch, drop_remainder=False, dtype=np.int64):
    data = np.arange(n, dtype=dtype)
    out = [data[i : i + batch] for i in range(0, n, batch)]
    if drop_remainder and out and len(out[-1]) < batch:
        out.pop()
    return out


def local(strategy, x):
    return [np.asarray(v) for v in strategy.experimental_local_results(x)]


def expected_sizes(b, r):
    per = -(-b // r)
    return [max(0, min(per, b - i * per)) for i in range(r)]


class Counting:
    """A re-iterable source that counts how many batches have been pulled."""

    def __init__(self, n_batches, batch=8):
        self.n_batches, self.batch, self.pulled = n_batches, batch, 0

    def __iter__(self):
        for i in range(self.n_batches):
            self.pulled += 1
            yield np.arange(i * self.batch, (i + 1) * self.batch, dtype=np.float32)


# -- splitting -----------------------------------------------------------------


@pytest.mark.parametrize("n, batch", [(27, 8), (14, 8), (5, 5), (16, 4), (3, 16)])
def test_every_example_exactly_once(strategy, n, batch):
    r = strategy.num_replicas_in_sync
    seen = []
    data = batches(n, batch)
    dist = strategy.experimental_distribute_dataset(data)
    steps = list(dist)
    assert len(steps) == len(data)
    for x, b in zip(steps, data):
        parts = local(strategy, x)
        assert len(parts) == r
        assert [len(p) for p in parts] == expected_sizes(len(b), r)
        np.testing.assert_array_equal(np.concatenate(parts), b)
        seen.extend(np.concatenate(parts).tolist())
    assert sorted(seen) == list(range(n))


@pytest.mark.parametrize(
    "b, sizes",
    [
        (6, [2, 2, 2, 0]),
        (3, [1, 1, 1, 0]),
        (7, [2, 2, 2, 1]),
        (1, [1, 0, 0, 0]),
        (2, [1, 1, 0, 0]),
        (5, [2, 2, 1, 0]),
        (9, [3, 3, 3, 0]),
        (13, [4, 4, 4, 1]),
        (8, [2, 2, 2, 2]),
    ],
)
def test_tf_split_vectors_over_4(b, sizes):
    s = jd.MirroredStrategy([f"/cpu:{i}" for i in range(4)])
    (x,) = list(s.experimental_distribute_dataset([np.arange(b)]))
    parts = local(s, x)
    assert [len(p) for p in parts] == sizes
    np.testing.assert_array_equal(np.concatenate(parts), np.arange(b))


def test_tf_split_range10_batch4_over_4():
    s = jd.MirroredStrategy([f"/cpu:{i}" for i in range(4)])
    got = [
        [p.tolist() for p in local(s, x)] for x in s.experimental_distribute_dataset(batches(10, 4))
    ]
    assert got == [[[0], [1], [2], [3]], [[4], [5], [6], [7]], [[8], [9], [], []]]


def test_even_batch_is_one_sharded_array(strategy):
    r = strategy.num_replicas_in_sync
    (x,) = list(strategy.experimental_distribute_dataset([np.ones((4 * r, 3), np.float32)]))
    if r == 1:
        assert isinstance(x, jax.Array) and x.shape == (4, 3)
        return
    assert isinstance(x, jd.PerReplica)
    (stacked,) = jax.tree.leaves(x)
    assert stacked.shape == (r, 4, 3)
    assert stacked.sharding == strategy.extended.replicas.sharding


def test_partial_batch_parts_on_replica_devices(strategy):
    r = strategy.num_replicas_in_sync
    if r == 1:
        pytest.skip("one replica never splits")
    (x,) = list(strategy.experimental_distribute_dataset([np.zeros((r + 1, 5), np.float32)]))
    parts = strategy.experimental_local_results(x)
    for part, device in zip(parts, strategy.extended.replicas.devices):
        assert part.devices() == {device}
        assert part.dtype == jnp.float32 and part.shape[1:] == (5,)
    assert [p.shape[0] for p in parts] == expected_sizes(r + 1, r)


def test_dict_tuple_namedtuple_elements(strategy):
    r = strategy.num_replicas_in_sync
    n = 3 * r + 1  # partial
    data = [
        (
            {"x": np.arange(n, dtype=np.float32), "m": np.arange(n) * 10},
            Point(np.arange(n) % 2, np.ones((n, 2))),
        )
    ]
    (x,) = list(strategy.experimental_distribute_dataset(data))
    feats, point = x
    assert isinstance(point, Point) and set(feats) == {"m", "x"}
    np.testing.assert_array_equal(np.concatenate(local(strategy, feats["m"])), np.arange(n) * 10)
    np.testing.assert_array_equal(np.concatenate(local(strategy, feats["x"])), np.arange(n))
    np.testing.assert_array_equal(np.concatenate(local(strategy, point.x)), np.arange(n) % 2)
    assert np.concatenate(local(strategy, point.y)).shape == (n, 2)


def test_drop_remainder_drops_the_partial_batch(strategy):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ds = strategy.experimental_make_numpy_dataset(np.arange(14)).batch(8, drop_remainder=True)
    steps = list(strategy.experimental_distribute_dataset(ds))
    assert len(steps) == 1
    np.testing.assert_array_equal(np.concatenate(local(strategy, steps[0])), np.arange(8))


def test_one_device_strategy_yields_plain_batches():
    s = jd.OneDeviceStrategy("/cpu:0")
    got = list(s.experimental_distribute_dataset(batches(10, 4)))
    assert all(isinstance(x, jax.Array) for x in got)
    assert [x.tolist() for x in got] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_jax_array_and_tfdata_like_sources(strategy):
    r = strategy.num_replicas_in_sync

    class TfDataLike:
        def as_numpy_iterator(self):
            return iter([np.arange(2 * r), np.arange(r + 1)])

    for source in (TfDataLike(), [jnp.arange(2 * r), jnp.arange(r + 1)]):
        got = [
            np.concatenate(local(strategy, x)).tolist()
            for x in strategy.experimental_distribute_dataset(source)
        ]
        assert got == [list(range(2 * r)), list(range(r + 1))]


def test_string_leaves_stay_on_host():
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    (x,) = list(s.experimental_distribute_dataset([(np.arange(4), np.array(list("abcd")))]))
    assert [p.tolist() for p in local(s, x[1])] == [["a", "b"], ["c", "d"]]


# -- using the batches ---------------------------------------------------------


def test_run_reduce_gather_on_partial_batches(strategy):
    r = strategy.num_replicas_in_sync
    data = batches(3 * r + 2, 2 * r, dtype=np.float32)  # last batch partial (r + 2)
    for b, x in zip(data, strategy.experimental_distribute_dataset(data)):
        y = strategy.run(lambda v: v * 2.0 + 1.0, args=(x,))
        np.testing.assert_allclose(strategy.reduce("SUM", y, axis=0), np.sum(b * 2 + 1), rtol=1e-6)
        np.testing.assert_allclose(
            strategy.reduce("MEAN", y, axis=0), np.mean(b * 2 + 1), rtol=1e-6
        )
        np.testing.assert_array_equal(strategy.gather(x, axis=0), b)


def test_run_with_collective_on_partial_batch(strategy):
    r = strategy.num_replicas_in_sync
    (x,) = list(strategy.experimental_distribute_dataset([np.arange(r + 1, dtype=np.float32)]))

    def step(v):
        return jd.get_replica_context().all_reduce("SUM", jnp.sum(v))

    out = strategy.run(step, args=(x,))
    for v in strategy.experimental_local_results(out):
        assert float(v) == sum(range(r + 1))


# The MEAN of an integer batch is a float: test_tf_vectors.py, test_partial_batch_reductions_match_tf.


# -- iteration -----------------------------------------------------------------


def test_iterator_protocol_and_end_of_data(strategy):
    dist = strategy.experimental_distribute_dataset(batches(10, 4))
    it = iter(dist)
    assert iter(it) is it
    first = it.get_next()
    second = next(it)
    opt = it.get_next_as_optional()
    assert opt.has_value()
    assert np.concatenate(local(strategy, first)).tolist() == [0, 1, 2, 3]
    assert np.concatenate(local(strategy, second)).tolist() == [4, 5, 6, 7]
    assert np.concatenate(local(strategy, opt.get_value())).tolist() == [8, 9]
    for _ in range(2):  # end of data is sticky
        with pytest.raises(StopIteration):
            it.get_next()
        with pytest.raises(StopIteration):
            next(it)
        empty = it.get_next_as_optional()
        assert not empty.has_value()
        with pytest.raises(ValueError, match="no value"):
            empty.get_value()


def test_reiterable_and_one_shot_sources(strategy):
    dist = strategy.experimental_distribute_dataset(batches(12, 4))
    first = [np.concatenate(local(strategy, x)).tolist() for x in dist]
    again = [np.concatenate(local(strategy, x)).tolist() for x in dist]
    assert first == again == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    one_shot = strategy.experimental_distribute_dataset(iter(batches(8, 4)))
    assert len(list(one_shot)) == 2
    with pytest.raises(RuntimeError, match="one-shot iterator .* function that makes a fresh"):
        iter(one_shot)  # a second epoch would silently be empty


def test_element_spec(strategy):
    data = [{"x": np.zeros((8, 3), np.float32), "y": np.zeros(8, np.int32)}]
    dist = strategy.experimental_distribute_dataset(data)
    spec = dist.element_spec
    assert spec["x"] == jd.TensorSpec((None, 3), jnp.float32)
    assert spec["y"] == jd.TensorSpec((None,), jnp.int32)
    assert iter(dist).element_spec == spec
    assert strategy.experimental_distribute_dataset([]).element_spec is None
    assert list(strategy.experimental_distribute_dataset([])) == []


def test_cardinality_and_reduce(strategy):
    dist = strategy.experimental_distribute_dataset(batches(10, 4, dtype=np.float32))
    assert dist.cardinality == 3 and len(dist) == 3
    total = dist.reduce(0.0, lambda acc, x: acc + strategy.reduce("SUM", x, axis=0))
    assert float(total) == 45.0
    assert strategy.experimental_distribute_dataset(Counting(2)).cardinality == -2


@pytest.mark.parametrize("buffer_size", [0, 1, 3])
def test_prefetch_keeps_buffer_size_elements_ahead(buffer_size):
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    source = Counting(10)
    options = jd.InputOptions(experimental_per_replica_buffer_size=buffer_size)
    dist = s.experimental_distribute_dataset(source, options)
    assert source.pulled == 1  # the first batch is read (and checked) up front
    it = iter(dist)
    x = next(it)
    assert source.pulled == 1 + buffer_size
    assert np.concatenate(local(s, x)).tolist() == list(range(8))
    next(it)
    assert source.pulled == 2 + buffer_size
    rest = list(it)
    assert len(rest) == 8 and source.pulled == 10


def test_prefetched_batches_are_already_placed():
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    placed = []
    data = list(batches(16, 4))
    it = iter(s.experimental_distribute_dataset(data))
    real_put = jax.device_put

    def spy(x, *args, **kwargs):
        placed.append(x)
        return real_put(x, *args, **kwargs)

    next(it)
    jax.device_put = spy
    try:
        ahead = next(it)  # already read and placed: no device_put now
    finally:
        jax.device_put = real_put
    # Only the element after it was read and placed during that call.
    assert len(placed) == 1 and np.array_equal(np.asarray(placed[0]).ravel(), data[2].ravel())
    assert isinstance(ahead, jd.PerReplica)
    assert np.concatenate(s.experimental_local_results(ahead)).tolist() == data[1].tolist()


def test_error_in_a_prefetched_batch_is_raised_at_that_element():
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    data = [np.arange(4), np.arange(4), (np.arange(4), np.arange(3)), np.arange(4)]
    it = iter(
        s.experimental_distribute_dataset(
            data, jd.InputOptions(experimental_per_replica_buffer_size=3)
        )
    )
    next(it), next(it)
    with pytest.raises(ValueError, match="same leading"):
        next(it)


def test_fetch_to_device_false_keeps_host_arrays(strategy):
    r = strategy.num_replicas_in_sync
    options = jd.InputOptions(experimental_fetch_to_device=False)
    for n in (2 * r, r + 1):
        (x,) = list(strategy.experimental_distribute_dataset([np.arange(n)], options))
        parts = strategy.experimental_local_results(x)
        assert all(isinstance(p, np.ndarray) for p in parts)
        np.testing.assert_array_equal(np.concatenate(parts), np.arange(n))
        out = strategy.run(lambda v: v + 1, args=(x,))
        np.testing.assert_array_equal(np.concatenate(local(strategy, out)), np.arange(n) + 1)


# -- distribute_datasets_from_function -------------------------------------------


def test_dsfn_per_worker_context_and_consecutive_batches(strategy):
    r = strategy.num_replicas_in_sync
    calls = []

    def dataset_fn(ctx):
        calls.append((ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync))
        per = ctx.get_per_replica_batch_size(2 * r)
        return batches(4 * r, per)

    dist = strategy.distribute_datasets_from_function(dataset_fn)
    assert calls == [(1, 0, r)]
    got = [np.concatenate(local(strategy, x)).tolist() for x in dist]
    assert got == [list(range(2 * r)), list(range(2 * r, 4 * r))]
    assert calls == [(1, 0, r)]  # iterating does not call dataset_fn again


def test_dsfn_per_worker_tail_gets_empty_arrays(strategy):
    r = strategy.num_replicas_in_sync
    data = [np.full((2, 3), i, np.float32) for i in range(r + 1)]
    steps = list(strategy.distribute_datasets_from_function(lambda ctx: data))
    assert len(steps) == 2
    parts = strategy.experimental_local_results(steps[1])
    assert [p.shape for p in parts] == [(2, 3)] + [(0, 3)] * (r - 1)
    assert all(p.dtype == jnp.float32 for p in parts)
    assert float(parts[0][0, 0]) == r


def test_dsfn_per_replica(strategy):
    r = strategy.num_replicas_in_sync
    calls = []

    def dataset_fn(ctx):
        calls.append((ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync))
        assert jnp.zeros(()).devices() == {
            strategy.extended.replicas.devices[ctx.input_pipeline_id]
        }
        rid = ctx.input_pipeline_id
        return [
            np.arange(2) + 100 * rid + 10 * k for k in range(rid + 1)
        ]  # replica i: i + 1 batches

    options = jd.InputOptions(experimental_replication_mode=jd.InputReplicationMode.PER_REPLICA)
    steps = list(strategy.distribute_datasets_from_function(dataset_fn, options))
    assert calls == [(r, i, r) for i in range(r)]
    assert len(steps) == r
    for k, x in enumerate(steps):
        parts = strategy.experimental_local_results(x)
        for i, (p, device) in enumerate(zip(parts, strategy.extended.replicas.devices)):
            expected = (np.arange(2) + 100 * i + 10 * k).tolist() if k <= i else []
            assert np.asarray(p).tolist() == expected
            assert p.devices() == {device}


def test_dsfn_per_replica_host_and_place_on_device():
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    mode = jd.InputReplicationMode.PER_REPLICA
    host = jd.InputOptions(experimental_fetch_to_device=False, experimental_replication_mode=mode)
    (x,) = list(s.distribute_datasets_from_function(lambda ctx: [np.arange(2)], host))
    assert all(isinstance(p, np.ndarray) for p in s.experimental_local_results(x))
    placed = jd.InputOptions(
        experimental_fetch_to_device=False,
        experimental_replication_mode=mode,
        experimental_place_dataset_on_device=True,
    )
    (x,) = list(s.distribute_datasets_from_function(lambda ctx: [np.arange(2)], placed))
    assert [p.devices() for p in s.experimental_local_results(x)] == [
        {d} for d in s.extended.replicas.devices
    ]


def test_dsfn_option_combinations_rejected_as_tf():
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    PR, PW = jd.InputReplicationMode.PER_REPLICA, jd.InputReplicationMode.PER_WORKER
    fn = lambda ctx: [np.arange(2)]  # noqa: E731
    bad = [
        jd.InputOptions(
            experimental_replication_mode=PR, experimental_place_dataset_on_device=True
        ),
        jd.InputOptions(
            experimental_replication_mode=PW, experimental_place_dataset_on_device=True
        ),
    ]
    for options in bad:
        with pytest.raises(ValueError, match="experimental_place_dataset_on_device"):
            s.distribute_datasets_from_function(fn, options)
    with pytest.raises(NotImplementedError, match="PER_REPLICA"):
        s.experimental_distribute_dataset(
            [np.arange(2)], jd.InputOptions(experimental_replication_mode=PR)
        )
    # PER_WORKER + place_dataset_on_device is accepted (and ignored) by experimental_distribute_dataset
    (x,) = list(s.experimental_distribute_dataset([np.arange(2)], bad[1]))
    assert np.concatenate(local(s, x)).tolist() == [0, 1]


def test_deprecated_alias_warns():
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with pytest.warns(DeprecationWarning, match="distribute_datasets_from_function"):
        dist = s.experimental_distribute_datasets_from_function(lambda ctx: batches(4, 1))
    assert [np.concatenate(local(s, x)).tolist() for x in dist] == [[0, 1], [2, 3]]


# -- InputContext / InputOptions -------------------------------------------------


def test_input_context():
    ctx = jd.InputContext()
    assert (ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync) == (1, 0, 1)
    ctx = jd.InputContext(2, 1, 4)
    assert (ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync) == (2, 1, 4)
    assert ctx.get_per_replica_batch_size(8) == 2
    assert ctx.get_per_replica_batch_size(0) == 0
    assert int(ctx.get_per_replica_batch_size(jnp.asarray(12))) == 3
    with pytest.raises(ValueError, match="7 is not divisible by `num_replicas_in_sync` 4"):
        ctx.get_per_replica_batch_size(7)
    assert "num_replicas_in_sync=4" in repr(ctx)


def test_input_options_defaults_and_mode_names():
    o = jd.InputOptions()
    assert o.experimental_fetch_to_device is True
    assert o.experimental_replication_mode is jd.InputReplicationMode.PER_WORKER
    assert o.experimental_place_dataset_on_device is False
    assert o.experimental_per_replica_buffer_size == 1
    assert jd.InputOptions(experimental_fetch_to_device=None).experimental_fetch_to_device is True
    assert jd.InputOptions(False).experimental_fetch_to_device is False  # positional, as TF
    assert jd.InputOptions(
        experimental_replication_mode="per_replica"
    ).experimental_replication_mode is (jd.InputReplicationMode.PER_REPLICA)
    assert [m.name for m in jd.InputReplicationMode] == ["PER_WORKER", "PER_REPLICA"]


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"experimental_per_replica_buffer_size": "x"}, TypeError),
        ({"experimental_per_replica_buffer_size": 1.5}, TypeError),
        ({"experimental_per_replica_buffer_size": -2}, ValueError),
        ({"experimental_fetch_to_device": "yes"}, TypeError),
        ({"experimental_replication_mode": "PER_HOST"}, ValueError),
    ],
)
def test_invalid_input_options_rejected_at_distribute_time(kwargs, error):
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    options = jd.InputOptions(**kwargs)  # constructing is lenient, as TF
    with pytest.raises(error, match="InputOptions"):
        s.experimental_distribute_dataset([np.arange(2)], options)


def test_autotune_buffer_size_accepted():
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    options = jd.InputOptions(experimental_per_replica_buffer_size=-1)
    assert len(list(s.experimental_distribute_dataset(batches(8, 2), options))) == 4


# -- experimental_make_numpy_dataset ---------------------------------------------


def test_make_numpy_dataset():
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with pytest.warns(DeprecationWarning, match="experimental_make_numpy_dataset"):
        ds = s.experimental_make_numpy_dataset(np.arange(10.0))
    assert len(ds) == 10 and [float(x) for x in ds][:3] == [0.0, 1.0, 2.0]
    assert ds.element_spec == jd.TensorSpec((), np.float64)
    batched = ds.batch(4)  # its values: test_compat.py, _check_make_numpy_dataset
    assert len(batched) == 3 and len(ds.batch(4, drop_remainder=True)) == 2
    assert batched.element_spec == jd.TensorSpec((None,), np.float64)
    nested = jd.NumpyDataset((np.arange(4.0), {"y": np.arange(4)}))
    assert [(float(a), int(b["y"])) for a, b in nested][1] == (1.0, 1)
    dist = s.experimental_distribute_dataset(nested.batch(3))
    got = [[p.tolist() for p in local(s, x[1]["y"])] for x in dist]
    assert got == [[[0, 1], [2]], [[3], []]]


def test_make_numpy_dataset_errors():
    with pytest.raises(ValueError, match="same number of rows"):
        jd.NumpyDataset((np.arange(3), np.arange(4)))
    with pytest.raises(ValueError, match="leading axis"):
        jd.NumpyDataset(np.float32(1.0))
    with pytest.raises(ValueError, match="positive"):
        jd.NumpyDataset(np.arange(3)).batch(0)
    with pytest.raises(TypeError, match="batch_size"):
        jd.NumpyDataset(np.arange(3)).batch(2.0)


# -- bad input -------------------------------------------------------------------


def test_bad_datasets_raise_before_iterating():
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with pytest.raises(TypeError, match=r"dataset must be an iterable of batches .*; got int"):
        s.experimental_distribute_dataset(5)
    with pytest.raises(TypeError, match="got dict"):
        s.experimental_distribute_dataset({"x": np.arange(4)})
    with pytest.raises(TypeError, match="got str"):
        s.experimental_distribute_dataset("data")
    with pytest.raises(TypeError, match=r"not one array .* shape \(4,\)"):
        s.experimental_distribute_dataset(np.arange(4))  # one array: its rows are no batches
    with pytest.raises(ValueError, match="leaf 0 is a scalar"):
        s.experimental_distribute_dataset(list(np.arange(4)))  # unbatched: scalars
    with pytest.raises(ValueError, match=r"same leading \(batch\) size; got sizes \[4, 3\]"):
        s.experimental_distribute_dataset([(np.arange(4), np.arange(3))])
    with pytest.raises(TypeError, match="options must be a jaxdist.InputOptions"):
        s.experimental_distribute_dataset(
            [np.arange(4)], options={"experimental_fetch_to_device": False}
        )
    with pytest.raises(TypeError, match="what the function given as dataset returned .* got int"):
        s.experimental_distribute_dataset(lambda: 3)


def test_bad_dataset_fn():
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with pytest.raises(TypeError, match="dataset_fn must be a callable"):
        s.distribute_datasets_from_function(5)
    with pytest.raises(TypeError, match="returned by dataset_fn must be an iterable"):
        s.distribute_datasets_from_function(lambda ctx: 3)
    with pytest.raises(TypeError, match="must return an iterable of elements; got another func"):
        s.distribute_datasets_from_function(lambda ctx: lambda: lambda: [np.arange(2)])
    with pytest.raises(TypeError, match="what the function given as the dataset returned by "):
        s.distribute_datasets_from_function(lambda ctx: lambda: 3)
    with pytest.raises(TypeError, match="options must be a jaxdist.InputOptions"):
        s.distribute_datasets_from_function(lambda ctx: [np.arange(2)], options=1)


def test_later_bad_batch_names_the_problem():
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    it = iter(s.experimental_distribute_dataset([np.arange(4), np.float32(3.0)]))
    next(it)
    with pytest.raises(ValueError, match="leading batch axis"):
        next(it)


def test_dsfn_replicas_must_agree_on_structure():
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    it = iter(
        s.distribute_datasets_from_function(
            lambda ctx: [np.arange(2), (np.arange(2), np.arange(2))]
        )
    )
    with pytest.raises(ValueError, match="same structure"):
        next(it)


# -- TF 2.21 vectors: unbatched elements (ids unbatched.*, batched.*) ---------------


def tf(case):
    return ANSWERS[case]["result"]


def decoded(x):
    """A TF oracle value with its tensors replaced by their values (lists / numbers)."""
    if isinstance(x, dict) and "dtype" in x and "value" in x:
        return x["value"]
    if isinstance(x, dict) and set(x) == {"type", "items"}:
        return [decoded(v) for v in x["items"]]
    if isinstance(x, dict):
        return {k: decoded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [decoded(v) for v in x]
    return x


def tf_calls(case):
    """The InputContexts TF's dataset_fn got, as (pipelines, pipeline id, replicas)."""
    keys = ("num_input_pipelines", "input_pipeline_id", "num_replicas_in_sync")
    return [tuple(c[k] for k in keys) for c in tf(case)["calls"]]


def tf_steps(case):
    return [decoded(step["local_results"]) for step in tf(case)["steps"]]


def as_python(strategy, element):
    """Each local replica's value of ``element``, as Python numbers/lists (tuples as lists,
    as the TF oracle encodes them)."""

    def plain(x):
        if isinstance(x, (tuple, list)):
            return [plain(v) for v in x]
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        return np.asarray(x).tolist()

    return [plain(e) for e in strategy.experimental_local_results(element)]


FIVE = [np.float32(v) for v in (5.0, 6.0, 7.0, 8.0, 9.0)]  # TF: from_tensor_slices([5., ..., 9.])
PER_REPLICA = jd.InputOptions(experimental_replication_mode=jd.InputReplicationMode.PER_REPLICA)


def test_dsfn_unbatched_scalars_per_worker_match_tf(strategy):
    r = strategy.num_replicas_in_sync
    calls = []

    def dataset_fn(ctx):
        calls.append((ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync))
        return FIVE

    dist = strategy.distribute_datasets_from_function(dataset_fn)
    it = iter(dist)
    steps = [as_python(strategy, x) for x in it]
    # consecutive elements to replicas 0..R-1; the incomplete last step is dropped (TF eager)
    expected = [[5.0 + k * r + i for i in range(r)] for k in range(5 // r)]
    assert steps == expected and calls == [(1, 0, r)]
    assert dist.element_spec == jd.TensorSpec((), jnp.float32)
    assert dist.cardinality == 5 and len(dist) == 5 // r  # TF: the dataset's own count
    with pytest.raises(StopIteration):
        next(it)
    if r in TF_RUNS:
        case = f"unbatched.dsfn_scalars_per_worker_{r}r"
        assert steps == tf_steps(case) and tf(case)["end"] == "StopIteration"
        assert calls == tf_calls(case)


def test_dsfn_unbatched_values_are_scalars_on_their_replicas(strategy):
    r = strategy.num_replicas_in_sync
    data = [np.float32(5 + i) for i in range(r)]
    (x,) = list(strategy.distribute_datasets_from_function(lambda ctx: data))
    parts = strategy.experimental_local_results(x)
    assert [p.shape for p in parts] == [()] * r
    assert [p.devices() for p in parts] == [{d} for d in strategy.extended.replicas.devices]
    out = strategy.run(
        lambda v: (v * 10, jd.get_replica_context().replica_id_in_sync_group), args=(x,)
    )
    assert as_python(strategy, out) == [[50.0 + 10 * i, i] for i in range(r)]
    if r in (2, 4):  # TF: (x * 10, tf.shape(x), replica id) of the first step
        first = decoded(tf(f"unbatched.dsfn_scalars_per_worker_run_{r}r")[0])
        assert [v["values"] for v in first] == [
            [50.0 + 10 * i for i in range(r)],
            [[]] * r,
            list(range(r)),
        ]


@pytest.mark.parametrize("kind", ["dict", "tuple"])
def test_dsfn_unbatched_nests_per_worker_match_tf(strategy, kind):
    r = strategy.num_replicas_in_sync
    make = (lambda a, b: {"a": a, "b": b}) if kind == "dict" else (lambda a, b: (a, b))
    data = [make(v, np.int32(i)) for i, v in enumerate(FIVE)]
    dist = strategy.distribute_datasets_from_function(lambda ctx: data)
    elements = list(dist)
    assert len(elements) == 5 // r
    assert all(isinstance(x, dict if kind == "dict" else tuple) for x in elements)
    steps = [as_python(strategy, x) for x in elements]
    pair = (lambda a, b: {"a": a, "b": b}) if kind == "dict" else (lambda a, b: [a, b])
    assert steps == [[pair(5.0 + k * r + i, k * r + i) for i in range(r)] for k in range(5 // r)]
    spec = jax.tree.leaves(dist.element_spec)
    assert spec == [jd.TensorSpec((), jnp.float32), jd.TensorSpec((), jnp.int32)]
    if r in TF_RUNS:
        assert steps == tf_steps(f"unbatched.dsfn_{kind}_per_worker_{r}r")


@pytest.mark.parametrize("kind", ["scalars", "dict", "tuple"])
def test_dsfn_unbatched_per_replica_match_tf(strategy, kind):
    r = strategy.num_replicas_in_sync
    make = {
        "scalars": lambda a, b: a,
        "dict": lambda a, b: {"a": a, "b": b},
        "tuple": lambda a, b: (a, b),
    }[kind]
    calls = []

    def dataset_fn(ctx):
        calls.append((ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync))
        return [make(v, np.int32(i)) for i, v in enumerate(FIVE)]

    dist = strategy.distribute_datasets_from_function(dataset_fn, PER_REPLICA)
    steps = [as_python(strategy, x) for x in dist]
    want = [[make(5.0 + k, k)] * r for k in range(5)]  # no sharding is done for you
    assert steps == [[[*e] if kind == "tuple" else e for e in step] for step in want]
    assert calls == [(r, i, r) for i in range(r)] and dist.cardinality == 5
    if r in TF_RUNS:
        case = f"unbatched.dsfn_{kind}_per_replica_{r}r"
        assert steps == tf_steps(case)
        assert calls == tf_calls(case)


def test_dsfn_unbatched_per_replica_ends_with_the_shortest(strategy):
    r = strategy.num_replicas_in_sync
    dist = strategy.distribute_datasets_from_function(
        lambda ctx: FIVE[: 2 + ctx.input_pipeline_id], PER_REPLICA
    )
    assert dist.cardinality == 2  # replica 0 has 2 elements: no incomplete step is made
    assert [as_python(strategy, x) for x in dist] == [[5.0] * r, [6.0] * r]


def test_dsfn_unbatched_end_of_data_differs_from_tf_get_next_as_optional(strategy):
    r = strategy.num_replicas_in_sync
    it = iter(strategy.distribute_datasets_from_function(lambda ctx: FIVE))
    got = []
    while (opt := it.get_next_as_optional()).has_value():
        got.append(as_python(strategy, opt.get_value()))
    assert got == [[5.0 + k * r + i for i in range(r)] for k in range(5 // r)]
    if r in (2, 4):
        # TF's get_next_as_optional (and its tf.function loops) pad the last step with
        # zeros, while its eager next() drops it: jaxdist follows next() everywhere.
        answer = tf(f"unbatched.dsfn_scalars_per_worker_get_next_as_optional_{r}r")
        tf_steps_with_value = [decoded(o["value"]) for o in answer if o["has_value"]]
        assert tf_steps_with_value[: len(got)] == got
        assert tf_steps_with_value[len(got)] == [9.0] + [0.0] * (r - 1)


def test_eds_unbatched_scalars_match_tf(strategy):
    r = strategy.num_replicas_in_sync
    if r == 1:  # yielded unchanged, as TF on one replica
        for s, case in [
            (strategy, "eds_scalars_1r"),
            (jd.OneDeviceStrategy("/cpu:0"), "eds_scalars_onedevice"),
        ]:
            dist = s.experimental_distribute_dataset(FIVE)
            got = list(dist)
            assert all(isinstance(x, jax.Array) and x.shape == () for x in got)
            assert [[float(x)] for x in got] == tf_steps(f"unbatched.{case}")
            assert dist.element_spec == jd.TensorSpec((), jnp.float32)
        return
    if r in TF_RUNS:  # TF raises (a bare IndexError) in experimental_distribute_dataset itself
        answer = tf(f"unbatched.eds_scalars_{r}r_when")["experimental_distribute_dataset"]
        assert answer.startswith("error:IndexError")
    with pytest.raises(ValueError, match=rf"over the {r} replicas.*leaf 0 is a scalar.*Batch"):
        strategy.experimental_distribute_dataset(FIVE)
    with pytest.raises(ValueError, match="leaf 1 is a scalar"):
        strategy.experimental_distribute_dataset([(np.arange(4.0), np.float32(1.0))])
    scalars = (np.float32(i) for i in range(3))
    with pytest.raises(ValueError, match="not a batch"):
        strategy.experimental_distribute_dataset(scalars)
    assert next(scalars) == 1.0  # raised before iterating: only the first element was read


@pytest.mark.parametrize("shape", [(3,), (3, 2)])
def test_eds_unbatched_vectors_are_split_as_batches_like_tf(strategy, shape):
    r = strategy.num_replicas_in_sync
    n = int(np.prod(shape))
    data = list(np.arange(4 * n, dtype=np.float32).reshape(4, *shape))
    dist = strategy.experimental_distribute_dataset(data)
    steps = [as_python(strategy, x) for x in dist]
    for step, row in zip(steps, data):
        assert [len(p) for p in step] == expected_sizes(3, r)
        assert sum(step, []) == row.tolist()
    assert dist.element_spec == jd.TensorSpec((None, *shape[1:]), jnp.float32)
    case = "unbatched.eds_vectors" if shape == (3,) else "unbatched.eds_matrices"
    if f"{case}_{r}r" in ANSWERS:
        want = tf_steps(f"{case}_{r}r")
        assert steps == want


def test_batched_range5_batch2_matches_tf(strategy):
    r = strategy.num_replicas_in_sync
    dist = strategy.experimental_distribute_dataset(batches(5, 2))
    steps = [as_python(strategy, x) for x in dist]
    sizes = [expected_sizes(2, r)] * 2 + [expected_sizes(1, r)]
    assert [[len(p) for p in step] for step in steps] == sizes
    assert [sum(step, []) for step in steps] == [[0, 1], [2, 3], [4]]
    if r == 2:
        answer = tf("batched.eds_range5_batch2_2r_eager_vs_tf_function")["eager"]
        assert steps == [decoded(step["local_results"]) for step in answer["steps"]]


# -- TF 2.21 vectors: next(iterator) inside strategy.run (ids next_in_run.*) --------

NEXT_IN_RUN = tf("next_in_run.eager_2r")["full_message"]


def _iterators(s):
    r = s.num_replicas_in_sync
    return {
        "eds": iter(s.experimental_distribute_dataset(batches(8 * r, 4 * r))),
        "dsfn": iter(s.distribute_datasets_from_function(lambda ctx: batches(8 * r, 2))),
    }


READS = {
    "next": lambda it: next(it),
    "get_next": lambda it: it.get_next(),
    "get_next_as_optional": lambda it: it.get_next_as_optional(),
}


@pytest.mark.parametrize("read", sorted(READS))
def test_next_inside_run_raises_tf_error_and_consumes_nothing(any_strategy, read):
    s, r = any_strategy, any_strategy.num_replicas_in_sync
    eager = [c for c in ANSWERS if c.startswith("next_in_run.") and "tf_function" not in c]
    assert len(eager) == 6 and {tf(c)["full_message"] for c in eager} == {NEXT_IN_RUN}
    for kind, it in _iterators(s).items():
        with pytest.raises(ValueError) as e:  # the iterator as an argument
            s.run(lambda i: READS[read](i), args=(it,))
        assert str(e.value) == NEXT_IN_RUN
        with pytest.raises(ValueError, match=r"should be called from outside of replica_fn"):
            s.run(lambda it=it: READS[read](it))  # captured (a default, not an argument)
        first = np.concatenate(local(s, next(it))).tolist()  # nothing was consumed
        assert first == (list(range(4 * r)) if kind == "eds" else list(range(2 * r)))


def test_next_inside_run_under_jit_raises_tf_error(strategy):
    it = iter(strategy.experimental_distribute_dataset(batches(8, 4, dtype=np.float32)))
    step = jax.jit(lambda: strategy.run(lambda: next(it)))
    with pytest.raises(ValueError, match=r"next\(iterator\) should be called from outside"):
        step()
    assert "in user code" in tf("next_in_run.tf_function_2r")["full_message"]  # TF wraps it
    x = next(it)  # outside run, also inside jax.jit, reading is fine
    assert float(jax.jit(lambda v: strategy.reduce("SUM", v, axis=0))(x)) == 6.0


# -- TF 2.21 vectors: InputContext / InputOptions text and buffer sizes --------------


def test_input_context_str_matches_tf():
    answer = tf("input_context.str_repr")
    assert str(jd.InputContext(2, 1, 4)) == answer["str_2_1_4"]
    assert str(jd.InputContext()) == answer["str_default"]
    assert repr(jd.InputContext(2, 1, 4)) == (
        "InputContext(num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=4)"
    )  # jaxdist keeps the dataclass repr (TF's is the default object repr)
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    seen = []
    s.distribute_datasets_from_function(lambda ctx: seen.append(str(ctx)) or [np.arange(2)])
    assert seen == tf("input_context.dsfn_ctx_str")


def test_input_options_str_matches_tf():
    answer = tf("input_options.str_repr")
    assert str(jd.InputOptions()) == answer["str"] and repr(jd.InputOptions()) == answer["repr"]
    assert jd.InputOptions() == jd.InputOptions()  # equal by value, as TF's namedtuple
    assert [f.name for f in dataclasses.fields(jd.InputOptions)] == answer["fields"]


@pytest.mark.parametrize("size, case", [(-1, "m1"), (0, "0"), (1, "1"), (2, "2")])
def test_input_options_buffer_sizes_iterate_like_tf(any_strategy, size, case):
    s, r = any_strategy, any_strategy.num_replicas_in_sync
    answer = tf(f"input_options.buffer_size_{case}")
    options = jd.InputOptions(experimental_per_replica_buffer_size=size)
    assert str(options) == answer["construct"]
    dsfn = s.distribute_datasets_from_function(lambda ctx: batches(8 * r, 2), options)
    eds = s.experimental_distribute_dataset(batches(8, 4), options)
    dsfn_first, eds_first = as_python(s, next(iter(dsfn))), as_python(s, next(iter(eds)))
    assert dsfn_first == [[2 * i, 2 * i + 1] for i in range(r)]
    assert sum(eds_first, []) == [0, 1, 2, 3]
    assert [len(p) for p in eds_first] == expected_sizes(4, r)
    if r == 2:
        assert dsfn_first == decoded(answer["mirrored2_dsfn_first_step"])
        assert eds_first == decoded(answer["mirrored2_eds_first_step"])
    if isinstance(s, jd.OneDeviceStrategy):
        assert eds_first == [decoded(answer["onedevice_eds_first_step"])]


UNCHECKED = tf("input_options.buffer_size_float_and_none")


@pytest.mark.parametrize(
    "size, tf_text, error",
    [
        (-2, tf("input_options.buffer_size_m2")["construct"], ValueError),
        (1.5, UNCHECKED["1.5"], TypeError),
        (None, UNCHECKED["None"], TypeError),
    ],
)
def test_buffer_sizes_tf_accepts_unchecked_are_rejected_when_used(size, tf_text, error):
    # TF constructs and iterates with these without a check; jaxdist constructs them (as TF)
    # but raises when they are used, naming the field, instead of misusing them.
    options = jd.InputOptions(experimental_per_replica_buffer_size=size)
    assert str(options) == tf_text
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    match = r"experimental_per_replica_buffer_size .*TF accepts it unchecked"
    with pytest.raises(error, match=match):
        s.experimental_distribute_dataset([np.arange(2)], options)
    with pytest.raises(error, match=match):
        s.distribute_datasets_from_function(lambda ctx: [np.arange(2)], options)


# -- TF 2.21 vectors: re-iteration, len and cardinality (dataset_reiter.*, dataset_len.*)


def _generator_function(calls, n=6, batch=4):
    def gen():
        calls.append(1)
        data = np.arange(n, dtype=np.float32)
        for i in range(0, n, batch):
            yield data[i : i + batch]

    return gen


def test_function_source_is_called_once_per_epoch_like_tf_from_generator(strategy):
    r = strategy.num_replicas_in_sync
    answer = tf("dataset_reiter.from_generator_two_epochs_2r")
    calls = []
    dist = strategy.experimental_distribute_dataset(_generator_function(calls))
    epochs = []
    for _ in range(2):
        epochs.append([as_python(strategy, x) for x in dist])
        assert len(calls) == len(epochs)  # TF: gen_calls_after_epoch1 == 1, epoch2 == 2
    assert [answer["gen_calls_after_epoch1"], answer["gen_calls_after_epoch2"]] == [1, 2]
    assert epochs[0] == epochs[1]
    assert [sum(step, []) for step in epochs[0]] == [[0, 1, 2, 3], [4, 5]]
    assert [[len(p) for p in step] for step in epochs[0]] == [
        expected_sizes(4, r),
        expected_sizes(2, r),
    ]
    if r == 2:
        tf_epochs = [
            [decoded(st["local_results"]) for st in answer[e]["steps"]]
            for e in ("epoch1", "epoch2")
        ]
        assert epochs == tf_epochs


@pytest.mark.parametrize("nested", [False, True])
def test_dsfn_function_source_is_called_once_per_epoch_like_tf(strategy, nested):
    r = strategy.num_replicas_in_sync
    answer = tf("dataset_reiter.dsfn_generator_two_epochs_2r")
    calls, ctx_calls = [], []
    gen = _generator_function(calls, batch=2)

    def dataset_fn(ctx):
        ctx_calls.append(ctx)
        return gen if not nested else (lambda: gen())

    dist = strategy.distribute_datasets_from_function(dataset_fn)
    epochs = [[as_python(strategy, x) for x in dist] for _ in range(2)]
    assert len(calls) == 2 and len(ctx_calls) == 1 and epochs[0] == epochs[1]
    flat = [sum(step, []) for step in epochs[0]]
    assert sum(flat, []) == [0, 1, 2, 3, 4, 5] and len(flat) == -(-3 // r)
    if r == 2:
        assert epochs[0] == [decoded(st["local_results"]) for st in answer["epoch1"]["steps"]]


def test_one_shot_source_second_epoch_raises_instead_of_tf_silence(strategy):
    # TF: a captured, exhausted Python iterator gives an empty second epoch, silently.
    assert tf("dataset_reiter.python_iterator_generator_two_epochs_2r")["epoch2"]["steps"] == []
    r = strategy.num_replicas_in_sync
    for make in (
        lambda g: strategy.experimental_distribute_dataset(g),
        lambda g: strategy.distribute_datasets_from_function(lambda ctx: g),
    ):
        dist = make(x for x in batches(4 * r, 2 * r))
        assert len(list(dist)) in (1, 2)
        with pytest.raises(RuntimeError, match=r"one-shot iterator \(generator\).*lambda: "):
            iter(dist)


def test_exhausted_iterator_keeps_raising_stop_iteration_like_tf(strategy):
    answer = tf("dataset_reiter.iterator_exhausted_then_next_2r")
    it = iter(strategy.experimental_distribute_dataset(batches(4, 4)))
    assert sum(as_python(strategy, next(it)), []) == [0, 1, 2, 3]
    for key in ("second", "third"):
        with pytest.raises(StopIteration):
            next(it)
        assert answer[key] == "StopIteration"


def test_cardinality_is_a_numpy_int64_attribute_like_tf(strategy):
    r = strategy.num_replicas_in_sync
    dist = strategy.experimental_distribute_dataset(batches(10, 4))
    known = {n: tf(f"dataset_len.known_{n}r")["cardinality_attr"] for n in TF_RUNS}
    assert all(a == {"type": "int64", "value": 3} for a in known.values())
    assert type(dist.cardinality) is np.int64 and dist.cardinality == 3
    with pytest.raises(TypeError, match="'numpy.int64' object is not callable"):
        dist.cardinality()  # as TF: dataset_len.known_*r "cardinality()"
    assert len(dist) == 3  # TF has no len() (TypeError); jaxdist gives the known length
    assert tf("dataset_len.known_2r")["len"].startswith("error:TypeError")
    dsfn = strategy.distribute_datasets_from_function(lambda ctx: batches(10, 4))
    # TF 2.21 reports its dataset's 3 batches (dataset_len.dsfn_2r) although 2 replicas
    # take them in 2 steps; jaxdist's cardinality does the same, len() counts steps.
    assert tf("dataset_len.dsfn_2r")["cardinality_attr"]["value"] == 3
    assert dsfn.cardinality == 3
    assert len(dsfn) == len(list(dsfn)) == -(-3 // r)


def test_unknown_and_infinite_cardinality_like_tf(strategy):
    r = strategy.num_replicas_in_sync
    assert tf("dataset_len.unknown_2r")["cardinality_attr"]["value"] == -2
    assert tf("dataset_len.infinite_2r")["cardinality_attr"]["value"] == -1
    unknown = strategy.experimental_distribute_dataset(_generator_function([]))
    assert unknown.cardinality == -2 and bool(unknown)
    with pytest.raises(TypeError, match="length is unknown"):
        len(unknown)

    class Infinite:  # a tf.data-like dataset whose cardinality() is INFINITE
        def as_numpy_iterator(self):
            return itertools.repeat(np.arange(2 * r))

        def cardinality(self):
            return -1

    infinite = strategy.experimental_distribute_dataset(Infinite())
    assert infinite.cardinality == -1
    with pytest.raises(TypeError, match="infinite"):
        len(infinite)
    assert sum(as_python(strategy, next(iter(infinite))), []) == list(range(2 * r))
    per_replica = strategy.distribute_datasets_from_function(lambda ctx: Infinite(), PER_REPLICA)
    assert per_replica.cardinality == -1
    assert strategy.experimental_distribute_dataset(lambda: batches(8, 4)).cardinality == 2
