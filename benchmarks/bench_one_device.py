"""Issue 38, one device at the limit: an eager `Strategy.run` on one CPU device against raw
`jax.jit` of the same step, and where the microseconds of a repeated eager call go.

python -m benchmarks.bench_one_device            # one CPU device (the default here)

Rows: paired, interleaved rounds in one process (`benchmarks.common.paired`: who goes first
alternates, each side blocking on its result 4 calls back), ratio = jaxdist time / raw time,
median of the rounds with their range. ``MirroredStrategy([jax.devices()[0]])``, one replica.

Phases of the repeated eager call of the tiny step (``v * 2`` on 4 floats), each timed alone
(median of 15 interleaved rounds of 5,000 calls; one process): `Strategy.run`'s test for the
common call (no keyword arguments, no options, a tuple of arguments); the plan
lookup with `_run.replay`'s tracing check and the tree flatten; the replayed plan's own checks
and result (`_one_replica.Plan`); the re-read of the step's state (`Staged.inputs`: it runs on
every call by design, and ends at once for a step that reads no state); the program's dispatch
(`jax.jit`'s C++ path, ``out_shardings`` included) against raw `jax.jit` of the step.
"""

# ruff: noqa: E402, I001
import os

os.environ["XLA_FLAGS"] = " ".join(
    [f for f in os.environ.get("XLA_FLAGS", "").split() if "host_platform_device_count" not in f]
    + ["--xla_force_host_platform_device_count=1"]
)
from benchmarks import common

import contextlib
import importlib
import statistics
import time
import timeit

import jax
import jax.numpy as jnp
import numpy as np

import jaxdist as jd

ONE = importlib.import_module("jaxdist._program.one_replica")
RUN = importlib.import_module("jaxdist._run.run")


def _tiny(s):
    v = jax.device_put(jnp.ones(4), jax.devices()[0])
    step = lambda v: v * 2  # noqa: E731
    raw = jax.jit(step)
    return (lambda: s.run(step, args=(v,))), (lambda: raw(v))


def _leaves(s, k):
    x = jax.device_put(jnp.arange(8.0), jax.devices()[0])

    def step(x):
        return [x + i for i in range(k)]

    raw = jax.jit(step)
    return (lambda: s.run(step, args=(x,))[0]), (lambda: raw(x)[0])


def _loss(p, x, y):
    h = jax.nn.relu(x @ p["w1"] + p["b1"])
    logits = h @ p["w2"] + p["b2"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


def _sgd(p, x, y):
    loss, g = jax.value_and_grad(_loss)(p, x, y)
    return jax.tree.map(lambda a, b: a - 0.01 * b, p, g), loss


def _jd_sgd(p, x, y):  # as a TF user writes it: the gradients all-reduced
    loss, g = jax.value_and_grad(_loss)(p, x, y)
    g = jd.get_replica_context().all_reduce("MEAN", g)
    return jax.tree.map(lambda a, b: a - 0.01 * b, p, g), loss


def _mlp(s, batch=32):
    rng = np.random.default_rng(0)
    put = lambda a: jax.device_put(a, jax.devices()[0])  # noqa: E731
    p = {
        "w1": rng.normal(size=(784, 256)).astype(np.float32) * 0.05,
        "b1": np.zeros(256, np.float32),
        "w2": rng.normal(size=(256, 10)).astype(np.float32) * 0.05,
        "b2": np.zeros(10, np.float32),
    }
    x = put(rng.normal(size=(batch, 784)).astype(np.float32))
    y = put(rng.integers(0, 10, size=batch).astype(np.int32))
    state = {"jd": put(p), "raw": put(p)}
    raw = jax.jit(_sgd)

    def ours():
        state["jd"], loss = s.run(_jd_sgd, args=(state["jd"], x, y))
        return loss

    def theirs():
        state["raw"], loss = raw(state["raw"], x, y)
        return loss

    return ours, theirs


def rows(s, rounds):
    out, data = [], {}
    for name, pair, n in [
        ("tiny step v * 2, eager run", lambda: _tiny(s), 2000),
        ("eager run returning 32 small arrays", lambda: _leaves(s, 32), 500),
        ("MLP train step 784-256-10, batch 32, eager run", lambda: _mlp(s), 300),
    ]:
        ours, raw = pair()
        r = common.paired(ours, raw, n, rounds=rounds)
        data[name], row = common.paired_row(name, r)
        out.append(row)
    return out, data


def _medians(fns, rounds=15, n=5000):
    """Median µs per call of each of ``fns`` (a dict), over interleaved rounds of ``n`` calls
    (the order rotating every round, so that load drifts touch every phase alike)."""
    names = list(fns)
    times = {k: [] for k in names}
    for f in fns.values():
        f()
    for r in range(rounds):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            times[k].append(timeit.timeit(fns[k], number=n) / n * 1e6)
    return {k: statistics.median(v) for k, v in times.items()}


class _Recorder:
    """Keeps the plans `_run.run` makes (the fast path's objects, to time their parts)."""

    def __init__(self):
        self.made, self.real = [], ONE.Plan

    def __call__(self, *args):
        plan = self.real(*args)
        self.made.append((plan, args))
        return plan


def phases(s):
    """Microseconds per phase of the tiny step's repeated eager call (see the docstring)."""
    v = jax.device_put(jnp.ones(4), jax.devices()[0])
    step = lambda v: v * 2  # noqa: E731
    raw = jax.jit(step)
    recorder = _Recorder()
    ONE.Plan = recorder
    try:
        s.run(step, args=(v,))
    finally:
        ONE.Plan = recorder.real
    plan, (_, _, _, _, program, staged, place, _) = recorder.made[-1]
    ext = s.extended
    args = (v,)
    # as `_run.run` flattens a call without keyword arguments
    leaves, treedef = jax.tree_util.tree_flatten(args)
    stacked = (False,) + (None,) * staged.num_inputs
    assert plan(s, ext.cross_device_ops, step, leaves, treedef) is not ONE.MISS
    plan_program = program.jitted(stacked)  # what the plan calls: one `jax.jit` per pattern
    t = _medians({
        "Strategy.run": lambda: s.run(step, args=(v,)),
        "replay": lambda: RUN.replay(s, ext.cross_device_ops, step, args),
        "plan": lambda: plan(s, ext.cross_device_ops, step, leaves, treedef),
        "inputs": lambda: staged.inputs(step, place),
        "program": lambda: plan_program(v),
        "raw": lambda: raw(v),
    })  # fmt: skip
    return [
        ("Strategy.run: the common call's test (no kwargs, no options, a tuple)", t["Strategy.run"] - t["replay"]),
        ("_run.replay: plan lookup, tracing check, check_can_run, tree flatten", t["replay"] - t["plan"]),
        ("Plan: identity/structure/type checks, result (no dispatch, no state)", t["plan"] - t["inputs"] - t["program"]),
        ("Staged.inputs: re-read of the step's state (none here)", t["inputs"]),
        ("one-replica program's dispatch over raw jax.jit's", t["program"] - t["raw"]),
        ("raw jax.jit dispatch of the same step", t["raw"]),
        ("total: Strategy.run", t["Strategy.run"]),
    ]  # fmt: skip


def keras_fit(s, rounds=10):
    """Row 4 in one process: Keras `fit` of the tiny model (Dense 16-16-4, batch 32, 1,500
    steps an epoch) in ``s``'s scope against plain Keras, two models of each (one model
    against another of the same kind differs by up to 3% here, and one process against
    another by up to 10%: `benchmarks.bench_keras`'s ``tiny_plain_again`` row), epochs
    in a rotating order. Per round: the two plain models' time over the two scope models'
    (``speed``), and one plain model's over the other's (``same``: the noise floor);
    medians and ranges over the rounds. None without Keras."""
    os.environ.setdefault("KERAS_BACKEND", "jax")
    try:
        import keras
    except ImportError:
        return None
    from benchmarks import bench_keras as bk

    x, y, batch = bk.fit_data("tiny", 5 * bk.TINY_STEPS, np)  # epochs of about half a second

    def fit(model):
        t = time.perf_counter()
        model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
        return time.perf_counter() - t

    models = []
    for scope in (None, s, None, s):  # plain, scope, plain again, scope again
        with s.scope() if scope is not None else contextlib.nullcontext():
            model = bk.build_model("tiny", keras)
            bk.compile_model(model, keras, 1)
        fit(model)  # compiled
        models.append(model)
    speed, same = [], []
    for r in range(rounds):
        t = [0.0] * 4
        for i in [(r + k) % 4 for k in range(4)]:
            t[i] = fit(models[i])
        speed.append((t[0] + t[2]) / (t[1] + t[3]))
        same.append(t[0] / t[2])
    return {
        "speed": statistics.median(speed),
        "range": (min(speed), max(speed)),
        "same": statistics.median(same),
        "same_range": (min(same), max(same)),
    }


def main(rounds=9):
    s = jd.MirroredStrategy([jax.devices()[0]])
    out, data = rows(s, rounds)
    header = ["step (1 CPU device)", "eager run µs", "raw jax.jit µs", f"ratio, median of {rounds} rounds (range)"]  # fmt: skip
    md = common.table(header, out)
    fit = keras_fit(s)
    if fit is not None:
        data["keras_fit"] = fit
        (lo, hi), (a, b) = fit["range"], fit["same_range"]
        md += (
            "\n\nKeras `fit` of the tiny model in a one-device scope, speed / plain Keras's "
            f"(two models of each, one process, median of 10 rounds of 1,500 steps): {fit['speed']:.2f} "
            f"({lo:.2f}-{hi:.2f}); one plain model / the other: {fit['same']:.2f} ({a:.2f}-{b:.2f})"
        )
    split = phases(s) if hasattr(ONE, "Plan") else []  # (a jaxdist before the fast path)
    data["phases_us"] = dict(split)
    md += "\n\n" + common.table(
        ["phase of the tiny step's repeated eager call", "µs (median of 15 rounds x 5,000 calls)"],
        [(name, f"{us:.2f}") for name, us in split],
    )
    print(md)
    return {"title": "One device: eager Strategy.run vs raw jax.jit", "markdown": md, "data": data}


if __name__ == "__main__":
    main()
