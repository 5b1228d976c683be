"""jaxdist inside `jax.jit`: jitted steps vs raw JAX, several steps per executable, partial batches.

python -m benchmarks.bench_jit
"""

import importlib.util
import os
import statistics
import time

import jax  # noqa: E402  (after common: 8 simulated devices)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import jaxdist as jd  # noqa: E402
from benchmarks import common

R = 8
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _mlp(strategy, batch=32):
    """The MLP train step (784-256-10): jitted run + all_reduce + reduce, and raw pmap."""
    rng = np.random.default_rng(0)
    params = {
        "w1": rng.normal(size=(784, 256)).astype(np.float32) * 0.05,
        "b1": np.zeros(256, np.float32),
        "w2": rng.normal(size=(256, 10)).astype(np.float32) * 0.05,
        "b2": np.zeros(10, np.float32),
    }
    x = rng.normal(size=(R * batch, 784)).astype(np.float32)
    y = rng.integers(0, 10, size=(R * batch,)).astype(np.int32)

    def loss_fn(p, x, y):
        h = jax.nn.relu(x @ p["w1"] + p["b1"])
        logits = h @ p["w2"] + p["b2"]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))

    def replica_step(p, x, y):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        g = jd.get_replica_context().all_reduce("MEAN", g)
        return jax.tree.map(lambda a, b: a - 0.01 * b, p, g), loss

    @jax.jit
    def jd_step(p, x, y):
        p, loss = strategy.run(replica_step, args=(p, x, y))
        return p, strategy.reduce("MEAN", loss, axis=None)

    def raw_replica(p, x, y):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        g, loss = lax.pmean((g, loss), "r")
        return jax.tree.map(lambda a, b: a - 0.01 * b, p, g), loss

    raw = jax.pmap(raw_replica, axis_name="r", devices=strategy.extended.replicas.devices)
    (xd, yd) = next(iter(strategy.experimental_distribute_dataset([(x, y)])))
    state = {"jd": strategy.experimental_distribute_values_from_function(lambda c: params)}
    state["raw"] = jax.tree.map(lambda v: jax.tree.leaves(v)[0], state["jd"], is_leaf=_is_dv)
    xs, ys = jax.tree.leaves(xd)[0], jax.tree.leaves(yd)[0]

    def run_jd():
        state["jd"], loss = jd_step(state["jd"], xd, yd)
        return loss

    def run_raw():
        state["raw"], loss = raw(state["raw"], xs, ys)
        return loss

    return run_jd, run_raw


def _is_dv(x):
    return isinstance(x, jd.DistributedValues)


def _tiny(strategy):
    """A jitted tiny step (x * 2) vs a raw jitted pmap of the same."""
    x = strategy.experimental_distribute_values_from_function(lambda c: jnp.ones(4))
    xs = jax.tree.leaves(x)[0]
    jd_tiny = jax.jit(lambda v: strategy.run(lambda a: a * 2.0, args=(v,)))
    raw = jax.jit(
        jax.pmap(lambda a: a * 2.0, axis_name="r", devices=strategy.extended.replicas.devices)
    )
    state = {"jd": x, "raw": xs}

    def run_jd():
        state["jd"] = jd_tiny(state["jd"])
        return state["jd"]

    def run_raw():
        state["raw"] = raw(state["raw"])
        return state["raw"]

    return run_jd, run_raw


def _loop(strategy, steps=10, collective=False):
    """10 tiny steps in one lax.fori_loop executable vs 10 separate jitted calls (per step)."""
    x = strategy.experimental_distribute_values_from_function(lambda c: jnp.ones(4))

    def replica(a):
        return (jd.get_replica_context().all_reduce("MEAN", a) if collective else a) * 0.5

    def tiny(v):
        return strategy.run(replica, args=(v,))

    one = jax.jit(tiny)
    many = jax.jit(lambda v: lax.fori_loop(0, steps, lambda i, v: tiny(v), v))
    state = {"one": x, "many": x}

    def separate():
        for _ in range(steps):
            state["one"] = one(state["one"])
        return state["one"]

    def fused():
        state["many"] = many(state["many"])
        return state["many"]

    return fused, separate


def _demo_module():
    spec = importlib.util.spec_from_file_location(
        "jaxdist_demo", os.path.join(ROOT, "examples", "demo.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _timed(fn):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - t0


def _sync_bn_step(strategy):
    """A dense layer and a synchronized batch norm (batch moments all-reduced inside
    jax.grad, TF's SyncBatchNormalization), summed gradients: (step, params)."""
    rng = np.random.default_rng(0)
    params = {
        "w": jnp.asarray(rng.normal(size=(64, 128)), jnp.float32),
        "scale": jnp.ones(128, jnp.float32),
        "bias": jnp.zeros(128, jnp.float32),
        "out": jnp.asarray(rng.normal(size=(128, 10)), jnp.float32),
    }

    def loss(p, x, y, reduce):
        h = x @ p["w"]
        count = reduce(jnp.float32(h.shape[0]))
        mean = reduce(jnp.sum(h, 0)) / count
        var = reduce(jnp.sum(h * h, 0)) / count - mean * mean
        h = jax.nn.relu((h - mean) * lax.rsqrt(var + 1e-3) * p["scale"] + p["bias"])
        logits = h @ p["out"]
        picked = jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1)
        return -jnp.sum(picked) / 64.0

    def step(p, x, y):
        ctx = jd.get_replica_context()
        grads = jax.grad(loss)(p, x, y, lambda v: ctx.all_reduce("SUM", v))
        return ctx.all_reduce("SUM", grads)

    return step, params


def partial_batches(strategy, jitted, sync_bn=False, rounds=5):
    """The demo's MLP step (or a synchronized-batch-norm step): first and later full and
    partial (ragged) batches, seconds, and their ratios: medians (and ranges) of paired,
    interleaved rounds. Each first-call round compiles a new step function (a fresh
    compile of both programs, which go first in turn); each later round takes the best
    of 5 calls of each."""
    import optax

    demo = _demo_module()
    rng = np.random.default_rng(0)
    params = strategy.experimental_distribute_values_from_function(
        lambda c: demo.init_params(0, (64, demo.HIDDEN, demo.HIDDEN, 10))
    )
    optimizer = optax.adam(3e-3)
    opt_state = strategy.experimental_distribute_values_from_function(
        lambda c: optimizer.init(demo.init_params(0, (64, demo.HIDDEN, demo.HIDDEN, 10)))
    )
    full = (rng.random((64, 64), np.float32), rng.integers(0, 10, 64).astype(np.int32))
    part = (full[0][:37], full[1][:37])  # 37 over 8 replicas: [5, 5, 5, 5, 5, 5, 5, 2]
    dist = list(strategy.experimental_distribute_dataset([full, part]))

    def new_call():
        step = demo.make_train_step(optimizer)
        if sync_bn:
            step_, p = _sync_bn_step(strategy)
            step = lambda params, opt_state, batch: step_(p, *batch)  # noqa: E731
        call = lambda *a: strategy.run(step, args=a)  # noqa: E731
        return jax.jit(call) if jitted else call

    def once(call, batch):
        return _timed(lambda: call(params, opt_state, dist[batch]))

    first = [_paired(lambda b, c=new_call(): once(c, b), r) for r in range(rounds)]
    call = new_call()
    once(call, 0), once(call, 1)
    later = [_paired(lambda b: min(once(call, b) for _ in range(5)), r) for r in range(rounds)]
    out = {}
    for name, pairs in (("first", first), ("later", later)):
        ratios = [p / f for f, p in pairs]
        out[f"{name}_full_s"] = statistics.median(f for f, _ in pairs)
        out[f"{name}_partial_s"] = statistics.median(p for _, p in pairs)
        out[f"{name}_ratio"] = statistics.median(ratios)
        out[f"{name}_ratio_range"] = (min(ratios), max(ratios))
        out[f"{name}_rounds_s"] = pairs
    return out


def _paired(timed, r):
    """(full, partial) seconds of ``timed(batch)``, the two in turn first."""
    if r % 2:
        partial = timed(1)
        return timed(0), partial
    return timed(0), timed(1)


def main():
    strategy = jd.MirroredStrategy([f"/cpu:{i}" for i in range(R)])
    rows, data = [], {}
    for name, make, n in (
        ("jitted tiny step (x * 2) vs jax.jit(jax.pmap)", _tiny, 300),
        ("jitted MLP train step (784-256-10, 32/replica) vs raw pmap (pmean inside)", _mlp, 60),
        ("10 tiny steps (x * 0.5) in one lax.fori_loop vs 10 jitted calls", _loop, 60),
        (
            "10 tiny all-reduce steps in one lax.fori_loop vs 10 jitted calls",
            lambda s: _loop(s, collective=True),
            60,
        ),
    ):
        ours, raw = make(strategy)
        r = common.paired(ours, raw, n)
        data[name], row = common.paired_row(name, r)
        rows.append(row)
    md = common.table(
        [
            "(8 simulated CPU devices)",
            "jaxdist µs",
            "reference µs",
            "time ratio, median of 9 rounds (range)",
        ],
        rows,
    )
    prow = []
    for sync_bn in (False, True):
        for jitted in (False, True):
            s = jd.MirroredStrategy([f"/cpu:{i}" for i in range(R)])
            p = partial_batches(s, jitted, sync_bn)
            what = f"{'sync_bn_' if sync_bn else ''}{'jit' if jitted else 'eager'}"
            data[f"partial_batches_{what}"] = p
            prow.append(_partial_row(p, jitted, sync_bn))
    md += "\n\nThe demo's MLP step (64-128-128-10, adam), and a step with a synchronized batch "
    md += "norm (64-128-10, batch moments all-reduced inside jax.grad), on a full batch of 64 "
    md += "and a partial batch of 37 ([5] * 7 + [2]); ratios: median (range) of 5 paired "
    md += "rounds, each first-call round a fresh compile of a new step function:\n\n"
    md += common.table(
        [
            "step",
            "first full s",
            "first partial s",
            "ratio (range)",
            "later full ms",
            "later partial ms",
            "ratio (range)",
        ],
        prow,
    )
    print(md)
    return {"title": "jaxdist inside jax.jit", "markdown": md, "data": data}


def _partial_row(p, jitted, sync_bn):
    def ratio(name):
        lo, hi = p[f"{name}_ratio_range"]
        return f"{p[f'{name}_ratio']:.2f} ({lo:.2f}-{hi:.2f})"

    return [
        ("sync batch norm, " if sync_bn else "") + ("jitted" if jitted else "eager `run`"),
        f"{p['first_full_s']:.2f}",
        f"{p['first_partial_s']:.2f}",
        ratio("first"),
        f"{p['later_full_s'] * 1e3:.2f}",
        f"{p['later_partial_s'] * 1e3:.2f}",
        ratio("later"),
    ]


if __name__ == "__main__":
    main()
