"""A step reading its state from ``self`` vs the same step given that state as arguments.

python -m benchmarks.bench_state [LEAVES ...]   (default: 10 1000)

Steady state: paired interleaved rounds (`common.paired`), ratio self / arguments. First
call: one call of each on a fresh function (trace, locate, compile), ratio likewise.

The step stacks its leaves and reduces them in one op: with one op per leaf, XLA's CPU
compile of the program grows about as the cube of the leaf count (19 s at 2,000 leaves,
166 s at 4,000, on 2 cores), for both ways of passing the state alike, and 10,000 leaves
would take most of an hour.
"""

# ruff: noqa: I001
from benchmarks import common

import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxdist as jd  # noqa: E402

R = 8


def _make(strategy, leaves):
    params = {f"w{i}": jnp.full((4,), float(i % 7)) for i in range(leaves)}
    x = strategy.experimental_distribute_values_from_function(lambda c: jnp.ones(4))
    dist = strategy.experimental_distribute_values_from_function(lambda c: params)

    def body(p, x):  # every leaf read; one op over all of them (see the module docstring)
        return jnp.sum(jnp.stack(jax.tree.leaves(p)) * x)

    class Trainer:
        def __init__(self):
            self.params = params

        def step(self, x):
            return body(self.params, x)

    def step_args(p, x):
        return body(p, x)

    t = Trainer()
    return (lambda: strategy.run(t.step, args=(x,))), (
        lambda: strategy.run(step_args, args=(dist, x))
    )


def _first_call(make):
    t0 = time.perf_counter()
    jax.block_until_ready(jax.tree.leaves(make()))
    return time.perf_counter() - t0


def main(leaf_counts=(10, 1000)):
    strategy = jd.MirroredStrategy([f"/cpu:{i}" for i in range(R)])
    rows, data = [], {}
    for leaves in leaf_counts:
        ours, ref = _make(strategy, leaves)
        first = (_first_call(ours), _first_call(ref))
        n = max(3, 1000 // leaves)
        r = common.paired(ours, ref, n, rounds=5 if leaves < 5000 else 3)
        name = f"{leaves} leaves"
        data[name], row = common.paired_row(name, r)
        data[name]["first_call_s"] = first
        rows.append([*row, f"{first[0]:.2f} s / {first[1]:.2f} s"])
        print(rows[-1], flush=True)
    md = common.table(
        [
            "state (8 simulated CPU devices)",
            "read from self µs",
            "given as arguments µs",
            "ratio, median of 5 rounds (range)",
            "first call: self / arguments",
        ],
        rows,
    )
    print(md)
    return {"title": "State read from self vs given as arguments", "markdown": md, "data": data}


if __name__ == "__main__":
    main(tuple(int(a) for a in sys.argv[1:]) or (10, 1000))
