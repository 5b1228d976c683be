"""Strategy.run: lowering through pmap, argument mapping, outputs, caching, in-flight cap."""

import subprocess
import sys
import textwrap

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdist as jd


def ids_of(strategy):
    return strategy.experimental_distribute_values_from_function(
        lambda c: jnp.float32(c.replica_id_in_sync_group)
    )


def local(strategy, x):
    return [np.asarray(v) for v in strategy.experimental_local_results(x)]


def test_replica_ids(strategy):
    n = strategy.num_replicas_in_sync
    out = strategy.run(lambda: jd.get_replica_context().replica_id_in_sync_group)
    assert [int(v) for v in local(strategy, out)] == list(range(n))
    assert all(v.dtype == np.int32 for v in local(strategy, out))


def test_broadcast_and_mapped_args(strategy):
    n = strategy.num_replicas_in_sync
    out = strategy.run(
        lambda x, y, k: x * 2.0 + y + k, args=(jnp.ones(2), ids_of(strategy)), kwargs={"k": 3}
    )
    expected = [np.full(2, 5.0 + r) for r in range(n)]
    np.testing.assert_allclose(local(strategy, out), expected)


def test_nested_args_and_dict_output(strategy):
    n = strategy.num_replicas_in_sync
    v = ids_of(strategy)
    arg = {"a": v, "b": (jnp.float32(100.0), v)}
    out = strategy.run(
        lambda d: {"sum": d["a"] + d["b"][0] + d["b"][1], "sq": d["a"] ** 2}, args=(arg,)
    )
    assert sorted(out) == ["sq", "sum"]
    np.testing.assert_allclose(local(strategy, out["sum"]), [100.0 + 2 * r for r in range(n)])
    np.testing.assert_allclose(local(strategy, out["sq"]), [float(r * r) for r in range(n)])


def test_output_types(strategy):
    out = strategy.run(lambda: jnp.float32(1.0))
    if strategy.num_replicas_in_sync == 1:
        assert isinstance(out, jax.Array) and not isinstance(out, jd.DistributedValues)
    else:
        assert type(out) is jd.PerReplica
        devices = [next(iter(x.devices())) for x in out.values]
        assert devices == list(strategy.extended.replicas.devices)


def test_trace_count_compiles_once(strategy):
    traces = []

    def step(x):
        traces.append(1)
        return jd.get_replica_context().all_reduce("SUM", x)

    v = ids_of(strategy)
    for _ in range(1000):
        out = strategy.run(step, args=(v,))
    n = strategy.num_replicas_in_sync
    np.testing.assert_allclose(local(strategy, out), [n * (n - 1) / 2] * n)
    assert len(traces) == 1


def test_new_input_shape_retraces_once(strategy):
    traces = []

    def step(x):
        traces.append(x.shape)
        return x + 1

    for shape in [(2,), (2,), (3,), (3,), (2,)]:
        strategy.run(step, args=(jnp.zeros(shape),))
    assert traces == [(2,), (3,)]


def test_fake_pmap(strategy):
    n = strategy.num_replicas_in_sync

    def step(x):
        ctx = jd.get_replica_context()
        return ctx.all_reduce("SUM", x * ctx.replica_id_in_sync_group)

    with chex.fake_pmap():
        out = strategy.run(step, args=(jnp.ones(3),))
    np.testing.assert_allclose(local(strategy, out), [np.full(3, n * (n - 1) / 2)] * n)


def test_many_unblocked_steps_with_collectives_finish():
    strategy = jd.MirroredStrategy([f"/cpu:{i}" for i in range(8)])
    w = strategy.experimental_distribute_values_from_function(lambda c: jnp.ones((16, 16)))

    def step(w, x):
        g = jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)
        g = jd.get_replica_context().all_reduce("MEAN", g)
        return w - 0.01 * g

    x = jnp.ones((4, 16))
    for _ in range(2000):
        w = strategy.run(step, args=(w, x))
    vals = local(strategy, w)
    assert all(np.isfinite(v).all() for v in vals)
    np.testing.assert_allclose(vals[0], vals[-1])


def test_in_flight_knob_validates():
    with pytest.raises(ValueError, match=r"n \(steps in flight\) must be an int >= 1"):
        jd.experimental.set_max_steps_in_flight(0)
    old = jd.experimental.get_max_steps_in_flight()
    jd.experimental.set_max_steps_in_flight(2)
    try:
        assert jd.experimental.get_max_steps_in_flight() == 2
    finally:
        jd.experimental.set_max_steps_in_flight(old)


def test_python_scalar_outputs_and_none(strategy):
    n = strategy.num_replicas_in_sync
    out = strategy.run(lambda: (jnp.int32(3), None))
    assert out[1] is None
    assert [int(v) for v in local(strategy, out[0])] == [3] * n


def test_bad_run_arguments(strategy):
    with pytest.raises(TypeError, match="fn must be callable"):
        strategy.run(3)
    with pytest.raises(TypeError, match="args must be a tuple or list"):
        strategy.run(lambda x: x, args=jnp.ones(2))
    with pytest.raises(TypeError, match="kwargs must be a dict"):
        strategy.run(lambda: 1, kwargs=[1])
    with pytest.raises(TypeError, match="RunOptions"):
        strategy.run(lambda: 1, options="fast")


def test_wrong_number_of_components():
    s4 = jd.MirroredStrategy([f"/cpu:{i}" for i in range(4)])
    s2 = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    v = ids_of(s2)
    with pytest.raises(ValueError, match="2 components, but the strategy has 4 replicas"):
        s4.run(lambda x: x, args=(v,))


def test_perreplica_on_other_devices_is_moved():
    a = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    b = jd.MirroredStrategy(["/cpu:2", "/cpu:3"])
    out = b.run(lambda x: x + 1, args=(ids_of(a),))
    assert [next(iter(x.devices())).id for x in out.values] == [2, 3]
    np.testing.assert_allclose(local(b, out), [1.0, 2.0])


def test_ragged_inputs_get_true_slices_and_collectives(strategy):
    n = strategy.num_replicas_in_sync
    if n == 1:
        pytest.skip("one replica cannot be ragged")
    sizes = [2] * (n - 1) + [0]
    parts = tuple(
        jax.device_put(np.arange(k, dtype=np.float32) + 10 * r, d)
        for r, (k, d) in enumerate(zip(sizes, strategy.extended.replicas.devices))
    )
    x = jd.PerReplica(parts)

    def step(v):
        ctx = jd.get_replica_context()
        total = ctx.all_reduce("SUM", jnp.sum(v))
        count = ctx.all_reduce("SUM", v.shape[0])
        merged = ctx.merge_call(lambda s, a: s.reduce("SUM", a, axis=0), args=(v,))
        return v.shape[0], total / count, merged

    sizes_out, means, merged = strategy.run(step, args=(x,))
    everything = np.concatenate([np.asarray(p) for p in parts])
    assert [int(s) for s in local(strategy, sizes_out)] == sizes
    np.testing.assert_allclose(local(strategy, means), [everything.mean()] * n)
    assert not isinstance(merged, jd.DistributedValues)  # one value for all replicas, as TF
    np.testing.assert_allclose(float(merged), everything.sum())


def test_ragged_step_error_propagates():
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    x = jd.PerReplica((jnp.ones(2), jnp.ones(1)))

    def step(v):
        if v.shape[0] == 1:
            raise KeyError("boom")
        return jd.get_replica_context().all_reduce("SUM", v.sum())

    with pytest.raises(KeyError, match="boom"):
        s.run(step, args=(x,))


def test_import_does_not_start_backend():
    code = textwrap.dedent(
        """
        import jaxdist
        from jax._src import xla_bridge
        assert not xla_bridge.backends_are_initialized()
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_python_numbers_are_traced_other_python_values_static():
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    traces = []

    def step(k, double):
        traces.append(double)
        return k * 2 if double else k + 0

    outs = [s.run(step, args=(k, True)) for k in range(20)]
    assert traces == [True]  # one compile for every value of the number
    assert [float(o.values[1]) for o in outs] == [2.0 * k for k in range(20)]
    assert float(s.run(step, args=(3, False)).values[0]) == 3.0
    assert traces == [True, False]  # a bool is static: one compile per value


def test_many_signatures_warn():
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])

    def step(x):
        return x * 2

    with pytest.warns(UserWarning, match="compiled '.*step' 8 times"):
        for n in range(1, 9):
            s.run(step, args=(jnp.ones(n),))
    assert jd.experimental.step_count(step) == 8
