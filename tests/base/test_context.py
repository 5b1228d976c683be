"""The four-state context machine, nesting rules, and per-thread state."""

import threading

import jax.numpy as jnp
import numpy as np
import pytest

import jaxdist as jd


def flags():
    return (jd.has_strategy(), jd.in_cross_replica_context(), jd.get_replica_context() is None)


def test_default_context():
    assert flags() == (False, False, False)
    ctx = jd.get_replica_context()
    assert ctx.replica_id_in_sync_group == 0
    assert ctx.num_replicas_in_sync == 1
    assert jd.get_strategy().num_replicas_in_sync == 1
    assert float(ctx.all_reduce("SUM", 1.0)) == 1.0
    assert float(ctx.merge_call(lambda s, x: x * 2, args=(3.0,))) == 6.0
    assert jd.get_strategy().run(lambda x: x * 2, args=(3.0,)) == 6.0


def test_scope_is_cross_replica(any_strategy):
    with any_strategy.scope() as s:
        assert s is any_strategy
        assert flags() == (True, True, True)
        assert jd.get_strategy() is any_strategy
        assert jd.get_cross_replica_context() is any_strategy
    assert flags() == (False, False, False)


def test_replica_and_merge_modes(strategy):
    seen = {}

    def merge_fn(s, v):
        seen["merge"] = (flags(), s is strategy, type(v).__name__)
        return s.reduce("SUM", v, axis=None)

    def step():
        seen["replica"] = (flags(), jd.get_strategy() is strategy)
        ctx = jd.get_replica_context()
        return ctx.merge_call(merge_fn, args=(jnp.float32(1.0),))

    out = strategy.run(step)
    n = strategy.num_replicas_in_sync
    assert seen["replica"] == ((True, False, False), True)
    assert seen["merge"] == ((True, True, True), True, "PerReplica")
    # merge_call's result is the same value on every replica: run returns it once (TF).
    assert [float(x) for x in strategy.experimental_local_results(out)] == [float(n)]


def test_same_scope_twice_is_fine_other_scope_raises():
    s1 = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    s2 = jd.OneDeviceStrategy("/cpu:0")
    with s1.scope():
        with s1.scope():
            assert jd.get_strategy() is s1
        with pytest.raises(RuntimeError, match="Mixing different"):
            with s2.scope():
                pass
        assert jd.get_strategy() is s1
    assert not jd.has_strategy()


def test_run_inside_run_raises(strategy):
    def step():
        return strategy.run(lambda: 1.0)

    with pytest.raises(RuntimeError, match="inside another run"):
        strategy.run(step)
    assert not jd.has_strategy()


def test_run_of_other_strategy_inside_scope_raises():
    s1 = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    s2 = jd.MirroredStrategy(["/cpu:2", "/cpu:3"])
    s2.run(lambda: 1.0)  # compile first: the check must not depend on tracing
    with s1.scope():
        with pytest.raises(RuntimeError, match="Mixing different"):
            s2.run(lambda: 1.0)


def test_cross_replica_api_inside_run_raises(strategy):
    v = strategy.experimental_distribute_values_from_function(lambda c: 1.0)
    for call in (
        lambda: strategy.reduce("SUM", v, None),
        lambda: strategy.gather(v, 0),
        lambda: strategy.extended.reduce_to("SUM", v, v),
        lambda: jd.ReductionToOneDevice().reduce(jd.ReduceOp.SUM, v, "/cpu:0"),
    ):

        def step(call=call):
            call()
            return 1.0

        with pytest.raises(RuntimeError, match="cross-replica context"):
            strategy.run(step)


def test_state_restored_when_step_raises(strategy):
    def step():
        raise ZeroDivisionError("inside")

    with pytest.raises(ZeroDivisionError):
        strategy.run(step)
    with pytest.raises(ZeroDivisionError):
        with strategy.scope():
            raise ZeroDivisionError
    assert flags() == (False, False, False)


def test_state_is_per_thread():
    s = jd.OneDeviceStrategy("/cpu:0")
    seen = []
    with s.scope():
        t = threading.Thread(target=lambda: seen.append(jd.has_strategy()))
        t.start()
        t.join()
        assert jd.has_strategy()
    assert seen == [False]


def test_experimental_set_strategy():
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    try:
        jd.experimental_set_strategy(s)
        assert jd.get_strategy() is s and jd.in_cross_replica_context()
        with s.scope():
            with pytest.raises(RuntimeError, match="must not be called inside"):
                jd.experimental_set_strategy(jd.OneDeviceStrategy("/cpu:0"))
        jd.experimental_set_strategy(s)  # replacing the set strategy is fine
        assert jd.get_strategy() is s
    finally:
        jd.experimental_set_strategy(None)
    assert not jd.has_strategy()
    with pytest.raises(TypeError, match="Strategy or None"):
        jd.experimental_set_strategy("mirrored")


def test_replica_context_properties(strategy):
    n = strategy.num_replicas_in_sync
    seen = {}

    def step():
        ctx = jd.get_replica_context()
        seen.update(n=ctx.num_replicas_in_sync, s=ctx.strategy, d=ctx.devices)
        return ctx.replica_id_in_sync_group

    strategy.run(step)
    assert seen["n"] == n and seen["s"] is strategy
    assert seen["d"] == strategy.extended.worker_devices


def test_merge_call_unpacks_per_replica_results(strategy):
    n = strategy.num_replicas_in_sync

    def step():
        ctx = jd.get_replica_context()
        rid = jnp.float32(ctx.replica_id_in_sync_group)
        own, total, k = ctx.merge_call(
            lambda s, v, k=0: (v, s.extended.reduce_to("SUM", v, v), k),
            args=(rid,),
            kwargs={"k": 5},
        )
        return own, total, k

    own, total, k = strategy.run(step)
    assert [float(x) for x in strategy.experimental_local_results(own)] == list(
        map(float, range(n))
    )
    assert [float(x) for x in strategy.experimental_local_results(total)] == [n * (n - 1) / 2] * n
    assert k == 5  # a Python value from merge_fn is one value, as in TF


def test_merge_call_bad_arguments():
    ctx = jd.get_replica_context()
    with pytest.raises(TypeError, match="merge_fn must be callable"):
        ctx.merge_call(3)
    with pytest.raises(TypeError, match="args must be a tuple or list"):
        ctx.merge_call(lambda s: s, args=3)


def test_all_gather(strategy):
    n = strategy.num_replicas_in_sync

    def step():
        r = jnp.float32(jd.get_replica_context().replica_id_in_sync_group)
        m = jnp.stack([r, r + 10.0])
        ctx = jd.get_replica_context()
        return ctx.all_gather(m, axis=0), ctx.all_gather(m[None, :], axis=1)

    a0, a1 = strategy.run(step)
    expected = np.concatenate([[r, r + 10.0] for r in range(n)])
    for x in strategy.experimental_local_results(a0):
        np.testing.assert_allclose(x, expected)
    for x in strategy.experimental_local_results(a1):
        np.testing.assert_allclose(x, expected[None, :])


@pytest.mark.parametrize("ragged", [False, True])
def test_merge_call_results_are_one_value_like_tf(ragged):
    """TF hands every replica the same merge_call result: returned as is, run gives one value."""
    s = jd.MirroredStrategy([f"/cpu:{i}" for i in range(4)])
    sizes = [2, 2, 1, 0] if ragged else [2, 2, 2, 2]
    x = jd.PerReplica(tuple(jnp.ones(k) * r for r, k in enumerate(sizes)))

    def step(v):
        ctx = jd.get_replica_context()
        total = ctx.merge_call(lambda st, a: st.reduce("SUM", a, axis=0), args=(v,))
        own = ctx.merge_call(lambda st, a: a, args=(jnp.sum(v),))
        return total, total + 0.0, own, 3

    total, plus, own, three = s.run(step, args=(x,))
    expected = sum(r * k for r, k in enumerate(sizes))
    assert not isinstance(total, jd.DistributedValues) and float(total) == expected
    assert type(plus) is jd.PerReplica and [float(p) for p in plus.values] == [expected] * 4
    assert type(own) is jd.PerReplica
    assert [float(o) for o in own.values] == [r * k for r, k in enumerate(sizes)]
    assert three == 3
