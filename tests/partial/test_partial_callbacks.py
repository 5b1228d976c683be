"""Host callbacks in a replica step run once per replica of every step, partial batch or not.

TF's ``tf.print`` in a replica step prints on every replica (one with no rows included).
On a partial batch the replicas run side by side in one program (`jaxdist._partial`); each
`jax.debug.callback` / `jax.debug.print` / ``io_callback`` there runs once per replica, on
that replica's values, before and after its collectives, and in a ``lax.cond`` branch on
the replicas that take it. Expected values come from NumPy and the replica count.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import io_callback

import jaxdist as jd
from tests.conftest import mirrored

REPLICAS = (1, 2, 3, 8)
MODES = ("eager", "function", "jit")


def batches(n: int) -> list:
    """A full batch (2 rows a replica) and a partial one leaving replicas empty."""
    full = np.arange(2.0 * n, dtype=np.float32)
    partial = np.arange(max(n // 2, 1), dtype=np.float32) + 1.0  # n // 2 rows: half empty
    return [full, partial]


def runner(s, step, mode: str):
    def run(x):
        return s.run(step, args=(x,))

    return {"eager": run, "function": jd.function(run), "jit": jax.jit(run)}[mode]


def rows_of(s, x) -> list:
    return [int(np.shape(v)[0]) for v in s.experimental_local_results(x)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n", REPLICAS)
def test_each_callback_once_per_replica(n, mode):
    s = mirrored(n)
    calls: list = []

    def step(x):
        ctx = jd.get_replica_context()
        r = ctx.replica_id_in_sync_group
        jax.debug.callback(lambda r, k: calls.append(("before", int(r), int(k))), r, x.shape[0])
        total = ctx.all_reduce("SUM", jnp.sum(x))
        jax.debug.callback(lambda r, t: calls.append(("after", int(r), float(t))), r, total)
        spec = jax.ShapeDtypeStruct((), jnp.int32)
        got = io_callback(lambda r: calls.append(("io", int(r), 0)) or np.int32(r), spec, r)
        return total + got.astype(total.dtype) * 0

    run = runner(s, step, mode)
    data = batches(n)
    for global_batch, x in zip(data, s.experimental_distribute_dataset(data)):
        rows = rows_of(s, x)
        assert sum(rows) == len(global_batch)
        assert n == 1 or len(global_batch) == 2 * n or 0 in rows  # the partial one has empties
        for _ in range(2):  # the cached program runs them again
            calls.clear()
            out = run(x)
            jax.block_until_ready(out)
            jax.effects_barrier()
            total = float(np.sum(global_batch))
            assert sorted(c for c in calls if c[0] == "before") == [
                ("before", i, rows[i]) for i in range(n)
            ]
            assert sorted(c for c in calls if c[0] == "after") == [
                ("after", i, total) for i in range(n)
            ]
            assert sorted(c for c in calls if c[0] == "io") == [("io", i, 0) for i in range(n)]
            assert len(calls) == 3 * n
            results = [float(v) for v in s.experimental_local_results(out)]
            assert results == [total] * n


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n", REPLICAS)
def test_debug_print_on_every_replica(n, mode, capfd):
    s = mirrored(n)

    def step(x):
        ctx = jd.get_replica_context()
        loss = jnp.mean(x * 0.0 + 1.0) if x.shape[0] else jnp.float32(0.0)
        jax.debug.print("t={t}", t=ctx.all_reduce("SUM", jnp.sum(x)))
        jax.debug.print("r={r} loss={l}", r=ctx.replica_id_in_sync_group, l=loss)
        return loss

    run = runner(s, step, mode)
    data = batches(n)
    for global_batch, x in zip(data, s.experimental_distribute_dataset(data)):
        capfd.readouterr()
        jax.block_until_ready(run(x))
        jax.effects_barrier()
        out = capfd.readouterr().out
        totals = [float(t) for t in re.findall(r"^t=(\S+)$", out, re.M)]
        assert totals == [float(np.sum(global_batch))] * n
        ids = sorted(int(r) for r in re.findall(r"^r=(\d+) loss=", out, re.M))
        assert ids == list(range(n))


ONE_REPLICA_COND = pytest.mark.xfail(
    strict=True,
    reason="one replica's program is a jax.vmap of size one: JAX runs a cond with a batched "
    "predicate as a select, so both branches' callbacks run",
)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n", [pytest.param(1, marks=ONE_REPLICA_COND), 2, 3, 8])
def test_callbacks_in_cond_branches_on_the_replicas_taking_them(n, mode):
    """A branch's callbacks run on the replicas taking the branch, with or without a
    collective in the branch."""
    s = mirrored(n)
    calls: list = []

    def step(x):
        ctx = jd.get_replica_context()
        r = ctx.replica_id_in_sync_group
        even = r % 2 == 0

        def with_collective(v):
            jax.debug.callback(lambda r: calls.append(("sum", int(r))), r)
            return ctx.all_reduce("SUM", v)

        def plain(v):
            jax.debug.callback(lambda r: calls.append(("odd", int(r))), r)
            return v

        total = lax.cond(even, with_collective, lambda v: ctx.all_reduce("SUM", v), jnp.sum(x))
        return lax.cond(even, lambda v: v, plain, total)

    run = runner(s, step, mode)
    data = batches(n)
    for x in s.experimental_distribute_dataset(data):
        calls.clear()
        jax.block_until_ready(run(x))
        jax.effects_barrier()
        assert sorted(calls) == sorted(
            [("sum", i) for i in range(0, n, 2)] + [("odd", i) for i in range(1, n, 2)]
        )


@pytest.mark.parametrize("n", (2, 3, 8))
def test_values_from_function_with_empty_replicas(n):
    """Per-replica values of any lengths (replica i gets i % 2 rows): a print after the
    all-reduce on every replica, each with the total."""
    s = mirrored(n)
    calls: list = []
    rows = [i % 2 for i in range(n)]

    def value(ctx):
        i = ctx.replica_id_in_sync_group
        return jnp.arange(float(rows[i])) + 1.0

    x = s.experimental_distribute_values_from_function(value)

    def step(x):
        ctx = jd.get_replica_context()
        total = ctx.all_reduce("SUM", jnp.sum(x))
        r = ctx.replica_id_in_sync_group
        jax.debug.callback(lambda r, t: calls.append((int(r), float(t))), r, total)
        return total

    jax.block_until_ready(s.run(step, args=(x,)))
    jax.effects_barrier()
    assert sorted(calls) == [(i, float(sum(rows))) for i in range(n)]
