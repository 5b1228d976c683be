"""Partial batches: replicas traced on their true slices, grouped by shape, with TF's answers.

Same-shaped replicas are traced once per group and run side by side, exchanging values at
each collective; the results are the same eagerly and inside `jax.jit`.
"""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdist as jd
from jaxdist._program.compile import QUICK_CPU, quick_options

ANSWERS = json.loads((pathlib.Path(__file__).parents[1] / "tf_oracle" / "answers.json").read_text())

PARTIAL = [2, 4, 8]


def partial_batch(s, rows=None):
    n = s.num_replicas_in_sync
    rows = rows or 2 * n - 1  # [2, 2, ..., 1]
    data = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
    return data, next(iter(s.experimental_distribute_dataset([data])))


def step(x):
    ctx = jd.get_replica_context()
    total = ctx.all_reduce("SUM", jnp.sum(x))
    count = ctx.all_reduce("SUM", jnp.float32(x.shape[0]))
    gathered = ctx.all_gather(x, axis=0)
    merged = ctx.merge_call(lambda s, v: s.reduce("MEAN", v, axis=0), args=(x,))
    return {
        "mean": total / count,
        "gathered": gathered,
        "merged": merged,
        "id": ctx.replica_id_in_sync_group,
        "rows": x.shape[0],
        "scaled": x * 2.0,
        "const": 7,
    }


def local(s, v):
    return [np.asarray(x).tolist() for x in s.experimental_local_results(v)]


@pytest.mark.parametrize("n", PARTIAL)
@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])
def test_partial_batch_collectives(n, jitted):
    s = jd.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
    data, x = partial_batch(s)
    run = jax.jit(lambda x: s.run(step, args=(x,))) if jitted else lambda x: s.run(step, args=(x,))
    out = run(x)
    rows = [len(p) for p in s.experimental_local_results(x)]
    assert rows == [2] * (n - 1) + [1]
    assert local(s, out["mean"]) == pytest.approx([float(data.sum()) / len(data)] * n)
    assert local(s, out["gathered"]) == [data.tolist()] * n
    assert np.asarray(out["merged"]).tolist() == pytest.approx(data.mean(axis=0).tolist())
    assert not isinstance(out["merged"], jd.DistributedValues)  # a merge result: one value
    assert local(s, out["id"]) == list(range(n))
    assert local(s, out["rows"]) == rows
    np.testing.assert_array_equal(np.concatenate(local(s, out["scaled"])), data * 2.0)
    assert out["const"] == 7


@pytest.mark.parametrize("n", PARTIAL)
def test_partial_batch_reduce_matches_tf_rules(n):
    s = jd.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
    data, x = partial_batch(s)
    for reduce in (s.reduce, jax.jit(s.reduce, static_argnums=(0, 2))):
        assert float(reduce("MEAN", x, 0)[0]) == pytest.approx(float(data[:, 0].mean()))
        assert float(reduce("SUM", x, 0)[1]) == pytest.approx(float(data[:, 1].sum()))
    assert s.gather(x, axis=0).tolist() == data.tolist()


def test_a_partial_batch_is_one_padded_array():
    s = jd.MirroredStrategy([f"/cpu:{i}" for i in range(4)])
    _, x = partial_batch(s, rows=6)  # TF: [2, 2, 2, 0]
    (stacked,) = jax.tree.leaves(x)
    assert stacked.shape == (4, 2, 3) and stacked.sharding == s.extended.replicas.sharding
    assert [len(v) for v in x.values] == [2, 2, 2, 0]
    assert jax.tree.structure(x) != jax.tree.structure(partial_batch(s, rows=7)[1])


def test_mismatched_collectives_are_a_clear_error():
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    _, x = partial_batch(s)

    def uneven(x):
        if x.shape[0] == 2:
            jd.get_replica_context().all_reduce("SUM", x)
        return x

    with pytest.raises(RuntimeError, match="same collectives in the same order"):
        s.run(uneven, args=(x,))


@pytest.mark.parametrize("n", PARTIAL)
def test_a_jitted_partial_batch_moves_whole_inputs_not_slices(n):
    """Inside jax.jit the inputs are gathered whole (one all-gather per dtype for the
    batches and one for the rest: each collective is a rendezvous of every device) and
    the outputs split over the replicas again; the compiler is not left to move slices
    around (that was hundreds of collective permutes and all-to-alls, 40x slower)."""
    s = jd.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
    data, x = partial_batch(s)
    w = s.experimental_distribute_values_from_function(lambda c: jnp.ones((3, 3)))
    f = jax.jit(lambda w, x: s.run(lambda w, x: jnp.tanh(x @ w) + step(x)["mean"], args=(w, x)))
    hlo = f.lower(w, x).compile().as_text()
    assert "collective-permute" not in hlo and "all-to-all" not in hlo
    assert hlo.count("all-gather-start") + hlo.count("all-gather(") == 2  # w; x
    out = f(w, x)
    (stacked,) = jax.tree.leaves(out)
    assert stacked.sharding.is_equivalent_to(s.extended.replicas.sharding, stacked.ndim)
    want = np.tanh(data @ np.ones((3, 3))) + data.sum() / len(data)
    np.testing.assert_allclose(np.concatenate(local(s, out)), want, rtol=1e-6)


@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])
def test_values_differing_in_a_non_batch_axis_go_into_jax_jit(jitted):
    """TF: a dataset function giving (2, 2) on one replica and (2, 3) on the other, each
    replica's mean in a jitted function that calls run: [1.5, 2.0]. Such a value is one
    array padded in every axis (a jax.jit argument), each replica's shape as metadata."""
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    options = jd.InputOptions(experimental_replication_mode=jd.InputReplicationMode.PER_REPLICA)

    def dataset_fn(ctx):
        k = 2 + ctx.input_pipeline_id
        return [np.tile(np.arange(1, k + 1, dtype=np.float32), (2, 1))]

    x = next(iter(s.distribute_datasets_from_function(dataset_fn, options)))
    assert [v.shape for v in x.values] == [(2, 2), (2, 3)]
    assert [v.devices() for v in x.values] == [{d} for d in jax.devices()[:2]]
    assert len(jax.tree.leaves(x)) == 1
    run = (
        jax.jit(lambda x: s.run(jnp.mean, args=(x,)))
        if jitted
        else (lambda x: s.run(jnp.mean, args=(x,)))
    )
    tf = ANSWERS["ragged.dataset_fn_non_batch_shapes_tf_function_2r"]["result"]["values"]
    assert local(s, run(x)) == [1.5, 2.0] == [float(v["value"]) for v in tf]

    def grad_step(x):  # TF's rule on these shapes too: 2 replicas times each replica's mean
        reduce = lambda v: jd.get_replica_context().all_reduce("SUM", v)  # noqa: E731
        return jax.grad(lambda w: reduce(jnp.mean(x * w)))(jnp.float32(1.0))

    grad = (
        jax.jit(lambda x: s.run(grad_step, args=(x,)))
        if jitted
        else (lambda x: s.run(grad_step, args=(x,)))
    )
    assert local(s, grad(x)) == [3.0, 4.0]
    made = s.experimental_distribute_values_from_function(
        lambda ctx: jnp.ones((2, 2 + ctx.replica_id_in_sync_group))
    )
    assert local(s, run(made)) == [1.0, 1.0]
    assert [v.shape for v in made.values] == [(2, 2), (2, 3)]


@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])
def test_a_merge_fn_result_shaped_by_every_replica(jitted):
    """merge_fn may return what depends on every replica's shape (a gather of a partial
    batch); the step is traced again with the shapes it returned."""
    s = jd.MirroredStrategy([f"/cpu:{i}" for i in range(4)])
    data = np.arange(7, dtype=np.float32)
    x = next(iter(s.experimental_distribute_dataset([data])))

    def step(x):
        merge = lambda st, v: st.gather(v, axis=0)  # noqa: E731
        return jd.get_replica_context().merge_call(merge, args=(x,)) * 2.0

    run = (
        jax.jit(lambda x: s.run(step, args=(x,))) if jitted else (lambda x: s.run(step, args=(x,)))
    )
    assert local(s, run(x)) == [(data * 2).tolist()] * 4


def test_a_partial_batch_step_is_traced_once_per_shape_of_replica():
    """Replicas of one shape are traced together, whatever the number of collectives (the
    replay traced a step once per collective more), and compiled once per pattern."""
    s = jd.MirroredStrategy([f"/cpu:{i}" for i in range(4)])
    _, x = partial_batch(s)  # [2, 2, 2, 1]
    calls = []

    def traced(x):
        calls.append(x.shape)
        ctx = jd.get_replica_context()
        for _ in range(5):
            x = x + ctx.all_reduce("SUM", jnp.sum(x))
        return x

    s.run(traced, args=(x,))
    assert sorted(calls) == [(1, 3), (2, 3)]
    s.run(traced, args=(x,))
    assert len(calls) == 2  # compiled once for this pattern of replica shapes


def test_the_eager_partial_batch_program_compiles_with_quick_options(monkeypatch):
    """Eagerly, a partial batch's program is compiled with XLA's quick CPU options (it
    runs once per epoch: compile time matters more than run time), with the answers of
    the default options; an option this jaxlib rejects is left out, the others kept."""
    s = jd.MirroredStrategy([f"/cpu:{i}" for i in range(4)])
    # every supported jaxlib has the LLVM level; jaxlib 0.11 dropped the fusion-emitter switch
    expected = {"xla_backend_optimization_level": 1}
    if tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 11):
        expected["xla_cpu_use_fusion_emitters"] = False
    assert quick_options(s.extended.replicas) == expected and set(expected) <= set(QUICK_CPU)
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.normal(size=(3, 16)), jnp.float32)
    _, x = partial_batch(s)  # [2, 2, 2, 1]

    def grad_step(x):
        loss = lambda w: jnp.sum(jnp.tanh(x @ w) ** 2)  # noqa: E731
        return jd.get_replica_context().all_reduce("SUM", jax.grad(loss)(w))

    eager = s.run(grad_step, args=(x,))
    default = jax.jit(lambda x: s.run(grad_step, args=(x,)))(x)  # the user's jit: no options
    for a, b in zip(local(s, eager), local(s, default)):  # (the suite's own level is -O0:
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)  # float32 sums in another order)
    monkeypatch.setattr(
        "jaxdist._program.compile.QUICK_CPU",
        {"xla_no_such_option": True, "xla_backend_optimization_level": 2},
    )
    assert quick_options(s.extended.replicas) == {"xla_backend_optimization_level": 2}
    again = s.run(lambda x: grad_step(x) * 1.0, args=(x,))
    for a, b in zip(local(s, again), local(s, default)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)


def test_a_first_jitted_partial_batch_traces_each_shape_once_and_compiles_once():
    """Issue 38: inside the user's `jax.jit`, the first partial batch traces the step once
    per shape of replica ([5] * 7 + [2]: two) and XLA compiles one program, as for the
    full batch (one trace, one program): no trace or compile is repeated."""
    s = jd.MirroredStrategy([f"/cpu:{i}" for i in range(8)])
    w = jnp.ones((3, 4)) * 0.1
    full = np.arange(64 * 3, dtype=np.float32).reshape(64, 3)
    batches = list(s.experimental_distribute_dataset([full, full[:37]]))
    compiles, calls = [], []
    listening = [True]

    def listen(event, duration, **_):
        if listening[0] and event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        for batch, traces in ((batches[0], 1), (batches[1], 2)):

            def grad_step(w, x):
                calls.append(x.shape)
                loss = lambda w: jnp.sum(jnp.tanh(x @ w) ** 2)  # noqa: E731
                return jd.get_replica_context().all_reduce("SUM", jax.grad(loss)(w))

            compiles.clear(), calls.clear()
            jax.block_until_ready(jax.jit(lambda w, x: s.run(grad_step, args=(w, x)))(w, batch))
            assert len(calls) == traces, calls
            assert len(compiles) == 1, compiles
    finally:
        listening[0] = False
