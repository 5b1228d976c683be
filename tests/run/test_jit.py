"""Strategy calls inside `jax.jit` and `lax` loops: jaxdist's `tf.function`.

Every call gives the same answer traced as eagerly, on 1, 2, 4 and 8 replicas, and that
answer is checked against an independent one (a replica-count formula or NumPy), so a bug
shared by both paths fails too.
"""

import functools
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxdist as jd

# steps close over constants they never change under jax.jit: the frozen-state warning is true and not what these tests check
pytestmark = [
    pytest.mark.filterwarnings(
        "ignore:strategy.run\\(.*\\) is traced inside your own jax.jit:RuntimeWarning"
    ),
]


ANSWERS = json.loads((pathlib.Path(__file__).parents[1] / "tf_oracle" / "answers.json").read_text())


def ids(s, shape=(2,)):
    return s.experimental_distribute_values_from_function(
        lambda c: jnp.full(shape, c.replica_id_in_sync_group, jnp.float32)
    )


def local(s, x):
    return [np.asarray(v).tolist() for v in s.experimental_local_results(x)]


def local_trees(s, x):
    return [
        jax.tree.map(lambda a: np.asarray(a).tolist(), v) for v in s.experimental_local_results(x)
    ]


def same(a, b):
    """Equal values, and the same kind of distributed value (or plain array)."""
    la, lb = (
        jax.tree.leaves(a, is_leaf=jd.DistributedValues.__instancecheck__),
        jax.tree.leaves(b, is_leaf=jd.DistributedValues.__instancecheck__),
    )
    assert [type(x) for x in la] == [type(x) for x in lb]
    for x, y in zip(la, lb):
        xs = x.values if isinstance(x, jd.DistributedValues) else [x]
        ys = y.values if isinstance(y, jd.DistributedValues) else [y]
        np.testing.assert_allclose(np.asarray(xs), np.asarray(ys), rtol=1e-6)


def both(fn, *args):
    """``fn(*args)`` eagerly and under `jax.jit`; checks they agree; returns the jitted one."""
    eager = fn(*args)
    traced = jax.jit(fn)(*args)
    same(eager, traced)
    return traced


# -- every strategy call, traced --------------------------------------------------------


def test_run_reduce_gather_local_results(strategy):
    n = strategy.num_replicas_in_sync
    v = ids(strategy)

    def step(x):
        ctx = jd.get_replica_context()
        return {"sum": ctx.all_reduce("SUM", x), "x2": 2 * x, "id": ctx.replica_id_in_sync_group}

    out = both(lambda v: strategy.run(step, args=(v,)), v)
    total = n * (n - 1) / 2  # replica r holds r: 0 + 1 + ... + (n - 1)
    assert local(strategy, out["sum"]) == [[total] * 2] * n
    assert local(strategy, out["x2"]) == [[2.0 * r] * 2 for r in range(n)]
    assert local(strategy, out["id"]) == list(range(n))
    assert both(lambda v: strategy.reduce("SUM", v, axis=None), v).tolist() == [total] * 2
    assert float(both(lambda v: strategy.reduce("MEAN", v, axis=0), v)) == (n - 1) / 2
    gathered = both(lambda v: strategy.gather(v, axis=0), v)
    assert gathered.tolist() == [float(r) for r in range(n) for _ in range(2)]
    results = both(lambda v: strategy.experimental_local_results(v), v)
    assert [x.tolist() for x in results] == [[float(r)] * 2 for r in range(n)]
    if n > 1:  # one replica's values are plain arrays (see test_run.py's one-replica tests)
        assert both(lambda v: v.values, v)[n - 1].tolist() == [n - 1] * 2


def test_values_from_function_and_extended_api(strategy):
    n = strategy.num_replicas_in_sync
    v, total = ids(strategy), n * (n - 1) / 2
    ones = both(
        lambda: strategy.experimental_distribute_values_from_function(lambda c: jnp.ones(3))
    )
    assert local(strategy, ones) == [[1.0] * 3] * n
    assert (
        local(strategy, both(lambda v: strategy.extended.reduce_to("SUM", v, v), v))
        == [[total] * 2] * n
    )
    mean = both(lambda v: strategy.extended.reduce_to("MEAN", v, "/cpu:0"), v)
    assert mean.tolist() == [(n - 1) / 2] * 2
    pairs = both(lambda v: strategy.extended.batch_reduce_to("SUM", [(v, v), (v, v)]), v)
    assert [local(strategy, x) for x in pairs] == [[[total] * 2] * n] * 2
    out = both(lambda: strategy.extended.broadcast_to({"w": jnp.ones(2)}))
    assert [x["w"] for x in local_trees(strategy, out)] == [[1.0, 1.0]] * n


@pytest.mark.parametrize(
    "cdo",
    [jd.ReductionToOneDevice(), jd.NcclAllReduce(num_packs=2), jd.HierarchicalCopyAllReduce()],
    ids=["r1d", "nccl", "hierarchical"],
)
def test_cross_device_ops_methods(strategy, cdo):
    n = strategy.num_replicas_in_sync
    v, total = ids(strategy), n * (n - 1) / 2
    assert (
        local(strategy, both(lambda v: cdo.reduce(jd.ReduceOp.SUM, v, v), v)) == [[total] * 2] * n
    )
    assert (
        both(lambda v: cdo.reduce(jd.ReduceOp.MEAN, v, "/cpu:0"), v).tolist() == [(n - 1) / 2] * 2
    )
    pairs = both(lambda v: cdo.batch_reduce(jd.ReduceOp.SUM, [(v, v), (2 * jnp.ones(()), v)]), v)
    # a plain value is one value, not one per replica: its SUM is itself (TF:
    # nondist.batch_reduce_to_sum_const), put on every destination device
    assert [local(strategy, x) for x in pairs] == [[[total] * 2] * n, [2.0] * n]
    out = both(lambda v: cdo.broadcast(jnp.arange(3.0), v), v)
    assert local(strategy, out) == [[0.0, 1.0, 2.0]] * n


def test_user_built_distributed_values(strategy):
    n = strategy.num_replicas_in_sync

    def build(x):
        pr = jd.PerReplica(tuple(x + i for i in range(n)))
        m = jd.Mirrored(tuple(x for _ in range(n)))
        return (
            strategy.reduce("SUM", pr, axis=None),
            strategy.reduce("MEAN", m, axis=None),
            pr.values,
        )

    total, mean, values = both(build, jnp.float32(1.0))
    assert float(total) == sum(1.0 + i for i in range(n)) and float(mean) == 1.0
    assert [float(x) for x in values] == [1.0 + i for i in range(n)]
    out = both(lambda x: strategy.run(lambda a: a * 2, args=(jd.PerReplica((x,) * n),)), 1.0)
    assert local(strategy, out) == [2.0] * n


def test_replica_context_methods(strategy):
    n = strategy.num_replicas_in_sync
    v = ids(strategy, (1,))

    def step(x):
        ctx = jd.get_replica_context()
        merged = ctx.merge_call(lambda s, y: s.reduce("SUM", y, axis=None), args=(x,))
        return ctx.all_gather(x, axis=0), ctx.all_reduce("MEAN", x), merged

    gathered, mean, merged = both(lambda v: strategy.run(step, args=(v,)), v)
    assert local(strategy, gathered) == [[float(i) for i in range(n)]] * n
    assert local(strategy, mean) == [[(n - 1) / 2]] * n
    assert np.asarray(merged).tolist() == [n * (n - 1) / 2]


def test_a_jitted_function_as_the_replica_function(strategy):
    n = strategy.num_replicas_in_sync

    @jax.jit
    def step(x):
        return jd.get_replica_context().all_reduce("SUM", x * 2)

    out = both(lambda v: strategy.run(step, args=(v,)), ids(strategy))
    assert local(strategy, out) == [[n * (n - 1.0)] * 2] * n


@pytest.mark.parametrize("loop", ["fori_loop", "scan", "while_loop", "cond"])
def test_strategy_calls_inside_lax_bodies(strategy, loop):
    n = strategy.num_replicas_in_sync
    v = ids(strategy)

    def body(x):
        y = strategy.run(lambda a: jd.get_replica_context().all_reduce("MEAN", a) + 1.0, args=(x,))
        return y, strategy.reduce("SUM", y, axis=None)

    def looped(v):
        if loop == "fori_loop":
            return lax.fori_loop(0, 3, lambda i, c: body(c[0]), body(v))
        if loop == "scan":
            return lax.scan(lambda c, _: (body(c[0]), None), body(v), length=3)[0]
        if loop == "while_loop":
            step = lambda c: (*body(c[0]), c[2] + 1)  # noqa: E731
            return lax.while_loop(lambda c: c[2] < 3, step, (*body(v), 0))[:2]
        return lax.cond(True, body, lambda x: jax.tree.map(jnp.zeros_like, body(x)), v)

    out, total = (jax.jit(looped) if loop != "while_loop" else looped)(v)
    mean = (n - 1) / 2 + (3.0 if loop in ("fori_loop", "scan", "while_loop") else 0.0) + 1.0
    assert local(strategy, out) == [[mean] * 2] * n
    assert total.tolist() == [mean * n] * 2


# -- one executable per jitted train step -------------------------------------------------


def mlp_setup(s, batch=4):
    r = s.num_replicas_in_sync
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(8, 3)), jnp.float32), "b": jnp.zeros(3)}
    data = rng.normal(size=(r * batch, 8)).astype(np.float32)
    x = next(iter(s.experimental_distribute_dataset([data])))
    return params, x, r * batch


def mlp_numpy(r, steps, batch=4):
    """`mlp_setup`'s model trained by `train_step_fn`'s rule in NumPy (float64): the parameters
    after ``steps`` steps and the loss the last step computed (before its update)."""
    rng = np.random.default_rng(0)
    w, b = rng.normal(size=(8, 3)), np.zeros(3)
    data = rng.normal(size=(r * batch, 8)).astype(np.float32).astype(np.float64)
    for _ in range(steps):
        t = np.tanh(data @ w + b)
        loss = np.sum((t - 0.5) ** 2) / (r * batch)
        d = 2 * (t - 0.5) * (1 - t**2) / (r * batch)
        w, b = w - 0.1 * data.T @ d, b - 0.1 * d.sum(0)
    return {"w": w, "b": b}, loss


def train_step_fn(s, global_batch):
    def replica_step(p, x):
        def loss_fn(p):
            return jnp.sum((jnp.tanh(x @ p["w"] + p["b"]) - 0.5) ** 2) / global_batch

        loss, g = jax.value_and_grad(loss_fn)(p)
        g = jd.get_replica_context().all_reduce("SUM", g)
        return jax.tree.map(lambda a, b: a - 0.1 * b, p, g), loss

    def train_step(p, x):
        p, loss = s.run(replica_step, args=(p, x))
        return p, s.reduce("SUM", loss, axis=None)

    return train_step, replica_step


def distributed(s, params):
    """The initial state in the form `run` returns it (so that a jitted step sees one signature)."""
    if s.num_replicas_in_sync == 1:
        return jax.device_put(params, s.extended.replicas.first_device)
    return s.experimental_distribute_values_from_function(lambda ctx: params)


def test_jitted_train_step_compiles_once_and_matches_eager(strategy):
    params, x, gb = mlp_setup(strategy)
    train_step, replica_step = train_step_fn(strategy, gb)
    traces = []
    jitted = jax.jit(lambda p, x: (traces.append(1), train_step(p, x))[1])
    p_eager, p_jit = params, distributed(strategy, params)
    for _ in range(1000):
        p_jit, loss_jit = jitted(p_jit, x)
    for _ in range(3):
        p_eager, loss_eager = train_step(p_eager, x)
    assert len(traces) == 1
    p3 = params
    for _ in range(3):
        p3, _ = jitted(p3, x)
    same(p3, p_eager)
    n, leaf = strategy.num_replicas_in_sync, jax.tree.leaves(p_jit)[0]
    assert leaf.shape == ((n,) if n > 1 else ()) + jax.tree.leaves(params)[0].shape
    want, want_loss = mlp_numpy(n, 1000)  # the 1,000 jitted steps, independently
    for copy in strategy.experimental_local_results(p_jit):
        for k in ("w", "b"):
            np.testing.assert_allclose(np.asarray(copy[k]), want[k], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(float(loss_jit), want_loss, rtol=1e-4, atol=1e-6)


def test_donating_the_distributed_state(strategy):
    params, x, gb = mlp_setup(strategy)
    train_step, _ = train_step_fn(strategy, gb)
    p, _ = train_step(params, x)  # per-replica parameters (PerReplica with 2+ replicas)
    donated = jax.jit(train_step, donate_argnums=0)
    reference, _ = train_step(p, x)
    old = jax.tree.leaves(p)
    p2, _ = donated(p, x)
    same(p2, reference)
    if strategy.num_replicas_in_sync > 1:
        assert all(a.is_deleted() for a in old)


@pytest.mark.parametrize("how", ["fori_loop", "scan", "unrolled"])
def test_several_steps_in_one_executable(strategy, how):
    params, x, gb = mlp_setup(strategy)
    train_step, _ = train_step_fn(strategy, gb)
    p_sep = params
    for _ in range(5):
        p_sep, _ = jax.jit(train_step)(p_sep, x)

    def many(p, x):
        if how == "fori_loop":
            return lax.fori_loop(0, 5, lambda i, p: train_step(p, x)[0], p)
        if how == "scan":
            return lax.scan(lambda p, _: (train_step(p, x)[0], None), p, length=5)[0]
        for _ in range(5):
            p, _ = train_step(p, x)
        return p

    p_many = jax.jit(many)(distributed(strategy, params), x)  # a loop carry keeps its form
    for a, b in zip(jax.tree.leaves(p_many), jax.tree.leaves(p_sep)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


# -- nothing of a trace is kept ---------------------------------------------------------------


def test_eager_jitted_and_failing_calls_in_any_order(strategy):
    v = ids(strategy)

    def step(x):
        return jd.get_replica_context().all_reduce("SUM", x) * 2

    eager = lambda: strategy.run(step, args=(v,))  # noqa: E731
    jitted = jax.jit(lambda v: strategy.run(step, args=(v,)))

    def failing(v):
        strategy.run(step, args=(v,))
        raise KeyError("boom")

    n = strategy.num_replicas_in_sync
    expected = local(strategy, eager())
    assert expected == [[n * (n - 1.0)] * 2] * n  # twice 0 + 1 + ... + (n - 1)
    for call in ["jit", "fail", "eager", "fail", "jit", "eager", "closure"]:
        if call == "fail":
            with pytest.raises(KeyError):
                jax.jit(failing)(v)
        elif call == "closure":  # a step closing over a tracer of the outer function
            out = jax.jit(lambda v, k: strategy.run(lambda x: step(x) * k, args=(v,)))(v, 1.0)
            assert local(strategy, out) == expected
        else:
            assert local(strategy, eager() if call == "eager" else jitted(v)) == expected


def test_python_numbers_are_traced_one_compile_for_5000_values():
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    traces = []

    def step(w, count):
        traces.append(1)
        return w + count

    w = jnp.zeros(())
    for count in range(5000):
        out = s.run(step, args=(w, count))
    assert len(traces) == 1 and [float(x) for x in out.values] == [4999.0] * 2
    static = functools.partial(step, count=7)  # the documented way to make a number static
    assert [float(x) for x in s.run(static, args=(w,)).values] == [7.0] * 2


# -- partial batches inside jit -------------------------------------------------------------


def test_partial_batch_inside_jit_gives_tfs_answer(strategy):
    n = strategy.num_replicas_in_sync
    if n == 1:
        pytest.skip("one replica has no partial batch")
    data = np.arange(2 * n - 1, dtype=np.float32)  # [2, 2, ..., 1] rows per replica
    split = [data[2 * r : 2 * r + 2].tolist() for r in range(n)]
    if n == 4:  # TF's split, recorded on 4 replicas: Dataset.range(7).batch(7)
        tf_split = ANSWERS["dataset.split_n7_b7"]["result"][0]["values"]
        assert split == [v["value"] for v in tf_split]
    x = next(iter(strategy.experimental_distribute_dataset([data])))
    assert local(strategy, x) == split
    traces = []

    def step(x):
        traces.append(x.shape)
        ctx = jd.get_replica_context()
        return jnp.sum(x), ctx.all_reduce("SUM", jnp.sum(x)), x.shape[0]

    eager = strategy.run(step, args=(x,))
    jitted = jax.jit(lambda x: strategy.run(step, args=(x,)))
    traced = jitted(x)
    traced_again = jitted(x)  # compiled once per pattern of replica shapes
    for out in (eager, traced, traced_again):
        sums, total, rows = out
        assert local(strategy, total) == [float(data.sum())] * n
        assert local(strategy, sums) == [sum(part) for part in split]
        assert local(strategy, rows) == [len(part) for part in split]
    # MEAN along the batch divides by the true count (TF: reduce.ragged_mean_axis0)
    mean = jax.jit(lambda x: strategy.reduce("MEAN", x, axis=0))(x)
    assert float(mean) == pytest.approx(float(data.mean()))
    n_traces = len(traces)
    jitted(x)
    assert len(traces) == n_traces


# -- bounded and clear ------------------------------------------------------------------------


def test_ten_thousand_unblocked_jitted_steps_with_collectives():
    s = jd.MirroredStrategy([f"/cpu:{i}" for i in range(8)])

    @jax.jit
    def step(w):
        w = s.run(lambda w: jd.get_replica_context().all_reduce("MEAN", w) + 1.0, args=(w,))
        return w, s.reduce("SUM", w, axis=None)

    w = s.experimental_distribute_values_from_function(lambda c: jnp.zeros(4))
    for _ in range(10_000):
        w, total = step(w)
        other = jnp.sum(jax.tree.leaves(w)[0])  # another collective program, interleaved
    assert float(total[0]) == 8 * 10_000.0 and float(other) == 32 * 10_000.0


def test_misuse_errors_are_the_same_under_jit():
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    other = jd.MirroredStrategy(["/cpu:2", "/cpu:3"])
    v = ids(s)
    cases = [
        (lambda v: s.run(lambda x: s.reduce("SUM", x, axis=None), args=(v,)), "cross-replica"),
        (lambda v: s.run(lambda x: s.run(lambda y: y, args=(x,)), args=(v,)), "inside another run"),
    ]
    for fn, match in cases:
        with pytest.raises(RuntimeError, match=match):
            fn(v)
        with pytest.raises(RuntimeError, match=match):
            jax.jit(fn)(v)

    def mixing(v):
        with other.scope():
            return s.reduce("SUM", v, axis=None)

    for call in (mixing, jax.jit(mixing)):
        with pytest.raises(RuntimeError, match="Mixing different"):
            call(v)
