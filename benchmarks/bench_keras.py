"""Keras `model.fit` under a jaxdist strategy against its honest peers, each configuration in its
own process, rounds interleaved.

python -m benchmarks.bench_keras [--quick]
python -m benchmarks.bench_keras --accelerator [--quick]   # on jax.devices(), e.g. one GPU
python -m benchmarks.bench_keras --tiny [--quick]   # the tiny one-device rows alone

Models: an MLP (784-512-512-10) and a small conv net with BatchNormalization (28x28x1, conv 16,
BN, conv 32 stride 2, BN, global pooling, Dense 10), global batch 256, SGD 0.1, 8 simulated CPU
devices, full batches only. Loops, each in its own process (so nothing one configuration sets --
XLA's CPU thread pool, which ``import jaxdist`` sizes with ``PJRT_NPROC``, or Keras' global
distribution -- reaches another):

* ``fit_jaxdist``: ``model.fit`` of a model built in ``jd.MirroredStrategy(8 devices).scope()``
  (fit outside the scope, as TF's guide does), ``steps_per_execution`` 1, 4 and 16;
* ``fit_keras_dataparallel``: Keras' own ``keras.distribution.DataParallel`` used as Keras
  documents it: ``keras.distribution.set_distribution(dp)`` before the model is built and while
  ``fit`` runs (no jaxdist imported);
* ``custom_jaxdist``: jaxdist's jitted custom loop on the same Keras model (the README recipe);
* ``fit_override``: ``fit_jaxdist`` of a model whose own ``train_step`` is Keras' (``super()``'s),
  run as an override with TF's meaning (``python -m benchmarks.bench_keras --override``: it alone);
* ``fit_one_device``: plain Keras ``fit`` in a process with one CPU device (no jaxdist).

And the tiny one-device case of issue 30: Dense 16-16-4 at batch 32 on one CPU device, plain
Keras against ``fit`` in a ``jd.MirroredStrategy()`` scope (one replica); and the same tiny
model on 8 devices with ``steps_per_execution`` 1, 4 and 16, where dispatch rather than compute
bounds a step (as on an accelerator), to show what k steps in one program save.

``--accelerator`` runs on ``jax.devices()`` instead (one GPU: one replica, ``jd.MirroredStrategy()``):
each model's plain Keras `fit` against `fit` in the scope, and the tiny model's
``steps_per_execution`` 8 against 1 for both, more steps an epoch (`ACCEL_STEPS`), no GPU memory
preallocated (the configurations' processes share the device).

Each worker times one epoch per round when told to; the parent runs the rounds in turn, the order
rotating every round, and reports per configuration the median ms/step with its range, the median
of the per-round ratios against ``fit_jaxdist`` (neighbours in time), and the first epoch (trace,
compile and one epoch) in seconds.
"""

import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")
HERE = os.path.dirname(os.path.abspath(__file__))
from benchmarks.keras_workloads import (  # noqa: E402
    MODELS,
    TINY_STEPS,
    R,
    build_model,
    compile_model,
    custom_epoch,
    fit_data,
    own_step,
)

POOL = {"PJRT_NPROC": str(2 * R)}  # the XLA CPU pool `import jaxdist` sets for 8 devices
LOOPS = [
    ("fit_jaxdist", "jaxdist", 1, R, {}),
    ("fit_jaxdist_spe4", "jaxdist", 4, R, {}),
    ("fit_jaxdist_spe16", "jaxdist", 16, R, {}),
    ("fit_keras_dataparallel", "keras_dp", 1, R, {}),
    (f"fit_keras_dataparallel_pool{2 * R}", "keras_dp", 1, R, POOL),
    ("custom_jaxdist", "custom", 1, R, {}),
    ("fit_override", "override", 1, R, {}),  # the model's own train_step (Keras' body)
    ("fit_one_device", "plain", 1, 1, {}),
]
# two processes of each: one process against another of the same configuration differs by up
# to 10% on this machine (the `tiny_plain_again` row: the noise floor), so the target reads the
# two pairs pooled (`pooled`)
TINY = [
    ("tiny_plain", "plain", 1, 1, {}),
    ("tiny_jaxdist_one_device", "jaxdist", 1, 1, {}),
    ("tiny_plain_again", "plain", 1, 1, {}),
    ("tiny_jaxdist_one_device_again", "jaxdist", 1, 1, {}),
]
# where dispatch, not compute, bounds a step (the tiny model on 8 devices, as on accelerators):
# what steps_per_execution=k (k steps, one program) saves
FUSED = [(f"fit_jaxdist_spe{k}", "jaxdist", k, R, {}) for k in (1, 4, 16)]
# --accelerator: jax.devices() (devices=0: one GPU is one replica), each model plain Keras
# against `fit` in a jaxdist scope, and the tiny model's steps_per_execution 8 against 1
ACCEL_STEPS = {"mlp": 200, "conv": 100, "tiny": 400}
ACCEL = [("plain", "plain", 1, 0, {}), ("jaxdist_scope", "jaxdist", 1, 0, {})]
ACCEL_TINY = [(f"{name}_spe{k}", how, k, 0, {}) for name, how, _, _, _ in ACCEL for k in (1, 8)]


# -- the worker: one configuration, one process ---------------------------------------------


def _fit_epoch(kind, how, spe, devices):
    """One-epoch function of a `fit` configuration (the process's one)."""
    import numpy as np

    if how in ("jaxdist", "override"):
        import jaxdist as jd  # before Keras starts JAX: jaxdist sizes XLA's CPU pool
    import keras

    x, y, batch = fit_data(kind, _steps(kind, devices), np)
    if how in ("jaxdist", "override"):  # devices=0: every device jax.devices() gives
        strategy = jd.MirroredStrategy([f"/cpu:{i}" for i in range(devices)] or None)
        with strategy.scope():
            model = build_model(kind, keras)
            if how == "override":
                model = own_step(keras)(model.layers)
            compile_model(model, keras, spe)
    else:
        if how == "keras_dp":  # Keras' docs: the distribution set before building and fitting
            import jax

            dp = keras.distribution.DataParallel(devices=jax.devices()[:devices])
            keras.distribution.set_distribution(dp)
        model = build_model(kind, keras)
        compile_model(model, keras, spe)

    def epoch():
        model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
        return model.trainable_variables[0].value

    return epoch


def _steps(kind, devices):
    """Steps per timed epoch (more on an accelerator, where a step takes microseconds)."""
    return ACCEL_STEPS[kind] if devices == 0 else MODELS.get(kind, TINY_STEPS)


def worker(kind, how, spe, devices):
    """Reads one line per round from stdin; answers seconds per step of one epoch."""
    import jax

    steps = _steps(kind, devices)
    epoch = custom_epoch(kind, devices) if how == "custom" else _fit_epoch(kind, how, spe, devices)
    t0 = time.perf_counter()
    jax.block_until_ready(epoch())
    first = time.perf_counter() - t0
    print(json.dumps({"first_epoch_s": first}), flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            break
        t0 = time.perf_counter()
        jax.block_until_ready(epoch())
        print(json.dumps({"s_per_step": (time.perf_counter() - t0) / steps}), flush=True)


# -- the parent: interleaved rounds over the workers -----------------------------------------


def _env(devices, extra):
    env = {k: v for k, v in os.environ.items() if k not in ("PJRT_NPROC", "JAXDIST_PJRT_NPROC")}
    env.update(KERAS_BACKEND="jax", JAX_PLATFORMS="cpu" if devices else "", **extra)
    if not devices:  # an accelerator shared by the configurations' processes
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    flags = [f for f in env.get("XLA_FLAGS", "").split() if "host_platform_device_count" not in f]
    if devices > 1:
        flags.append(f"--xla_force_host_platform_device_count={devices}")
    env["XLA_FLAGS"] = " ".join(flags)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [os.path.dirname(HERE), env.get("PYTHONPATH")])
    )
    return env


def _start(kind, how, spe, devices, extra):
    args = [sys.executable, "-m", "benchmarks.bench_keras", "--worker", kind, how, str(spe)]
    return subprocess.Popen(
        [*args, str(devices)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(HERE),
        env=_env(devices, extra),
        stderr=subprocess.DEVNULL,
    )


def _read(proc, key):
    """The worker's next figure, or None when it ended (XLA aborts a process whose collective
    waits too long at its rendezvous: exit code -6)."""
    line = proc.stdout.readline()
    return json.loads(line)[key] if line else None


def group(kind, loops, rounds):
    """Starts one process per loop (one after another, so first epochs are not contended),
    then times ``rounds`` interleaved rounds: {name: {"first_epoch_s", "times", "ended"}}."""
    procs, out = {}, {}
    for name, how, spe, devices, extra in loops:
        procs[name] = _start(kind, how, spe, devices, extra)
        out[name] = {"first_epoch_s": _read(procs[name], "first_epoch_s"), "times": []}
    names = list(procs)
    try:
        for r in range(rounds):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                p = procs[name]
                if p.poll() is not None or out[name]["first_epoch_s"] is None:
                    continue
                p.stdin.write("go\n")
                p.stdin.flush()
                t = _read(p, "s_per_step")
                out[name]["times"].append(t if t is not None else float("nan"))
    finally:
        for name, p in procs.items():
            if p.poll() is None:
                p.stdin.close()
            out[name]["ended"] = p.wait()
    return out


def pooled(out, plain):
    """The speed of the configurations not in ``plain`` against those in it: per round,
    the sum of the ``plain`` processes' times over the sum of the others' (each
    configuration run in two processes, so that no one process's luck decides), median
    and range over the rounds."""
    names = [n for n in out if n not in plain]
    rounds = zip(*(out[n]["times"] for n in [*plain, *names]))
    ratios = [sum(t[: len(plain)]) / sum(t[len(plain) :]) for t in rounds]
    if not ratios or any(r != r for r in ratios):
        return {"speed": float("nan"), "range": [float("nan"), float("nan")]}
    return {"speed": statistics.median(ratios), "range": [min(ratios), max(ratios)]}


def _rows(out, base):
    rows, summary = [], {}
    for name, r in out.items():
        t = r["times"]
        if r["ended"] or not t or r["first_epoch_s"] is None or any(x != x for x in t):
            summary[name] = {"aborted": f"exit code {r['ended']} after {len(t)} rounds"}
            rows.append([name, f"aborted (exit code {r['ended']}, XLA rendezvous timeout)", "", ""])
            continue
        ratios = [b / a for a, b in zip(t, out[base]["times"])]
        med = statistics.median(t)
        summary[name] = {
            "ms_per_step": med * 1e3,
            "ms_range": [min(t) * 1e3, max(t) * 1e3],
            "speed_vs_base": statistics.median(ratios),
            "speed_vs_base_range": [min(ratios), max(ratios)],
            "first_epoch_s": r["first_epoch_s"],
        }
        s = summary[name]
        rows.append(
            [
                name,
                f"{s['ms_per_step']:.2f} ({s['ms_range'][0]:.2f}-{s['ms_range'][1]:.2f})",
                f"{s['speed_vs_base']:.2f} ({min(ratios):.2f}-{max(ratios):.2f})",
                f"{s['first_epoch_s']:.2f}",
            ]
        )
    return rows, summary


def main(quick=False):
    from benchmarks import common

    rounds = 3 if quick else 5
    results, parts = {}, []
    header = ["loop", "ms/step median (range)", "{} time / this (range)", "first epoch s"]
    for kind in MODELS:
        out = group(kind, LOOPS, rounds)
        rows, results[kind] = _rows(out, "fit_jaxdist")
        h = header[:2] + [header[2].format("fit_jaxdist"), header[3]]
        parts += [f"{kind} (8 simulated devices; one_device: 1), {rounds} rounds", ""]
        parts += [common.table(h, rows), ""]
    out = group("tiny", TINY, rounds)
    rows, results["tiny"] = _rows(out, "tiny_plain")
    results["tiny"]["pooled"] = pooled(out, ["tiny_plain", "tiny_plain_again"])
    h = header[:2] + [header[2].format("tiny_plain"), header[3]]
    parts += [f"tiny Dense 16-16-4, batch 32, one CPU device, {rounds} rounds", ""]
    parts += [common.table(h, rows), ""]
    p = results["tiny"]["pooled"]
    parts += [
        f"Pooled (both plain processes' time / both jaxdist processes', per round): "
        f"{p['speed']:.2f} ({p['range'][0]:.2f}-{p['range'][1]:.2f})",
        "",
    ]
    out = group("tiny", FUSED, rounds)
    rows, results["tiny8"] = _rows(out, "fit_jaxdist_spe1")
    h = header[:2] + [header[2].format("fit_jaxdist_spe1"), header[3]]
    parts += [
        f"tiny Dense 16-16-4, batch 32, 8 simulated devices: steps_per_execution, {rounds} rounds"
    ]
    parts += ["", common.table(h, rows), "", "Targets (issues 26 and 30):", ""]
    parts += [common.table(["target", "measured", "met"], targets(results))]
    return {"title": "bench_keras", **results, "markdown": "\n".join(parts)}


def accelerator(rounds=5):
    """``--accelerator``: each model's plain Keras `fit` against `fit` in a jaxdist scope on
    ``jax.devices()`` (one GPU: one replica), and the tiny model's ``steps_per_execution`` 8
    against 1 (a dispatch-bound step: what the fused program is for)."""
    from benchmarks import common

    results, parts = {}, []
    header = ["loop", "ms/step median (range)", "{} time / this (range)", "first epoch s"]
    for kind, loops, base in [("mlp", ACCEL, "plain"), ("conv", ACCEL, "plain")] + [
        ("tiny", ACCEL_TINY, "plain_spe1")
    ]:
        out = group(kind, loops, rounds)
        rows, results[kind] = _rows(out, base)
        h = header[:2] + [header[2].format(base), header[3]]
        parts += [f"{kind}, {ACCEL_STEPS[kind]} steps an epoch, {rounds} rounds", ""]
        parts += [common.table(h, rows), ""]
    return {"title": "bench_keras --accelerator", **results, "markdown": "\n".join(parts)}


def tiny_only(rounds=5):
    """``--tiny``: the tiny model's plain Keras ``fit`` against ``fit`` of the model built in a
    one-device ``jd.MirroredStrategy(["/cpu:0"])`` scope (fit outside the scope: it enters
    the model's strategy), two processes of each, rounds interleaved."""
    from benchmarks import common

    out = group("tiny", TINY, rounds)
    rows = _rows(out, "tiny_plain")[0]
    p = pooled(out, ["tiny_plain", "tiny_plain_again"])
    h = ["loop", "ms/step median (range)", "tiny_plain time / this (range)", "first epoch s"]
    pooled_line = (
        f"Pooled (both plain processes' time / both jaxdist processes', per round): "
        f"{p['speed']:.2f} ({p['range'][0]:.2f}-{p['range'][1]:.2f})"
    )
    return "\n".join([common.table(h, rows), "", pooled_line])


def override_only(rounds=5):
    """``--override``: the MLP's ``fit`` with a model's own ``train_step`` (Keras' body, run as
    an override) against the built-in step's, on 8 simulated devices."""
    from benchmarks import common

    loops = [LOOPS[0], next(loop for loop in LOOPS if loop[1] == "override")]
    rows = _rows(group("mlp", loops, rounds), "fit_jaxdist")[0]
    h = ["loop", "ms/step median (range)", "fit_jaxdist time / this (range)", "first epoch s"]
    return common.table(h, rows)


def targets(results):
    """The issues' targets against this run's figures: rows (target, measured, met)."""
    rows = []

    def row(text, value, ok):
        rows.append([text, "n/a" if value is None else f"{value:.2f}", "n/a" if ok is None else ok])

    for kind in MODELS:
        r = results[kind]
        dp = next(
            (
                r[k]
                for k in (f"fit_keras_dataparallel_pool{2 * R}", "fit_keras_dataparallel")
                if "aborted" not in r[k]
            ),
            None,
        )
        custom = r["custom_jaxdist"].get("speed_vs_base")
        row(f"{kind}: fit time / custom loop time <= 1.1", custom, custom and custom <= 1.1)
        speed = dp and dp["speed_vs_base"]
        row(f"{kind}: DataParallel time / fit time >= 1", speed and 1 / speed, speed and speed <= 1)
        first = dp and r["fit_jaxdist"]["first_epoch_s"] / dp["first_epoch_s"]
        row(f"{kind}: first epoch / DataParallel's <= 1.5", first, first and first <= 1.5)
    tiny = results["tiny"]["pooled"]["speed"]
    row("tiny: one-device scope speed / plain Keras (pooled) >= 0.97", tiny, tiny >= 0.97)
    fused = results["tiny8"]["fit_jaxdist_spe16"].get("speed_vs_base")
    row("tiny, 8 devices: steps_per_execution=16 speed-up > 1", fused, fused and fused > 1)
    return rows


if __name__ == "__main__":
    if "--worker" in sys.argv:
        i = sys.argv.index("--worker")
        kind, how, spe, devices = sys.argv[i + 1 : i + 5]
        worker(kind, how, int(spe), int(devices))
    elif "--tiny" in sys.argv:
        print(tiny_only(rounds=3 if "--quick" in sys.argv else 5))
    elif "--override" in sys.argv:
        print(override_only(rounds=3 if "--quick" in sys.argv else 5))
    elif "--accelerator" in sys.argv:
        print(accelerator(rounds=3 if "--quick" in sys.argv else 5)["markdown"])
    else:
        print(main(quick="--quick" in sys.argv)["markdown"])
