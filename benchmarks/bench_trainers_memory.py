"""Memory of many trainers: eager calls that each build a trainer holding a jitted bound method.

python -m benchmarks.bench_trainers_memory [CALLS] [REPLICAS]     # default 10000 1

Each call builds ``Actor()`` (an array on ``self`` and ``self.act = jax.jit(self._act)``), runs
its ``step`` with ``strategy.run`` (a new object: a compile of its own) and reduces the result;
the trainer is then dropped. Prints the process's resident memory after a garbage collection
at a few call counts: it must stop growing once JAX's and jaxdist's bounded caches are full
(jaxdist holds the trainer, its jitted method and its compiled step weakly).
"""

import os
import sys

CALLS = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
REPLICAS = int(sys.argv[2]) if len(sys.argv) > 2 else 1
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={REPLICAS}"

import gc  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxdist as jd  # noqa: E402


class Actor:
    def __init__(self):
        self.w = jnp.full((), 2.0)
        self.act = jax.jit(self._act)

    def _act(self, y):
        return y * 2.0

    def step(self, x):
        return self.act(jnp.sum(x)) * self.w


def rss_mb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def main():
    s = jd.MirroredStrategy(jax.devices()[:REPLICAS])
    n = s.num_replicas_in_sync
    x = s.experimental_distribute_values_from_function(lambda c: jnp.ones(8 // n))
    marks = sorted({CALLS // 100, CALLS // 10, CALLS // 4, CALLS // 2, 3 * CALLS // 4, CALLS})
    started = time.time()
    for i in range(1, CALLS + 1):
        t = Actor()
        total = float(s.reduce("SUM", s.run(t.step, args=(x,)), axis=None))
        assert total == 32.0, total  # 2 * (the 8 ones) * 2.0
        del t
        if i in marks:
            gc.collect()
            print(
                f"{i} calls: {rss_mb():.1f} MB resident, {time.time() - started:.0f} s", flush=True
            )


if __name__ == "__main__":
    main()
