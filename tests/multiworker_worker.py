"""One worker of the multi-worker tests: ``python multiworker_worker.py SCENARIO TIMEOUT``.

The harness (tests/cluster/test_multi_worker.py) sets ``TF_CONFIG`` per process. Every worker
has 2 simulated CPU devices. Scenarios:

* ``basic``: replicas, all_reduce, reduce, gather, a training step and the input
  pipelines, then ``MirroredStrategy.configure`` on the same cluster; prints
  ``RESULT <json>`` with what this worker saw.
* ``steps``: prints ``READY`` after a first step, then runs all-reduce steps for a
  minute (the harness kills a peer meanwhile).
* ``ragged``: partial batches across workers (TF's ``range(14).batch(6)`` case).
* ``tutorial``: TF's multi-worker custom-training-loop pattern (issue 13): 50 steps of
  ``run`` followed by three metric ``reduce`` calls, with no host sync in between.
* ``stall``: worker 1 stops calling (sleeps) before a ``reduce``; both must end clearly.
* ``scale``: a smaller ``basic`` for any number of workers (4 x 2 devices in the tests).
* ``sweep``: the sweep's fixed multi-worker draws (`SWEEP_DRAWS`), custom-loop epochs.
* ``state``: `train_state`: state updated inside the replica step (issue 45), eagerly and
  under ``jd.function``.

``JAXDIST_TEST_DEVICES`` sets the devices per worker (default 2).

`train` and `DATA` are imported by the test to compute the single-process reference.
"""

import json
import os
import sys
import time

import numpy as np

GLOBAL_BATCH = 8
STEPS = 3
LR = 0.1
rng = np.random.default_rng(0)
DATA = [
    (
        rng.normal(size=(GLOBAL_BATCH, 3)).astype(np.float32),
        rng.normal(size=GLOBAL_BATCH).astype(np.float32),
    )
    for _ in range(STEPS)
]


def train(strategy, jd):
    """A few data-parallel SGD steps of linear regression; returns the final parameters."""
    import jax
    import jax.numpy as jnp

    def step(params, batch):
        x, y = batch

        def loss(p):
            return jnp.sum((x @ p["w"] + p["b"] - y) ** 2) / GLOBAL_BATCH

        grads = jax.grad(loss)(params)
        grads = jd.get_replica_context().all_reduce("SUM", grads)
        return jax.tree.map(lambda p, g: p - LR * g, params, grads)

    params = {"w": jnp.zeros(3), "b": jnp.zeros(())}
    for batch in strategy.experimental_distribute_dataset(DATA):
        out = strategy.run(step, args=(params, batch))
        params = strategy.experimental_local_results(out)[0]
    return {k: np.asarray(v).tolist() for k, v in params.items()}


def train_state(strategy, jd, how):
    """`train` in TF's shape (issue 45): the parameters on a trainer, updated inside the replica
    step from all-reduced gradients (one value), and a per-replica count of the rows each
    replica saw (a `PerReplica`); eagerly or under ``jd.function``. Returns the parameters, the
    count summed over the replicas, and the trace count."""
    import jax
    import jax.numpy as jnp

    class Trainer:
        def __init__(self):
            self.params = {"w": jnp.zeros(3), "b": jnp.zeros(())}
            self.seen = strategy.experimental_distribute_values_from_function(
                lambda ctx: jnp.zeros(())
            )

        def replica_step(self, x, y):
            def loss(p):
                return jnp.sum((x @ p["w"] + p["b"] - y) ** 2) / GLOBAL_BATCH

            grads = jd.get_replica_context().all_reduce("SUM", jax.grad(loss)(self.params))
            self.params = jax.tree.map(lambda p, g: p - LR * g, self.params, grads)
            self.seen = self.seen + x.shape[0]
            return loss(self.params)

        def step(self, batch):
            return strategy.run(self.replica_step, args=batch)

    t = Trainer()
    step = jd.function(t.step) if how == "jd.function" else t.step
    for batch in strategy.experimental_distribute_dataset(DATA):
        step(batch)
    traces = (
        step.experimental_get_tracing_count()
        if how == "jd.function"
        else jd.experimental.step_count(t.replica_step)
    )
    return {
        "params": {k: np.asarray(v).tolist() for k, v in t.params.items()},
        "seen": float(strategy.reduce("SUM", t.seen, axis=None)),
        "traces": traces,
    }


def state(s, jd, timeout):
    """`train_state` eagerly and under jd.function, across the workers."""
    return {how: train_state(s, jd, how) for how in ("eager", "jd.function")}


def basic(s, jd):
    import jax
    import jax.numpy as jnp

    r = {
        "replicas": s.num_replicas_in_sync,
        "worker_devices": list(s.extended.worker_devices),
        "task": [s.cluster_resolver.task_type, s.cluster_resolver.task_id],
        "process": [jax.process_index(), jax.process_count()],
    }

    def ids_step():
        ctx = jd.get_replica_context()
        rid = ctx.replica_id_in_sync_group.astype(jnp.float32)
        return rid, ctx.all_reduce("SUM", rid + 1.0), ctx.all_reduce("MEAN", rid + 1.0)

    rid, total, mean = s.run(ids_step)
    r["local_ids"] = [float(x) for x in s.experimental_local_results(rid)]
    r["all_reduce_sum"] = [float(x) for x in s.experimental_local_results(total)]
    r["all_reduce_mean"] = [float(x) for x in s.experimental_local_results(mean)]
    v = s.experimental_distribute_values_from_function(
        lambda ctx: jnp.array([1.0, 2.0]) * (ctx.replica_id_in_sync_group + 1)
    )
    r["dvf_local"] = [x.tolist() for x in s.experimental_local_results(v)]
    r["reduce_sum"] = s.reduce("SUM", v, axis=None).tolist()
    r["reduce_mean"] = s.reduce("MEAN", v, axis=None).tolist()
    r["reduce_mean_axis0"] = float(s.reduce("MEAN", v, axis=0))
    r["gather"] = s.gather(v, axis=0).tolist()
    reduced = s.extended.reduce_to("SUM", v, v)
    r["reduce_to_mirrored"] = [x.tolist() for x in s.experimental_local_results(reduced)]
    r["reduce_to_device"] = s.extended.reduce_to("MEAN", v, "/cpu:0").tolist()
    doubled = s.run(lambda x: x * 2, args=(v,))
    r["run_on_dvf"] = [x.tolist() for x in s.experimental_local_results(doubled)]
    jitted = jax.jit(lambda v: s.run(lambda x: x * 2, args=(v,)))(v)
    r["jit_run_on_dvf"] = [x.tolist() for x in s.experimental_local_results(jitted)]
    r["jit_reduce_sum"] = np.asarray(jax.jit(lambda v: s.reduce("SUM", v, axis=None))(v)).tolist()
    r["jit_gather"] = np.asarray(jax.jit(lambda v: s.gather(v, axis=0))(v)).tolist()
    r["params"] = train(s, jd)
    seen = []
    for batch in s.experimental_distribute_dataset([np.arange(i * 8, i * 8 + 8) for i in range(3)]):
        seen.extend(int(x) for row in s.experimental_local_results(batch) for x in np.asarray(row))
    r["dataset_rows"] = seen
    contexts = []

    def dataset_fn(ctx):
        contexts.append([ctx.input_pipeline_id, ctx.num_input_pipelines])
        b = ctx.get_per_replica_batch_size(8)
        start = 100 * ctx.input_pipeline_id
        return [np.arange(start + i, start + i + b) for i in range(0, 4 * b, b)]

    rows = []
    for batch in s.distribute_datasets_from_function(dataset_fn):
        total = s.reduce("SUM", batch, axis=0)
        rows.append([[int(x) for x in np.asarray(p)] for p in s.experimental_local_results(batch)])
        rows.append(int(total))
    r["input_contexts"] = contexts
    r["per_worker_rows"] = rows
    return r


def ragged(s, jd, timeout):
    """TF's range(14).batch(6) across the workers: partial batches 6, 6, 2 (ids mwms.*)."""
    import jax.numpy as jnp

    data = [np.arange(i, min(i + 6, 14), dtype=np.float32) for i in range(0, 14, 6)]

    def step(x):
        ctx = jd.get_replica_context()
        return ctx.all_reduce("SUM", jnp.sum(x)), jnp.int32(x.shape[0])

    import jax

    jitted = jax.jit(lambda x: s.run(step, args=(x,)))
    out = []
    for x in s.experimental_distribute_dataset(data):
        total, rows = s.run(step, args=(x,))
        jit_total, jit_rows = jitted(x)  # a partial batch across workers inside jax.jit
        out.append(
            {
                "local_rows": [np.asarray(v).tolist() for v in s.experimental_local_results(x)],
                "all_reduce": [float(v) for v in s.experimental_local_results(total)],
                "jit_all_reduce": [float(v) for v in s.experimental_local_results(jit_total)],
                "jit_rows": [int(v) for v in s.experimental_local_results(jit_rows)],
                "mean_axis0": float(s.reduce("MEAN", x, axis=0)),
                "sum_axis0": float(s.reduce("SUM", x, axis=0)),
                "rows": int(s.reduce("SUM", rows, axis=None)),
                "gather": s.gather(x, axis=0).tolist(),
            }
        )
    return out


def tutorial(s, jd, timeout, steps=50):
    """The issue-13 reproduction: run + three metric reduces per step, no host sync."""
    import jax
    import jax.numpy as jnp

    r = s.num_replicas_in_sync

    def step(p, x):
        q = p
        for _ in range(4):
            q = jnp.tanh(q @ p)
        g = jd.get_replica_context().all_reduce("SUM", jnp.sum(x) * q)
        return p - 1e-3 * g, jnp.sum(x), jnp.asarray(x.shape[0])

    p = jnp.ones((512, 512))
    t0 = time.time()
    for x in s.experimental_distribute_dataset([np.ones((r * 4, 8), np.float32)] * steps):
        p, total, n = s.run(step, args=(p, x))
        a = s.reduce("SUM", total, axis=None)
        b = s.reduce("SUM", n, axis=None)
        c = s.reduce("SUM", total, axis=None)
    jax.block_until_ready((p, a, b, c))
    return {"seconds": time.time() - t0, "a": float(a), "b": int(b), "c": float(c)}


def stall(s, jd, timeout):
    """Worker 1 stops calling for longer than the timeout before its next reduce."""
    import jax.numpy as jnp

    v = s.experimental_distribute_values_from_function(lambda c: jnp.ones(2))
    first = s.reduce("SUM", v, axis=None).tolist()
    print(f"FIRST {first}", flush=True)
    if s.cluster_resolver.task_id == 1:
        time.sleep(timeout + 8)
    t0 = time.time()
    print("REDUCING", flush=True)
    out = s.reduce("SUM", v, axis=None).tolist()
    return {"second": out, "waited": time.time() - t0}


def scale(s, jd, timeout):
    """All-reduce, reduce, gather, a training step and exactly-once input, any worker count."""
    import jax.numpy as jnp

    def ids_step():
        rid = jd.get_replica_context().replica_id_in_sync_group.astype(jnp.float32)
        return jd.get_replica_context().all_reduce("SUM", rid + 1.0)

    v = s.experimental_distribute_values_from_function(
        lambda ctx: jnp.array([1.0, 2.0]) * (ctx.replica_id_in_sync_group + 1)
    )
    seen = []
    for batch in s.experimental_distribute_dataset(
        [np.arange(i * 16, i * 16 + 16) for i in range(3)]
    ):
        seen.extend(int(x) for row in s.experimental_local_results(batch) for x in np.asarray(row))
    return {
        "replicas": s.num_replicas_in_sync,
        "all_reduce_sum": [float(x) for x in s.experimental_local_results(s.run(ids_step))],
        "reduce_sum": s.reduce("SUM", v, axis=None).tolist(),
        "reduce_mean_axis0": float(s.reduce("MEAN", v, axis=0)),
        "gather": s.gather(v, axis=0).tolist(),
        "params": train(s, jd),
        "dataset_rows": seen,
    }


def _sum_step(jd):
    import jax.numpy as jnp

    return lambda x: jd.get_replica_context().all_reduce("SUM", jnp.sum(x))


def input_raises(s, jd, timeout):
    """Worker 1's input raises at its 4th batch; worker 0 goes on to the next step."""

    class Batches:
        def __iter__(self):
            for i in range(8):
                if i == 3 and s.cluster_resolver.task_id == 1:
                    raise ValueError("bad record at batch 3 of worker 1's input")
                yield np.ones((s.num_replicas_in_sync * 2, 4), np.float32)

    total = 0.0
    for x in s.experimental_distribute_dataset(Batches()):
        total += float(s.reduce("SUM", s.run(_sum_step(jd), args=(x,)), axis=None))
    return {"total": total}


def fewer_steps(s, jd, timeout):
    """Worker 1 runs one step fewer than worker 0, then ends its program normally."""
    x = np.ones((s.num_replicas_in_sync * 2, 4), np.float32)
    (batch,) = list(s.experimental_distribute_dataset([x]))
    steps = 4 if s.cluster_resolver.task_id == 1 else 5
    for _ in range(steps):
        s.reduce("SUM", s.run(_sum_step(jd), args=(batch,)), axis=None).block_until_ready()
    return {"steps": steps}


def no_fetch(s, jd, timeout):
    """experimental_fetch_to_device=False: where each worker's per-replica values live."""
    options = jd.InputOptions(experimental_fetch_to_device=False)
    r = s.num_replicas_in_sync

    def where(v):
        return [
            type(x).__name__
            if not hasattr(x, "devices")
            else str(sorted(d.id for d in x.devices()))
            for x in s.experimental_local_results(v)
        ]

    a = next(iter(s.experimental_distribute_dataset([np.arange(2.0 * r)], options)))
    b = next(iter(s.distribute_datasets_from_function(lambda c: [np.arange(2.0)], options)))
    out = s.run(lambda v: v * 2, args=(a,))
    return {
        "dataset": where(a),
        "dsfn": where(b),
        "run": [x.tolist() for x in s.experimental_local_results(out)],
        "sum": float(s.reduce("SUM", out, axis=0)),
    }


def ragged_fn(s, jd, timeout):
    """distribute_datasets_from_function with batches of different sizes within a worker:
    worker w's replicas get [100w, 100w + 1, 100w + 2] and [100w + 50]."""
    import jax
    import jax.numpy as jnp

    def dataset_fn(ctx):
        start = 100 * ctx.input_pipeline_id
        return [np.arange(start, start + 3, dtype=np.float32), np.float32([start + 50])]

    def step(x):
        ctx = jd.get_replica_context()
        total = ctx.all_reduce("SUM", jnp.sum(x))
        grad = jax.grad(lambda w: ctx.all_reduce("SUM", jnp.sum(x * w)))(jnp.float32(1.0))
        return total, grad, jnp.int32(x.shape[0])

    jitted = jax.jit(lambda x: s.run(step, args=(x,)))
    out = []
    for x in s.distribute_datasets_from_function(dataset_fn):
        local = lambda v: [float(a) for a in s.experimental_local_results(v)]  # noqa: E731
        total, grad, rows = s.run(step, args=(x,))
        jit_total, jit_grad, _ = jitted(x)
        out.append(
            {
                "local_rows": [np.asarray(v).tolist() for v in s.experimental_local_results(x)],
                "all_reduce": local(total),
                "jit_all_reduce": local(jit_total),
                "grad": local(grad),
                "jit_grad": local(jit_grad),
                "rows": local(rows),
                "sum_axis0": float(s.reduce("SUM", x, axis=0)),
                "gather": s.gather(x, axis=0).tolist(),
            }
        )
    return out


def uneven(s, jd, timeout):
    """Issue 19: the workers' datasets end at different steps (TF's ``mwms*.uneven_dsfn``:
    worker 0 has 3 batches of 2 rows, worker 1 one), through every way of iterating; and
    ``experimental_distribute_dataset`` over generators (unknown length) of 3 and 2 global
    batches of 4 rows."""
    import jax
    import jax.numpy as jnp

    def dataset_fn(ctx):
        n = 6 if ctx.input_pipeline_id == 0 else 2
        return [np.arange(i, i + 2) for i in range(0, n, 2)]

    def step(x):
        total = jd.get_replica_context().all_reduce("SUM", jnp.sum(x.astype(jnp.float32)))
        return total, jnp.int32(x.shape[0])

    jitted = jax.jit(lambda x: s.run(step, args=(x,)))
    local = s.experimental_local_results

    def record(x):
        xf = s.run(lambda x: x.astype(jnp.float32), args=(x,))
        total, rows = s.run(step, args=(x,))
        return {
            "local_x": [np.asarray(v).tolist() for v in local(x)],
            "all_reduce": [float(v) for v in local(total)],
            "jit_all_reduce": [float(v) for v in local(jitted(x)[0])],
            "mean_axis0": float(s.reduce("MEAN", xf, axis=0)),
            "sum_axis0": float(s.reduce("SUM", xf, axis=0)),
            "rows": int(s.reduce("SUM", rows, axis=None)),
            "gather": s.gather(xf, axis=0).tolist(),
        }

    def rows_of(x):
        return [np.asarray(v).tolist() for v in local(x)]

    dist = s.distribute_datasets_from_function(dataset_fn)
    out = {"for": [record(x) for x in dist], "again": [rows_of(x) for x in dist]}
    it = iter(dist)
    out["next"] = [rows_of(next(it)) for _ in range(len(out["for"]))]
    out["next_end"] = next(it, "end")
    it = iter(dist)
    out["get_next"] = []
    try:
        while True:
            out["get_next"].append(rows_of(it.get_next()))
    except jd.errors.OutOfRangeError:
        out["get_next"].append("OutOfRangeError")
    it, out["optional"] = iter(dist), []
    while (opt := it.get_next_as_optional()).has_value():
        out["optional"].append(rows_of(opt.get_value()))
    unknown = s.distribute_datasets_from_function(lambda c: lambda: iter(dataset_fn(c)))
    out["generator"] = [record(x) for x in unknown]
    batches = 3 if s.cluster_resolver.task_id == 0 else 2

    def generate():
        yield from (np.arange(4 * i, 4 * i + 4) for i in range(batches))

    out["dataset"] = [record(x) for x in s.experimental_distribute_dataset(generate)]

    def mixed_fn(ctx):  # as many batches on each worker, of sizes that differ between them
        return [np.arange(3), np.arange(3 if ctx.input_pipeline_id == 0 else 1)]

    out["mixed"] = [record(x) for x in s.distribute_datasets_from_function(mixed_fn)]
    return out


def empty_worker(s, jd, timeout):
    """Worker 1's dataset function gives no batch at all; worker 0's gives two."""
    import jax.numpy as jnp

    def dataset_fn(ctx):
        return [np.ones(2, np.float32)] * (2 if ctx.input_pipeline_id == 0 else 0)

    total = 0.0
    for x in s.distribute_datasets_from_function(dataset_fn):
        total += float(s.reduce("SUM", s.run(jnp.sum, args=(x,)), axis=None))
    return {"total": total}


def skip_input(s, jd, timeout):
    """Worker 0 iterates a generator's distributed dataset; worker 1 never does."""

    def generate():
        yield from [np.ones(4, np.float32)] * 3

    if s.cluster_resolver.task_id == 1:
        return {"skipped": True}
    return {"steps": len(list(s.experimental_distribute_dataset(generate)))}


FAULTS = ("raise", "exit", "kill", "hang")


def uneven_fault(s, jd, timeout):
    """Worker 1's dataset has one batch less than worker 0's; on that step (worker 1's
    replicas get no rows) the worker named by ``JAXDIST_TEST_FAULT=kind:task`` faults:
    ``raise`` (a ValueError in its loop), ``exit`` (``sys.exit(3)``), ``kill`` (SIGKILL)
    or ``hang`` (stops calling for three timeouts). Prints ``FAULT <time>`` first."""
    import signal

    import jax.numpy as jnp

    kind, who = os.environ["JAXDIST_TEST_FAULT"].split(":")
    me = s.cluster_resolver.task_id

    def dataset_fn(ctx):
        n = 8 if ctx.input_pipeline_id == 0 else 6  # 4 steps, 3 (2 replicas a worker)
        return [np.ones(2, np.float32) * (i + 1) for i in range(n)]

    total = 0.0
    for i, x in enumerate(s.distribute_datasets_from_function(dataset_fn)):
        if i == 3 and me == int(who):
            print(f"FAULT {time.time()}", flush=True)
            if kind == "raise":
                raise ValueError(f"fault of worker {me} at step {i}")
            if kind == "exit":
                sys.exit(3)
            if kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(3 * timeout)
        total += float(s.reduce("SUM", s.run(jnp.sum, args=(x,)), axis=None))
    return {"total": total}


SWEEP_DRAWS = [  # (rows, batch, drop_remainder, jit) for 2 workers x 2 devices (4 replicas)
    (33, 32, False, True),  # last batch 1: 1, 0 | 0, 0 (the second worker has no row)
    (9, 8, False, False),
    (5, 70, False, True),  # one batch: 2, 2 | 1, 0
    (13, 6, True, False),
]


def sweep(s, jd, timeout):
    """Fixed draws of the sweep (tests/package/test_sweep_multiworker.py): an epoch of SGD on a linear
    model with the global-batch mean loss, over every global batch; each draw's losses and
    weights (tests/package/test_sweep_split.py computes one device's)."""
    import jax
    import jax.numpy as jnp

    r = np.random.default_rng(7)  # test_sweep_split's data
    x_all, y_all = r.normal(size=(300, 3)).astype(np.float32), r.normal(size=300).astype(np.float32)
    out = []
    for rows, batch, drop, jit in SWEEP_DRAWS:
        starts = [(a, min(batch, rows - a)) for a in range(0, rows, batch)]
        starts = starts[:-1] if drop and starts[-1][1] < batch else starts
        data = [(x_all[a : a + n], y_all[a : a + n]) for a, n in starts]

        def replica(w, xy, batch=batch):
            x, y = xy

            def loss(w):
                return jd.nn.compute_average_loss((x @ w - y) ** 2, global_batch_size=batch)

            value, grad = jax.value_and_grad(loss)(w)
            return value, w - LR * jd.get_replica_context().all_reduce("SUM", grad)

        def step(w, xy):
            value, w = s.run(replica, args=(w, xy))
            return s.reduce("SUM", value, axis=None), s.experimental_local_results(w)[0]

        step = jax.jit(step) if jit else step
        w, losses = jnp.array([0.5, -0.25, 0.1], jnp.float32), []
        for xy in s.experimental_distribute_dataset(data):
            total, w = step(w, xy)
            losses.append(float(total))
        out.append({"losses": losses, "w": np.asarray(w).tolist()})
    return out


SCENARIOS = {
    "state": state,
    "sweep": sweep,
    "skip_input": skip_input,
    "empty_worker": empty_worker,
    "uneven": uneven,
    "no_fetch": no_fetch,
    "ragged": ragged,
    "ragged_fn": ragged_fn,
    "tutorial": tutorial,
    "stall": stall,
    "scale": scale,
    "input_raises": input_raises,
    "fewer_steps": fewer_steps,
    "uneven_fault": uneven_fault,
}


def main() -> None:
    scenario, timeout = sys.argv[1], float(sys.argv[2])
    import jax

    devices = int(os.environ.get("JAXDIST_TEST_DEVICES", "2"))
    jax.config.update("jax_num_cpu_devices", devices)  # wins over an inherited XLA_FLAGS
    import jaxdist as jd

    options = jd.experimental.CommunicationOptions(timeout_seconds=timeout)
    t0 = time.time()
    s = jd.MultiWorkerMirroredStrategy(communication_options=options)
    print(f"joined in {time.time() - t0:.2f}s", flush=True)
    if scenario == "basic":
        r = basic(s, jd)
        # TF1's MirroredStrategy.configure joins the same (already initialized) cluster.
        import warnings

        m = jd.MirroredStrategy(["/cpu:0"])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            res = s.cluster_resolver
            m.configure(
                cluster_spec=res.cluster_spec(), task_type=res.task_type, task_id=res.task_id
            )
        r["configure"] = {"replicas": m.num_replicas_in_sync, "params": train(m, jd)}
        print("RESULT " + json.dumps(r), flush=True)
    elif scenario in SCENARIOS:
        print("RESULT " + json.dumps(SCENARIOS[scenario](s, jd, timeout)), flush=True)
    elif scenario == "steps":
        import jax.numpy as jnp

        def step():
            return jd.get_replica_context().all_reduce("SUM", jnp.ones(4))

        s.experimental_local_results(s.run(step))[0].block_until_ready()
        print("READY", flush=True)
        end = time.time() + 60
        while time.time() < end:
            s.experimental_local_results(s.run(step))[0].block_until_ready()
            time.sleep(0.01)
        print("steps finished without a fault?", flush=True)


if __name__ == "__main__":
    main()
