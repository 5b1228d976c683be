"""Collectives inside JAX transformations in partial-batch steps, with TF's answers.

TF's rule: the gradient of an all-reduce is the all-reduce of the cotangents over every
replica (empty ones included), so on a partial batch ``[1, 1, 0, 0]`` the gradient of
``all_reduce(SUM, sum(x * w))`` is ``[4, 4, 0, 0]`` (a full batch: ``[4, 4, 4, 4]``).
Expected values come from the replica count and NumPy on one device.
"""

import functools
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import require
from jax import lax

import jaxdist as jd

# jitted steps close over constants they never change: the frozen-state warning is true and not what these tests check
pytestmark = [
    pytest.mark.filterwarnings(
        "ignore:strategy.run\\(.*\\) is traced inside your own jax.jit:RuntimeWarning"
    ),
]


PARTIAL = [2, 4, 8]
MODES = pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])


def strategy(n):
    return jd.MirroredStrategy([f"/cpu:{i}" for i in range(n)])


def batch(s, data):
    return next(iter(s.experimental_distribute_dataset([np.asarray(data, np.float32)])))


def run(s, fn, *args, jitted=False):
    call = (lambda *a: s.run(fn, args=a)) if not jitted else jax.jit(lambda *a: s.run(fn, args=a))
    out = s.experimental_local_results(call(*args))
    return [jax.tree.map(lambda a: np.asarray(a).tolist(), v) for v in out]


def reduce_sum(x, w):
    return jd.get_replica_context().all_reduce("SUM", jnp.sum(x * w))


ONE = jnp.float32(1.0)


# -- the reproduction and the other differentiation entry points ------------------


@MODES
def test_grad_of_all_reduce_is_tf_on_a_partial_batch(jitted):
    s = strategy(4)
    x = batch(s, np.ones((2, 1)))  # [1, 1, 0, 0]
    step = lambda x: jax.grad(lambda w: reduce_sum(x, w))(ONE)  # noqa: E731
    assert run(s, step, x, jitted=jitted) == [4.0, 4.0, 0.0, 0.0]  # TF
    assert run(s, step, batch(s, np.ones((4, 1))), jitted=jitted) == [4.0] * 4  # full


@MODES
def test_value_and_grad_vjp_jvp(jitted):
    s = strategy(4)
    x = batch(s, [[1.0], [2.0]])  # replicas: [1], [2], [], []

    def step(x):
        value, grad = jax.value_and_grad(lambda w: reduce_sum(x, w))(ONE)
        out, pull = jax.vjp(lambda w: reduce_sum(x, w), ONE)
        (pulled,) = pull(jnp.float32(1.0))
        primal, tangent = jax.jvp(lambda w: reduce_sum(x, w), (ONE,), (jnp.float32(1.0),))
        return value, grad, out, pulled, primal, tangent

    value, grad, out, pulled, primal, tangent = zip(*run(s, step, x, jitted=jitted))
    assert list(value) == list(out) == list(primal) == [3.0] * 4
    assert list(grad) == list(pulled) == [4.0, 8.0, 0.0, 0.0]
    assert list(tangent) == [3.0] * 4  # the all-reduce of the tangents


@MODES
@pytest.mark.parametrize("n", PARTIAL)
def test_grad_of_all_gather_slices_the_all_reduced_cotangent(n, jitted):
    """TF: the gradient of all_gather is the all-reduce (SUM) of the cotangents, sliced to
    the replica's own rows (here rows of different lengths)."""
    s = strategy(n)
    data = np.arange(1, n + 2, dtype=np.float32)[:, None]  # n + 1 rows: [2, 1], [2, 2, 1, 0]
    x = batch(s, data)
    rows = [len(v) for v in s.experimental_local_results(x)]
    coef = np.arange(1, n + 2, dtype=np.float32)[:, None]

    def step(x):
        def f(w):
            gathered = jd.get_replica_context().all_gather(x * w, axis=0)
            return jnp.sum(gathered * coef)

        return jax.grad(f)(ONE)

    got = run(s, step, x, jitted=jitted)
    starts = np.cumsum([0] + rows)
    want = [n * float((data[a:b] * coef[a:b]).sum()) for a, b in zip(starts, starts[1:])]
    assert got == pytest.approx(want)


def test_merge_call_inside_grad_is_a_clear_error():
    s = strategy(2)
    x = batch(s, np.ones((1, 1)))

    def step(x):
        merge = lambda st, v: st.reduce("SUM", v, axis=None)  # noqa: E731
        ctx = jd.get_replica_context()
        return jax.grad(lambda w: ctx.merge_call(merge, args=(jnp.sum(x * w),)))(ONE)

    with pytest.raises(RuntimeError, match="merge_call cannot be called inside jax.grad"):
        s.run(step, args=(x,))


def test_merge_fn_closing_over_a_step_value_is_a_clear_error():
    s = strategy(2)
    x = batch(s, np.ones((3, 1)))

    def step(x):
        local = jnp.sum(x)
        merge = lambda st: local * 2.0  # noqa: E731
        return jd.get_replica_context().merge_call(merge)

    with pytest.raises(RuntimeError, match="through merge_call's args"):
        s.run(step, args=(x,))


def test_a_jitted_replica_fn_gathering_rows_of_different_lengths():
    """A jax.jit inside the step is traced per context (its cache would hold a trace made
    before every replica's length was known)."""
    s = strategy(4)
    data = np.arange(7, dtype=np.float32)  # [2, 2, 2, 1]
    (x,) = s.experimental_distribute_dataset([data])
    gather = jax.jit(lambda v: jd.get_replica_context().all_gather(v, axis=0))
    for _ in range(2):
        assert run(s, gather, x) == [data.tolist()] * 4


# -- raw lax collectives over jd.AXIS --------------------------------------------------------


@MODES
@pytest.mark.parametrize("n", PARTIAL)
def test_raw_lax_collectives_over_the_replica_axis(n, jitted):
    s = strategy(n)
    data = np.arange(2 * n - 1, dtype=np.float32)[:, None]
    x = batch(s, data)

    def step(x):
        total = lax.psum(jnp.sum(x), jd.AXIS)
        mean = lax.pmean(jnp.float32(x.shape[0]), jd.AXIS)
        ids = lax.all_gather(lax.axis_index(jd.AXIS), jd.AXIS)
        top = lax.pmax(jnp.max(x, initial=-1.0), jd.AXIS)
        grad = jax.grad(lambda w: lax.psum(jnp.sum(x * w), jd.AXIS))(ONE)
        return total, mean, ids, top, grad

    total, mean, ids, top, grad = zip(*run(s, step, x, jitted=jitted))
    assert list(total) == [float(data.sum())] * n
    assert list(mean) == pytest.approx([len(data) / n] * n)
    assert list(ids) == [list(range(n))] * n
    assert list(top) == [float(data.max())] * n
    parts = [np.asarray(v) for v in s.experimental_local_results(x)]
    assert list(grad) == pytest.approx([n * float(p.sum()) for p in parts])


def test_raw_all_gather_of_different_shapes_is_a_clear_error():
    s = strategy(2)
    x = batch(s, np.ones((3, 1)))  # [2, 1]
    with pytest.raises(RuntimeError, match="same shape on every replica"):
        s.run(lambda x: lax.all_gather(x, jd.AXIS), args=(x,))
    with pytest.raises(
        ValueError, match=r"replica 0 gave float32\[2, 1\] and replica 1 gave float32\[1, 1\]"
    ):
        s.run(lambda x: lax.psum(x, jd.AXIS), args=(x,))


@MODES
@pytest.mark.parametrize("case", ["values", "partial_batch", "functools_partial"])
def test_all_gather_of_shapes_differing_off_its_axis_is_a_value_error(jitted, case):
    """TF raises InvalidArgumentError; jaxdist a ValueError naming the axis and the shapes,
    eagerly and in jax.jit alike (not lax.all_gather's RuntimeError, a call the user did
    not make)."""
    s = strategy(2)
    if case == "values":  # (2, 3) and (2, 4), gathered along axis 0
        x = s.experimental_distribute_values_from_function(
            lambda c: jnp.ones((2, 3 + c.replica_id_in_sync_group))
        )
        axis, want = (
            0,
            r"replica 0 gave shape \(2, 3\) and replica 1 gave \(2, 4\), which differ in axis 1",
        )
    else:  # a partial batch of 3 rows: (2, 2) and (1, 2), gathered along axis 1
        x = batch(s, np.ones((3, 2), np.float32))
        axis, want = (
            1,
            r"replica 0 gave shape \(2, 2\) and replica 1 gave \(1, 2\), which differ in axis 0",
        )

    def gather(v, axis):
        return jd.get_replica_context().all_gather(v, axis=axis)

    fn = (
        functools.partial(gather, axis=axis)
        if case == "functools_partial"
        else (lambda v: gather(v, axis))
    )
    with pytest.raises(ValueError, match=rf"all_gather\(axis={axis}\).*{want}"):
        run(s, fn, x, jitted=jitted)


# -- a synchronized batch norm inside jax.grad (the DenseNet-style step) ----------------------


def sync_bn_loss(params, x, y, all_reduce, global_batch):
    """A dense layer, a batch norm over the global batch's moments (summed over replicas
    with ``all_reduce``, TF's SyncBatchNormalization), a squared error summed over the
    replica's rows and divided by the global batch size (TF's custom-loop loss)."""
    h = x @ params["w"]
    total = all_reduce(jnp.sum(h, axis=0))
    squares = all_reduce(jnp.sum(h * h, axis=0))
    count = all_reduce(jnp.float32(h.shape[0]))
    mean = total / count
    var = squares / count - mean * mean
    out = (h - mean) * lax.rsqrt(var + 1e-3) * params["scale"] + params["bias"]
    return jnp.sum((out.sum(axis=1) - y) ** 2) / global_batch


def sync_bn_params():
    rng = np.random.default_rng(0)
    return {
        "w": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32),
        "scale": jnp.asarray(rng.uniform(0.5, 1.5, 4), jnp.float32),
        "bias": jnp.asarray(rng.normal(size=4), jnp.float32),
    }


@MODES
@pytest.mark.parametrize("n, rows", [(2, 3), (4, 6), (8, 5)])
def test_sync_batch_norm_gradient_on_a_partial_batch_matches_one_device(n, rows, jitted):
    """Some replicas have fewer rows and some none ([2, 1], [2, 2, 2, 0], [1] * 5 + [0] * 3):
    the summed gradient equals the gradient of one device holding the whole batch."""
    s = strategy(n)
    rng = np.random.default_rng(n)
    data = rng.normal(size=(rows, 3)).astype(np.float32)
    labels = rng.normal(size=rows).astype(np.float32)
    params = sync_bn_params()
    want = jax.grad(sync_bn_loss)(params, data, labels, lambda v: v, rows)
    x, y = next(iter(s.experimental_distribute_dataset([(data, labels)])))

    def step(params, x, y):
        ctx = jd.get_replica_context()
        reduce = lambda v: ctx.all_reduce("SUM", v)  # noqa: E731
        grads = jax.grad(sync_bn_loss)(params, x, y, reduce, rows)
        return ctx.all_reduce("SUM", grads)

    call = jax.jit(lambda *a: s.run(step, args=a)) if jitted else lambda *a: s.run(step, args=a)
    got = call(params, x, y)
    for name in params:
        for replica in s.experimental_local_results(got[name]):
            np.testing.assert_allclose(replica, want[name], rtol=1e-5, atol=1e-5)


@MODES
def test_flax_batch_norm_over_the_replica_axis(jitted):
    """flax's BatchNorm(axis_name=jd.AXIS) in a partial-batch step: its statistics are the
    lax.pmean of each replica's moments (flax's definition), computed here with NumPy."""
    nn = require("flax.linen")
    s = strategy(4)
    data = np.random.default_rng(1).normal(size=(7, 3)).astype(np.float32)  # [2, 2, 2, 1]
    x = batch(s, data)
    bn = nn.BatchNorm(use_running_average=False, axis_name=jd.AXIS, epsilon=1e-3)
    variables = bn.init(jax.random.key(0), data[:2])

    def step(variables, x):
        def loss(v):
            out, _ = bn.apply(v, x, mutable=["batch_stats"])
            return jnp.sum(out * out)

        return bn.apply(variables, x, mutable=["batch_stats"])[0], jax.grad(loss)(variables)

    call = jax.jit(lambda *a: s.run(step, args=a)) if jitted else lambda *a: s.run(step, args=a)
    out, grads = call(variables, x)
    parts = [np.asarray(p) for p in s.experimental_local_results(x)]
    mean = np.mean([p.mean(0) for p in parts], axis=0)
    var = np.mean([(p * p).mean(0) for p in parts], axis=0) - mean * mean
    for got, p in zip(s.experimental_local_results(out), parts):
        np.testing.assert_allclose(got, (p - mean) / np.sqrt(var + 1e-3), rtol=1e-4, atol=1e-5)
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))


# -- the other transformations ----------------------------------------------------------------


@MODES
def test_collectives_under_checkpoint_vmap_jit_and_custom_vjp(jitted):
    s = strategy(4)
    x = batch(s, [[1.0], [2.0]])  # [1], [2], [], []
    ctx = jd.get_replica_context

    @jax.custom_vjp
    def twice(v):
        return 2.0 * ctx().all_reduce("SUM", v)

    twice.defvjp(lambda v: (twice(v), None), lambda _, g: (2.0 * ctx().all_reduce("SUM", g),))

    def step(x):
        checkpointed = jax.grad(jax.checkpoint(lambda w: reduce_sum(x, w)))(ONE)
        nested = jax.grad(jax.jit(lambda w: reduce_sum(x, w)))(ONE)
        custom = jax.grad(lambda w: twice(jnp.sum(x * w)))(ONE)
        mapped = jax.vmap(lambda k: ctx().all_reduce("SUM", k * jnp.sum(x)))(jnp.arange(3.0))
        return checkpointed, nested, custom, mapped

    checkpointed, nested, custom, mapped = zip(*run(s, step, x, jitted=jitted))
    assert list(checkpointed) == list(nested) == [4.0, 8.0, 0.0, 0.0]
    assert list(custom) == [8.0, 16.0, 0.0, 0.0]  # its bwd: 2 * all_reduce(1) = 8, times x
    assert list(mapped) == [[0.0, 3.0, 6.0]] * 4


@MODES
def test_collectives_under_cond_switch_scan_and_fori_loop(jitted):
    s = strategy(4)
    x = batch(s, [[1.0], [2.0]])  # [1], [2], [], []

    def step(x):
        ctx = jd.get_replica_context()
        full = ctx.all_reduce("SUM", jnp.float32(x.shape[0])) > 0  # the same on every replica
        cond = lax.cond(full, lambda: reduce_sum(x, 1.0), lambda: reduce_sum(x, 10.0))
        switch = lax.switch(
            ctx.replica_id_in_sync_group, [lambda i=i: reduce_sum(x, float(i)) for i in range(4)]
        )

        def body(carry, _):
            return carry + reduce_sum(x, carry), carry

        scanned, history = lax.scan(body, jnp.float32(1.0), None, length=3)
        looped = lax.fori_loop(0, 3, lambda i, c: c + reduce_sum(x, 1.0), jnp.float32(0.0))
        grad = jax.grad(lambda w: lax.scan(body, w, None, length=2)[0])(ONE)
        return cond, switch, scanned, history, looped, grad

    cond, switch, scanned, history, looped, grad = zip(*run(s, step, x, jitted=jitted))
    assert list(cond) == [3.0] * 4
    assert list(switch) == [0.0, 3.0, 6.0, 9.0]  # each replica its branch's all-reduce
    assert list(scanned) == [64.0] * 4 and list(history) == [[1.0, 4.0, 16.0]] * 4
    assert list(looped) == [9.0] * 4
    # c1 = w + sum_r s_r w_r, c2 = c1 + sum_r s_r c1_r with s = [1, 2, 0, 0]; backwards
    # with the all-reduce of the cotangents: ct(c1) = 1 + 4 s, ct(w) = ct(c1) + s sum(ct(c1))
    assert list(grad) == [21.0, 41.0, 1.0, 1.0]


def test_a_collective_in_a_while_loop_is_a_clear_error():
    s = strategy(2)
    x = batch(s, np.ones((3, 1)))

    def step(x):
        return lax.while_loop(lambda c: c < 10.0, lambda c: c + reduce_sum(x, 1.0), 0.0)

    with pytest.raises(RuntimeError, match="while_loop"):
        s.run(step, args=(x,))


# -- errors reach the user once -------------------------------------------------------------


@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])
def test_an_error_in_a_partial_batch_step_is_raised_once(jitted):
    s = strategy(2)
    x = batch(s, np.ones((3, 1)))

    def step(x):
        raise ValueError(f"step failed: {6 * 7}")  # the source line is not the message

    call = jax.jit(lambda x: s.run(step, args=(x,))) if jitted else lambda x: s.run(step, args=(x,))
    with pytest.raises(ValueError, match="step failed: 42") as info:
        call(x)
    text = "".join(traceback.format_exception(info.value))
    assert text.count("step failed: 42") == 1
    assert info.value.__context__ is None and info.value.__cause__ is None


# -- a hostile review's programs ------------------------------------------------------------


@MODES
def test_a_reduction_over_a_vmap_axis_and_the_replica_axis(jitted):
    """``lax.psum(v, ("examples", jd.AXIS))`` under ``jax.vmap(axis_name="examples")``
    (per-example normalization by the global total) and a psum over the vmap's axis
    alone: JAX's meaning, computed with NumPy (it was a RuntimeError naming axis (0,))."""
    s = strategy(4)
    data = np.arange(1, 19, dtype=np.float32).reshape(6, 3)  # split [2, 2, 2, 0]

    def step(x):
        def example(row):
            total = lax.psum(jnp.sum(row), ("examples", jd.AXIS))
            local = lax.psum(jnp.sum(row), "examples")
            top = lax.pmax(jnp.max(row), ("examples", jd.AXIS))
            return jnp.sum(row) / total, local, top

        return jax.vmap(example, axis_name="examples")(x)

    got = run(s, step, batch(s, data), jitted=jitted)
    rows = data.sum(1)
    for i, (share, local, top) in enumerate(got):
        mine = rows[2 * i : 2 * i + 2]
        np.testing.assert_allclose(share, mine / rows.sum(), rtol=1e-6)
        np.testing.assert_allclose(local, np.full(len(mine), mine.sum()))
        np.testing.assert_allclose(top, np.full(len(mine), data.max()))


@MODES
def test_lax_map_over_the_rows_of_a_replica_with_no_example(jitted):
    """6 examples over 4 replicas leave the last one none: ``lax.map(f, x)`` over its
    zero rows is an empty result (it was JAX's "zero-length scan is not supported in
    disable_jit() mode" ValueError)."""
    s = strategy(4)
    data = np.arange(18, dtype=np.float32).reshape(6, 3)

    def step(x):
        per_example = lax.map(lambda row: jnp.sum(row**2), x)
        return per_example, jd.get_replica_context().all_reduce("SUM", jnp.sum(per_example))

    got = run(s, step, batch(s, data), jitted=jitted)
    squares = (data**2).sum(1)
    assert [g[0] for g in got] == [
        squares[0:2].tolist(),
        squares[2:4].tolist(),
        squares[4:6].tolist(),
        [],
    ]
    assert [g[1] for g in got] == [float(squares.sum())] * 4


def test_a_collective_in_a_scan_over_rows_with_an_empty_replica_is_a_clear_error():
    """The replicas with rows call the psum once per row, the empty one never."""
    s = strategy(4)

    def step(x):
        return lax.scan(lambda c, row: (c + lax.psum(jnp.sum(row), jd.AXIS), None), 0.0, x)[0]

    with pytest.raises(RuntimeError, match="replica that got no example"):
        s.run(step, args=(batch(s, np.ones((6, 3))),))
