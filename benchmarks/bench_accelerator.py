"""Issue 30's table on whatever `jax.devices()` gives: jaxdist against raw JAX, same process.

python -m benchmarks.bench_accelerator                    # one simulated CPU device (or the GPU)
python -m benchmarks.bench_accelerator --cpu-devices 8    # adds the N-replica rows vs jax.pmap
python -m benchmarks.bench_accelerator --quick --out /tmp/acc   # small sizes, every row (CI)

One-replica rows run `MirroredStrategy([jax.devices()[0]])` against `jax.jit`; with several
devices the N-replica rows run `MirroredStrategy(jax.devices())` against `jax.pmap`. Neither
side donates buffers. Each figure is the median of interleaved rounds (who goes first
alternates), each round blocking on the result 4 calls back on both sides
(`benchmarks.common.paired`). Writes ``<platform>-x<devices>.json`` and ``.md`` (device
kind, device count, JAX version, the load average when it ran) to ``--out``.
"""

import argparse
import os
import sys


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes and few rounds (CI)")
    p.add_argument("--cpu-devices", type=int, default=1, help="simulated CPU devices")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds per row")
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "accelerator"))
    return p.parse_args(argv)


ARGS = _args(sys.argv[1:] if __name__ == "__main__" else [])
os.environ["XLA_FLAGS"] = " ".join(
    [f for f in os.environ.get("XLA_FLAGS", "").split() if "host_platform_device_count" not in f]
    + [f"--xla_force_host_platform_device_count={ARGS.cpu_devices}"]
)
os.environ.setdefault("JAX_PLATFORMS", "")  # every platform: benchmarks.common pins CPU

# ruff: noqa: E402, I001
from benchmarks import common

import datetime
import json
import platform as host

import jax
import jax.numpy as jnp
import numpy as np

import jaxdist as jd

SIZES = {  # quick: CI only checks that every row runs
    False: {
        "wide": 8192,
        "depth": 4,
        "big_batch": 8192,
        "cpu_wide": 512,
        "cpu_batch": 512,
        "mlp_batch": 256,
    },
    True: {
        "wide": 64,
        "depth": 2,
        "big_batch": 64,
        "cpu_wide": 64,
        "cpu_batch": 64,
        "mlp_batch": 16,
    },
}


def _mlp_params(sizes, dtype, key=0):
    rng = np.random.default_rng(key)
    return [
        {
            "w": jnp.asarray(rng.normal(size=(a, b)) * (1 / np.sqrt(a)), dtype),
            "b": jnp.zeros(b, dtype),
        }
        for a, b in zip(sizes[:-1], sizes[1:])
    ]


def _loss(params, x, y):
    h = x
    for layer in params[:-1]:
        h = jax.nn.relu(h @ layer["w"] + layer["b"])
    logits = (h @ params[-1]["w"] + params[-1]["b"]).astype(jnp.float32)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


def _raw_step(params, x, y):
    loss, g = jax.value_and_grad(_loss)(params, x, y)
    return jax.tree.map(lambda p, d: p - 0.01 * d.astype(p.dtype), params, g), loss


def _jd_step(params, x, y):  # as a TF user writes it: gradients all-reduced
    loss, g = jax.value_and_grad(_loss)(params, x, y)
    g = jd.get_replica_context().all_reduce("MEAN", g)
    return jax.tree.map(lambda p, d: p - 0.01 * d.astype(p.dtype), params, g), loss


def _batch(device, sizes, batch, dtype):
    """One batch ``(x, y)`` of the MLP on ``device``."""
    rng = np.random.default_rng(1)
    x = jax.device_put(jnp.asarray(rng.normal(size=(batch, sizes[0])), dtype), device)
    y = jax.device_put(jnp.asarray(rng.integers(0, sizes[-1], batch)), device)
    return x, y


def _train_pair(s, sizes, batch, dtype, jitted):
    """(jaxdist step, raw jax.jit step), each carrying its own parameters."""
    params = _mlp_params(sizes, dtype)
    device = s.extended.replicas.devices[0]
    x, y = _batch(device, sizes, batch, dtype)
    state = {"jd": jax.device_put(params, device), "raw": jax.device_put(params, device)}
    raw = jax.jit(_raw_step)
    ours = jax.jit(lambda p, x, y: s.run(_jd_step, args=(p, x, y))) if jitted else None

    def run_jd():
        if ours is None:
            state["jd"], loss = s.run(_jd_step, args=(state["jd"], x, y))
        else:
            state["jd"], loss = ours(state["jd"], x, y)
        return loss

    def run_raw():
        state["raw"], loss = raw(state["raw"], x, y)
        return loss

    return run_jd, run_raw


def _tiny_pair(s, jitted):
    v = jax.device_put(jnp.ones(4), s.extended.replicas.devices[0])
    step = lambda v: v * 2  # noqa: E731
    raw = jax.jit(step)
    if jitted:
        ours = jax.jit(lambda v: s.run(step, args=(v,)))
        return (lambda: ours(v)), (lambda: raw(v))
    return (lambda: s.run(step, args=(v,))), (lambda: raw(v))


def _trainer_pair(s, sizes, batch):
    """TF's style: the eager step reads ``self.params`` (jaxdist fetches them on every
    call); raw `jax.jit` is given them as an argument."""

    class Trainer:
        def __init__(self, params):
            self.params = params

        def step(self, x, y):
            return _jd_step(self.params, x, y)

        def train(self, x, y):
            self.params, loss = s.run(self.step, args=(x, y))
            return loss

    return _against_raw(Trainer, s, sizes, batch)


def _function_pair(s, sizes, batch):
    """TF's ``@tf.function`` trainer: a `jd.function` method that reads ``self.params`` and
    assigns the updated ones (no strategy: the compiled function alone) against raw
    `jax.jit` given them as an argument."""

    class Trainer:
        def __init__(self, params):
            self.params = params

        @jd.function
        def train(self, x, y):
            self.params, loss = _raw_step(self.params, x, y)
            return loss

    return _against_raw(Trainer, s, sizes, batch)


def _against_raw(trainer_class, s, sizes, batch):
    """``trainer_class(params).train`` against raw `jax.jit` of the step carrying the same
    starting parameters (immutable arrays) as an argument."""
    device = s.extended.replicas.devices[0]
    x, y = _batch(device, sizes, batch, jnp.float32)
    t, raw = (
        trainer_class(jax.device_put(_mlp_params(sizes, jnp.float32), device)),
        jax.jit(_raw_step),
    )
    state = {"p": t.params}

    def run_raw():
        state["p"], loss = raw(state["p"], x, y)
        return loss

    return (lambda: t.train(x, y)), run_raw


def _leaves_pair(s, n_leaves):
    """An eager run returning ``n_leaves`` small arrays vs `jax.jit` returning them."""
    x = jax.device_put(jnp.arange(8.0), s.extended.replicas.devices[0])

    def step(x):
        return [x + i for i in range(n_leaves)]

    raw = jax.jit(step)
    return (lambda: s.run(step, args=(x,))[0]), (lambda: raw(x)[0])


def _pmap_leaves_pair(s, n_leaves):
    """N replicas: an eager run on ``n_leaves`` PerReplica leaves vs raw `jax.pmap`."""
    xs = s.experimental_distribute_values_from_function(
        lambda c: [jnp.full(8, float(i)) for i in range(n_leaves)]
    )
    stacked = [jax.tree.leaves(x)[0] for x in xs]

    def step(*xs):
        return [x * 2 + 1 for x in xs]

    raw = jax.pmap(step, axis_name="r", devices=s.extended.replicas.devices)
    return (lambda: s.run(step, args=tuple(xs))[0]), (lambda: raw(*stacked)[0])


def _host_batches(s, mib, count):
    """Host (NumPy) batches to the device: `experimental_distribute_dataset` vs
    `jax.device_put`, as bytes per second of one pass over ``count`` batches."""
    rows = max(1, (mib << 20) // (4 * 1024))
    data = [np.full((rows, 1024), i, np.float32) for i in range(count)]
    device = s.extended.replicas.devices[0]
    nbytes = sum(a.nbytes for a in data)

    def ours():
        out = None
        for out in s.experimental_distribute_dataset(data):
            jax.block_until_ready(out)
        return out

    def raw():
        out = None
        for a in data:
            out = jax.block_until_ready(jax.device_put(a, device))
        return out

    return ours, raw, nbytes


def _row(rows, data, name, r, unit="us"):
    entry, row = common.paired_row(name, r)
    entry["unit"] = unit
    data[name] = entry
    rows.append(row)


def one_device_rows(q, rounds):
    """Every row of issue 30's table on one replica (the first device)."""
    z = SIZES[q]
    s = jd.MirroredStrategy([jax.devices()[0]])
    accel = jax.devices()[0].platform != "cpu"
    wide, batch = (z["wide"], z["big_batch"]) if accel else (z["cpu_wide"], z["cpu_batch"])
    big = [wide] * (z["depth"] + 1)
    mlp = [784, 512, 512, 10] if not q else [784, 32, 10]
    n = 5 if q else 50
    rows, data = [], {}
    for name, pair, calls in [
        (f"bf16 MLP {wide} wide x {z['depth']}, batch {batch}, jitted", lambda: _train_pair(s, big, batch, jnp.bfloat16, True), n),
        ("same bf16 step, eager run", lambda: _train_pair(s, big, batch, jnp.bfloat16, False), n),
        (f"f32 MLP {'-'.join(map(str, mlp))}, batch {z['mlp_batch']}, jitted", lambda: _train_pair(s, mlp, z["mlp_batch"], jnp.float32, True), 4 * n),
        ("same f32 step, eager run", lambda: _train_pair(s, mlp, z["mlp_batch"], jnp.float32, False), 4 * n),
        ("tiny step v * 2, eager run", lambda: _tiny_pair(s, False), 20 * n),
        ("tiny step v * 2, jitted", lambda: _tiny_pair(s, True), 20 * n),
        ("TF-style trainer: eager step reads self.params", lambda: _trainer_pair(s, mlp, z["mlp_batch"]), 4 * n),
        ("TF-style trainer: jd.function reads and assigns self.params", lambda: _function_pair(s, mlp, z["mlp_batch"]), 4 * n),
        *[(f"eager run returning {k} small arrays", (lambda k=k: _leaves_pair(s, k)), 10 * n) for k in (1, 8, 32)],
    ]:  # fmt: skip
        ours, raw = pair()
        _row(rows, data, name, common.paired(ours, raw, calls, rounds=rounds))
    ours, raw, nbytes = _host_batches(s, 1 if q else 64, 2 if q else 8)
    r = common.paired(ours, raw, 1, rounds=rounds, lag=0)
    name = f"host batches ({nbytes >> 20} MiB), experimental_distribute_dataset vs device_put"
    _row(rows, data, name, r, unit="us per pass")
    data[name]["jaxdist_GBps"] = nbytes / r["ours_s"] / 1e9
    data[name]["reference_GBps"] = nbytes / r["reference_s"] / 1e9
    return rows, data


def n_device_rows(q, rounds):
    s = jd.MirroredStrategy(jax.devices())
    rows, data = [], {}
    for k in (1, 32, 200):
        ours, raw = _pmap_leaves_pair(s, k)
        name = f"{len(jax.devices())} replicas: eager run on {k} PerReplica leaves vs jax.pmap"
        _row(rows, data, name, common.paired(ours, raw, 5 if q else 50, rounds=rounds))
    return rows, data


def meta(q):
    d = jax.devices()[0]
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "platform": d.platform,
        "device_kind": d.device_kind,
        "device_count": len(jax.devices()),
        "jax": jax.__version__,
        "jaxlib": getattr(jax.lib, "__version__", jax.__version__),
        "python": host.python_version(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "cpu_count": os.cpu_count(),
        "quick": q,
        "donation": "none on either side",
    }


def main(argv=None):
    args = _args(argv) if argv is not None else ARGS
    rounds = args.rounds or (3 if args.quick else 7)
    rows, data = one_device_rows(args.quick, rounds)
    if len(jax.devices()) > 1:
        more_rows, more = n_device_rows(args.quick, rounds)
        rows, data = rows + more_rows, {**data, **more}
    info = meta(args.quick)
    header = [
        f"step ({info['device_kind']} x{info['device_count']}, JAX {info['jax']})",
        "jaxdist µs",
        "raw JAX µs",
        f"ratio, median of {rounds} rounds (range)",
    ]
    md = common.table(header, rows)
    load = info["load_average"]
    md += f"\n\nLoad average when run: {load}; {info['cpu_count']} CPUs. Neither side donates.\n"
    print(md)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"{info['platform']}-x{info['device_count']}")
    with open(stem + ".json", "w") as f:
        json.dump({"meta": info, "rows": data}, f, indent=1, default=float)
    with open(stem + ".md", "w") as f:
        f.write(md)
    return {"title": "jaxdist vs raw JAX on jax.devices()", "markdown": md, "data": data}


if __name__ == "__main__":
    main()
