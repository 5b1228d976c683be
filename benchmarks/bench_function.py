"""`jd.function` (state on `self`, read afresh and written back) vs `jax.jit` (state as arguments).

python -m benchmarks.bench_function
python -m benchmarks.bench_function --one-device

Two pairs on 8 simulated CPU devices, each a median of interleaved rounds in one process:

* the MLP train step (784-256-10, 32 rows a replica): a TF-style trainer whose parameters
  live on ``self`` under ``@jd.function`` against the same step under ``jax.jit`` with the
  parameters passed in and returned (the functional way, the lower bound);
* the cost of reading state from ``self``: a step reading 1,000 small arrays from
  ``self.params`` under ``@jd.function`` against ``jax.jit`` taking them as an argument.

With ``--one-device --profile``, where that trainer's call spends its time: `cProfile` over
20,000 calls of the tiny MLP's (the Python functions it calls per call, and the most costly).

With ``--one-device``, the per-call cost of reading the state where it is felt (one device,
most users' topology): a TF-style trainer (parameters on ``self``, ``strategy.run`` under
``@jd.function``, the update assigned back) on ``MirroredStrategy(["/cpu:0"])`` against raw
``jax.jit`` of the same step with the parameters passed in and returned, for a tiny MLP
(16-16-16-4, batch 8) and an MLP 784-256-10 (batch 32).
"""

# isort: off
from benchmarks import common  # first: 8 simulated devices, before JAX and jaxdist start

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxdist as jd  # noqa: E402

# isort: on

R = 8


def _params():
    rng = np.random.default_rng(0)
    return {
        "w1": rng.normal(size=(784, 256)).astype(np.float32) * 0.05,
        "b1": np.zeros(256, np.float32),
        "w2": rng.normal(size=(256, 10)).astype(np.float32) * 0.05,
        "b2": np.zeros(10, np.float32),
    }


def _loss(p, x, y):
    h = jax.nn.relu(x @ p["w1"] + p["b1"])
    logits = h @ p["w2"] + p["b2"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


def _replica_step(p, x, y):
    loss, g = jax.value_and_grad(_loss)(p, x, y)
    g = jd.get_replica_context().all_reduce("MEAN", g)
    return jax.tree.map(lambda a, b: a - 0.01 * b, p, g), loss


def _mlp(strategy, batch=32):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(R * batch, 784)).astype(np.float32)
    y = rng.integers(0, 10, size=(R * batch,)).astype(np.int32)
    xd, yd = next(iter(strategy.experimental_distribute_dataset([(x, y)])))
    start = strategy.experimental_distribute_values_from_function(lambda c: _params())

    class Trainer:
        def __init__(self):
            self.params = start

        @jd.function
        def train_step(self, x, y):
            self.params, loss = strategy.run(_replica_step, args=(self.params, x, y))
            return strategy.reduce("MEAN", loss, axis=None)

    @jax.jit
    def step(params, x, y):
        params, loss = strategy.run(_replica_step, args=(params, x, y))
        return params, strategy.reduce("MEAN", loss, axis=None)

    trainer, state = Trainer(), {"params": start}

    def ours():
        return trainer.train_step(xd, yd)

    def reference():
        state["params"], loss = step(state["params"], xd, yd)
        return loss

    return ours, reference


def _many_arrays(strategy, n=1000):
    params = [jnp.full((4,), float(i)) for i in range(n)]

    def total(ps):
        return jnp.sum(jnp.stack(ps))  # one op over the leaves (XLA compiles it quickly)

    class Model:
        def __init__(self):
            self.params = list(params)

        @jd.function
        def read(self):
            return total(self.params)

    model = Model()
    reference = jax.jit(total)
    return (lambda: model.read()), (lambda: reference(params))


def _dense(sizes, seed=0):
    rng = np.random.default_rng(seed)
    return [
        (rng.normal(size=(a, b)).astype(np.float32) * 0.1, np.zeros(b, np.float32))
        for a, b in zip(sizes[:-1], sizes[1:])
    ]


def _mlp_loss(p, x, y):
    for w, b in p[:-1]:
        x = jax.nn.relu(x @ w + b)
    logits = x @ p[-1][0] + p[-1][1]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


def _trainer(strategy, sizes, batch):
    """A TF-style trainer under ``jd.function`` and the same step under raw ``jax.jit``."""
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(batch, sizes[0])).astype(np.float32))
    y = jnp.asarray(rng.integers(0, sizes[-1], size=(batch,)).astype(np.int32))

    def replica_step(p, x, y):
        loss, g = jax.value_and_grad(_mlp_loss)(p, x, y)
        return jax.tree.map(lambda a, b: a - 0.01 * b, p, g), loss

    class Trainer:
        def __init__(self):
            self.params = jax.tree.map(jnp.asarray, _dense(sizes))

        def step(self, x, y):
            self.params, loss = replica_step(self.params, x, y)
            return loss

        @jd.function
        def train_step(self, x, y):
            return strategy.run(self.step, args=(x, y))

    raw = jax.jit(replica_step)
    trainer, state = Trainer(), {"params": jax.tree.map(jnp.asarray, _dense(sizes))}

    def reference():
        state["params"], loss = raw(state["params"], x, y)
        return loss

    return (lambda: trainer.train_step(x, y)), reference


def one_device():
    strategy = jd.MirroredStrategy(["/cpu:0"])
    rows, data = [], {}
    for name, sizes, batch, n in (
        ("tiny MLP 16-16-16-4, batch 8", (16, 16, 16, 4), 8, 300),
        ("MLP 784-256-10, batch 32", (784, 256, 10), 32, 100),
    ):
        ours, reference = _trainer(strategy, sizes, batch)
        r = common.paired(ours, reference, n)
        data[name], row = common.paired_row(name, r)
        rows.append(row)
    header = ["(one CPU device)", "jd.function trainer µs", "raw jax.jit µs", "time ratio (range)"]
    return {"markdown": common.table(header, rows), **data}


def profile(calls=20000):
    """`cProfile` of ``calls`` calls of the tiny MLP trainer's `jd.function` (one device)."""
    import cProfile
    import io
    import pstats

    ours, reference = _trainer(jd.MirroredStrategy(["/cpu:0"]), (16, 16, 16, 4), 8)
    for _ in range(500):  # (traced, compiled, warm)
        ours(), reference()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        ours()
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(15)
    total = sum(row[1] for row in stats.stats.values())  # (primitive and recursive calls)
    return {"markdown": f"{total / calls:.0f} function calls per call\n{out.getvalue()}"}


def main():
    strategy = jd.MirroredStrategy([f"/cpu:{i}" for i in range(R)])
    rows, data = [], {}
    for name, make, n in (
        ("MLP train step (784-256-10), params on self vs passed in", _mlp, 60),
        ("1,000 arrays read from self vs passed in", _many_arrays, 100),
    ):
        ours, reference = make(strategy)
        r = common.paired(ours, reference, n)
        data[name], row = common.paired_row(name, r)
        rows.append(row)
    md = common.table(
        [
            "(8 simulated CPU devices)",
            "jd.function µs",
            "jax.jit µs",
            "time ratio, median of 9 rounds (range)",
        ],
        rows,
    )
    return {"markdown": md, **data}


if __name__ == "__main__":
    import sys

    if "--profile" in sys.argv:
        print(profile()["markdown"])
    else:
        print((one_device() if "--one-device" in sys.argv else main())["markdown"])
