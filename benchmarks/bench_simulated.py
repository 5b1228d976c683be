"""Where 8 simulated CPU devices lose time: the peer benchmark's MLP step split into its parts.

python -m benchmarks.bench_simulated                 # jaxdist's sized pool (PJRT_NPROC=16)
PJRT_NPROC=8 python -m benchmarks.bench_simulated    # XLA's pool of one thread per device

The step is `benchmarks/peer/jax_loop.py`'s (MLP 784-512-512-10, global batch 256, plain
SGD) as raw `jax.pmap` programs, so that what is measured is XLA's, not jaxdist's (jaxdist's
jitted step is raw `jax.pmap`'s to within 1.1x, `benchmarks/bench_run.py`). Variants, each
timed pipelined (the loss of the step 4 back waited for), in interleaved rounds, as a ratio
to the step with its all-reduce (``lax.pmean`` of every gradient leaf, what `all_reduce`
lowers to) within the same round:

* ``no all-reduce``: the same step without the ``pmean`` (each replica's compute alone);
* ``one flat all-reduce``: the gradients raveled into one vector, one ``pmean``;
* ``reduce-scatter + all-gather``: the flat vector's ``psum_scatter`` then ``all_gather``;
* ``one device, whole batch``: `jax.jit` of the step on one device with the 256 rows.
"""

# ruff: noqa: E402, I001
from benchmarks import common

import os
import statistics

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxdist as jd  # sizes XLA's CPU pool (PJRT_NPROC) before the backend starts

SIZES = (784, 512, 512, 10)
REPLICAS = 8
PER_REPLICA = 32


def _loss(p, x, y):
    for i in range(len(SIZES) - 1):
        x = x @ p[f"w{i}"] + p[f"b{i}"]
        if i < len(SIZES) - 2:
            x = jax.nn.relu(x)
    return jnp.mean(jax.nn.logsumexp(x, 1) - jnp.take_along_axis(x, y[:, None], 1)[:, 0])


def _sgd(p, g):
    return jax.tree.map(lambda a, b: a - 0.1 * b, p, g)


def _leafwise(g):
    return lax.pmean(g, "i")


def _flat(g):
    flat, unravel = jax.flatten_util.ravel_pytree(g)
    return unravel(lax.pmean(flat, "i"))


def _scatter_gather(g):
    flat, unravel = jax.flatten_util.ravel_pytree(g)
    n = flat.shape[0]
    part = lax.psum_scatter(jnp.pad(flat, (0, (-n) % REPLICAS)), "i", tiled=True)
    return unravel(lax.all_gather(part, "i", tiled=True)[:n] / REPLICAS)


def _step(reduce):
    def step(p, x, y):
        loss, g = jax.value_and_grad(_loss)(p, x, y)
        return _sgd(p, reduce(g)), loss

    return step


def _programs():
    rng = np.random.default_rng(0)
    params = {
        f"w{i}": rng.normal(size=SIZES[i : i + 2]).astype(np.float32) * 0.05 for i in range(3)
    }
    params.update({f"b{i}": np.zeros(SIZES[i + 1], np.float32) for i in range(3)})
    x = rng.random((REPLICAS, PER_REPLICA, SIZES[0]), np.float32)
    y = rng.integers(0, 10, (REPLICAS, PER_REPLICA)).astype(np.int32)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:REPLICAS]), ("i",))
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("i"))
    stacked = jax.tree.map(lambda a: jax.device_put(np.stack([a] * REPLICAS), rows), params)
    mapped = (jax.device_put(x, rows), jax.device_put(y, rows))
    whole = (jax.device_put(params), jnp.asarray(x.reshape(-1, SIZES[0])), jnp.asarray(y.ravel()))
    return {
        "all-reduce of every leaf (pmean; the reference)": (jax.pmap(_step(_leafwise), "i"), (stacked, *mapped)),
        "no all-reduce (each replica's compute alone)": (jax.pmap(_step(lambda g: g), "i"), (stacked, *mapped)),
        "one flat all-reduce": (jax.pmap(_step(_flat), "i"), (stacked, *mapped)),
        "reduce-scatter + all-gather": (jax.pmap(_step(_scatter_gather), "i"), (stacked, *mapped)),
        "one device, whole batch (jax.jit)": (jax.jit(_step(lambda g: g)), whole),
    }  # fmt: skip


def _steps_per_s(program, args, n=30):
    state = {"p": args[0]}

    def call():
        state["p"], loss = program(state["p"], *args[1:])
        return loss

    return 1.0 / common.per_call(call, n, repeats=1, warmup=2, lag=4)


def main(rounds=7):
    programs = _programs()
    names = list(programs)
    speed = {k: [] for k in names}
    for r in range(rounds):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            speed[k].append(_steps_per_s(*programs[k]))
    ref = speed[names[0]]
    rows = []
    for k in names:
        ratios = [s / b for s, b in zip(speed[k], ref)]
        mid, lo, hi = statistics.median(ratios), min(ratios), max(ratios)
        rows.append((k, f"{statistics.median(speed[k]):.0f}", f"{mid:.2f} ({lo:.2f}-{hi:.2f})"))
    threads = jd.experimental.cpu_threads()["threads"]
    header = ["8 simulated CPU devices, MLP step", "steps/s", f"speed / the reference, median of {rounds} rounds (range)"]  # fmt: skip
    md = f"XLA's CPU pool: PJRT_NPROC={threads}, {os.cpu_count()} cores\n\n" + common.table(
        header, rows
    )
    print(md)
    return {
        "title": "8 simulated devices: where the MLP step's time goes",
        "markdown": md,
        "data": speed,
    }


if __name__ == "__main__":
    main()
