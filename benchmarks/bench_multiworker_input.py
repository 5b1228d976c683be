"""Multi-worker input cost: a full-batch training loop on 2 workers x 2 CPU devices.

Each round launches 2 worker processes (127.0.0.1) that run ``STEPS`` SGD steps over
``experimental_distribute_dataset`` and time the loop; rounds alternate between two
jaxdist trees (``--base DIR``, e.g. an export of the commit before a change, and this
checkout), so the ratio is paired. Sources: a list (known length: the workers compare
their step counts once per epoch), a generator (unknown length: the workers agree on the
next steps' row counts, 8 steps per exchange) and a dataset function (always agreed on,
as for the generator).

Run: ``python benchmarks/bench_multiworker_input.py --base /tmp/base [--rounds 5]``
(``JAXDIST_BENCH_STEPS`` sets the steps per round, default 300)
(the base tree must hold a ``jaxdist`` package). Prints seconds per step and ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = int(os.environ.get("JAXDIST_BENCH_STEPS", "300"))
BATCH = (64, 256)


def _worker(kind: str) -> None:
    import jax

    jax.config.update("jax_num_cpu_devices", 2)
    import jax.numpy as jnp
    import numpy as np

    import jaxdist as jd

    s = jd.MultiWorkerMirroredStrategy()
    x = np.ones(BATCH, np.float32)

    def step(w, x):
        g = jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
        return w - 0.01 * jd.get_replica_context().all_reduce("MEAN", g)

    def generate():
        yield from (x for _ in range(STEPS))

    per_replica = [x[: BATCH[0] // s.num_replicas_in_sync]] * (STEPS * 2)
    if kind == "dsfn":  # each worker's 2 replicas take consecutive per-replica batches
        dist = s.distribute_datasets_from_function(lambda ctx: per_replica)
    else:
        dist = s.experimental_distribute_dataset([x] * STEPS if kind == "list" else generate)
    w = s.experimental_distribute_values_from_function(lambda c: jnp.eye(BATCH[1]))
    for batch in s.experimental_distribute_dataset([x] * 20):  # compile and warm up
        w = s.run(step, args=(w, batch))
    jax.block_until_ready(s.experimental_local_results(w))
    t0 = time.perf_counter()
    n = 0
    for batch in dist:
        w = s.run(step, args=(w, batch))
        n += 1
    jax.block_until_ready(s.experimental_local_results(w))
    seconds = (time.perf_counter() - t0) / n
    print("RESULT " + json.dumps({"s_per_step": seconds, "steps": n, "jaxdist": jd.__file__}))


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _round(tree: str, kind: str) -> float:
    cluster = {"worker": [f"127.0.0.1:{_port()}" for _ in range(2)]}
    procs = []
    for i in range(2):
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
        env.update(JAX_PLATFORMS="cpu", PYTHONPATH=tree, PJRT_NPROC="8")
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", kind]
        procs.append(
            subprocess.Popen(
                cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
            )
        )
    times = []
    for p in procs:
        out, _ = p.communicate(timeout=300)
        line = next(x for x in out.splitlines() if x.startswith("RESULT "))
        result = json.loads(line[len("RESULT ") :])
        assert result["steps"] == STEPS and result["jaxdist"].startswith(tree), result
        times.append(result["s_per_step"])
    return max(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", help="a tree holding the jaxdist to compare against")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kinds", default="list,generator,dsfn")
    parser.add_argument("--worker")
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker)
        return
    for kind in args.kinds.split(","):
        base, ours, ratios = [], [], []
        for i in range(args.rounds):
            pair = [(args.base, base), (str(ROOT), ours)]
            for tree, out in pair if i % 2 else pair[::-1]:
                out.append(_round(tree, kind))
            ratios.append(ours[-1] / base[-1])
        print(
            f"{kind}: base {statistics.median(base) * 1e3:.2f} ms/step (best "
            f"{min(base) * 1e3:.2f}), this tree {statistics.median(ours) * 1e3:.2f} ms/step "
            f"(best {min(ours) * 1e3:.2f}); per-round ratio median {statistics.median(ratios):.3f} "
            f"(range {min(ratios):.3f}-{max(ratios):.3f}), best/best {min(ours) / min(base):.3f}; "
            f"{args.rounds} paired rounds of {STEPS} steps",
            flush=True,
        )


if __name__ == "__main__":
    main()
