"""The peer benchmark: jaxdist against TensorFlow's MirroredStrategy on the same training loop.

make bench-tf     # or: python -m benchmarks.bench_tf_peer [--quick] [--rounds N]

Runs `benchmarks/peer/tf_loop.py` (TensorFlow's interpreter: ``$JAXDIST_TF_PYTHON``, else
``.venv-tf/bin/python``, created with ``tensorflow-cpu`` if missing) with the default
cross-device ops and with ``ReductionToOneDevice``, and `benchmarks/peer/jax_loop.py` (this
interpreter), each in its own process, round-robin for ``--rounds`` rounds, on the same
weights and data. Reports jaxdist ÷ TF steps/s paired within a round (median and range),
checks that the losses after 10 steps agree, and writes `benchmarks/PEER.md` and
`benchmarks/peer_results.json`.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks import readme

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PEER = os.path.join(HERE, "peer")
TF_VENV = os.path.join(ROOT, ".venv-tf")
LOSS_RTOL = 1e-4
TF_CONFIGS = ("default", "r1d")
TF_NAMES = {"default": "TF default", "r1d": "TF ReductionToOneDevice"}
TRAIN_MODES = ("blocked", "pipelined", "dataset")
# jax_loop.py figure -> the TF figure it is paired with
PAIRS = [
    (f"{config}.{mode}", mode) for config in ("jaxdist", "jaxdist_jit") for mode in TRAIN_MODES
]
PAIRS += [("jaxdist_fori.pipelined", "pipelined")]
PAIRS += [(f"{c}.{m}", m) for c in ("pmap", "jit") for m in ("blocked", "pipelined")]
PAIRS += [("pmap_fori.pipelined", "pipelined")]
PAIRS += [(t, t) for t in ("tiny_run", "tiny_all_reduce", "tiny_reduce")]
LABELS = {
    "jaxdist": "jaxdist eager `strategy.run` + `reduce`",
    "jaxdist_jit": "jaxdist `jax.jit`(run + reduce)",
    "jaxdist_fori": "jaxdist `jax.jit`(`fori_loop` of 8 `run` steps)",
    "pmap": "raw `jax.pmap` step (limit)",
    "jit": "raw `jax.jit`, 1 device, whole batch (limit)",
    "pmap_fori": "raw `jax.pmap`(`fori_loop` of 8 steps) (limit)",
    "tiny_run": "tiny eager `run(lambda x: x * 2)`",
    "tiny_all_reduce": "tiny eager `run` of `all_reduce(SUM)`, 4 floats",
    "tiny_reduce": "tiny `strategy.reduce(SUM)`, 4 floats",
}


def tf_python():
    """TensorFlow's interpreter: ``$JAXDIST_TF_PYTHON``, else ``.venv-tf`` (created if missing)."""
    path = os.environ.get("JAXDIST_TF_PYTHON")
    if path:
        return path
    python = os.path.join(TF_VENV, "bin", "python")
    if not os.path.exists(python):
        print(f"bench_tf_peer: creating {TF_VENV} with tensorflow-cpu", file=sys.stderr)
        subprocess.run(["python3", "-m", "venv", TF_VENV], check=True)
        pip = [python, "-m", "pip", "install", "-q", "tensorflow-cpu", "numpy"]
        subprocess.run(pip, check=True)
    return python


def run_process(cmd, env=None):
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"bench_tf_peer: {' '.join(cmd)} failed (exit {proc.returncode})")
    out = json.loads(lines[-1])
    out["wall_s"] = time.perf_counter() - t0
    for line in proc.stderr.splitlines():
        if line.startswith("jax_loop: skipped"):
            print(line, file=sys.stderr)
    return out


def figure(result, key):
    return (
        result["calls_per_s"].get(key) if key.startswith("tiny") else result["steps_per_s"].get(key)
    )


def summarize(rounds):
    """Median and range of the paired ratios (jaxdist ÷ TF, same round) and of the figures."""
    rows = {}
    for jax_key, tf_key in PAIRS:
        row = {"jax": [], **{c: [] for c in TF_CONFIGS}, **{f"ratio_{c}": [] for c in TF_CONFIGS}}
        for r in rounds:
            ours = figure(r["jax"], jax_key)
            if ours is None:
                continue
            row["jax"].append(ours)
            for c in TF_CONFIGS:
                theirs = figure(r[c], tf_key)
                if theirs:
                    row[c].append(theirs)
                    row[f"ratio_{c}"].append(ours / theirs)
        if row["jax"]:
            rows[jax_key] = {
                k: {"median": statistics.median(v), "min": min(v), "max": max(v), "all": v}
                for k, v in row.items()
                if v
            }
    return rows


def losses(rounds):
    """Every loss after 10 steps, by side and path; the reference is TF default, pre-distributed."""
    table = {}
    for r in rounds:
        for c in TF_CONFIGS:
            for path, v in r[c]["loss10"].items():
                table.setdefault(f"tf.{c}.{path}", set()).add(v)
        for name, v in r["jax"]["loss10"].items():
            table.setdefault(f"jax.{name}", set()).add(v)
    ref = next(iter(table["tf.default.predistributed"]))
    worst = max(abs(v - ref) / abs(ref) for vs in table.values() for v in vs)
    return {k: sorted(v) for k, v in table.items()}, ref, worst


def fmt_range(s, digits=2):
    if s["min"] == s["max"]:
        return f"{s['median']:.{digits}f}"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def markdown(meta, rows, loss_table, ref, worst):
    n = meta["rounds"]
    parts = [
        "# Peer benchmark: jaxdist vs TensorFlow MirroredStrategy",
        "",
        f"Measured {meta['date']} on {meta['machine']}, {meta['cores']} cores, Python "
        f"{meta['python']}, jax {meta['jax']}, jaxdist {meta['jaxdist']}, TensorFlow "
        f"{meta['tf']} (Keras {meta['keras']}); 8 devices on each side (8 simulated CPU "
        "devices in JAX, 8 logical CPU devices in TF).",
        f"Command: `{meta['command']}`: {n} rounds, each running TF (default cross-device ops), "
        "TF (`ReductionToOneDevice`) and JAX once, each in its own process; "
        f"{meta['steps']} timed steps per figure ({meta['calls']} calls for the tiny ops).",
        "",
        "The loop is TF's custom-training-loop tutorial: MLP 784-512-512-10 (relu, relu, logits), "
        "global batch 256 (32 per replica), per-example softmax cross-entropy summed and divided "
        "by 256 on each replica, gradients all-reduced with SUM, SGD lr 0.1 (Keras `SGD` in TF, "
        "`w - 0.1 * g` in JAX), `strategy.reduce(SUM)` of the loss; TF's step is a `tf.function`. "
        "Both sides start from the same weights and data (`benchmarks/peer/peer_data.py`). "
        "TF's default cross-device ops on 8 CPU devices are `CollectiveAllReduce` with the RING "
        "implementation (TF 2.21 `MirroredStrategy` picks them when every device is a CPU); "
        "jaxdist's all-reduce is `lax.psum` in the pmapped step.",
        "Modes: *blocked* reads the loss after every step; *pipelined* reads it at the end "
        "(JAX waits for the step 4 back, to bound collectives in flight on CPU); *dataset* is "
        "pipelined and fed from `experimental_distribute_dataset` (a `tf.data` dataset in TF, a "
        "list of numpy batches in jaxdist); the others reuse 8 batches distributed once.",
        "",
        f"Ratios are jaxdist (or raw JAX) steps/s ÷ TF steps/s from the same round: median "
        f"(min–max) over {n} rounds; above 1 means faster than TF. Timings on shared cores "
        "vary by ±30% from run to run.",
        "",
        "| configuration | mode | JAX steps/s | TF default steps/s | ratio | "
        "TF R1D steps/s | ratio |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for key, s in rows.items():
        config, _, mode = key.rpartition(".")
        label = LABELS.get(config or key, key)
        unit_mode = "calls/s" if not config else mode
        cells = [label, unit_mode, f"{s['jax']['median']:.1f}"]
        for c in TF_CONFIGS:
            if c in s:
                cells += [f"{s[c]['median']:.1f}", fmt_range(s[f"ratio_{c}"])]
            else:
                cells += ["—", "—"]
        parts.append("| " + " | ".join(cells) + " |")
    if meta["skipped"]:
        parts += [
            "",
            "Skipped (raised): " + "; ".join(f"`{k}`: {v}" for k, v in meta["skipped"].items()),
        ]
    parts += [
        "",
        f"### Loss after 10 steps (cross-check; reference TF default = {ref:.7f})",
        "",
        "| side . configuration . feeding | loss after 10 steps | relative difference |",
        "|---|---:|---:|",
    ]
    for k, vs in loss_table.items():
        vals = ", ".join(f"{v:.7f}" for v in vs)
        diff = max(abs(v - ref) / abs(ref) for v in vs)
        parts.append(f"| {k} | {vals} | {diff:.1e} |")
    verdict = "agree" if worst <= LOSS_RTOL else "DISAGREE"
    parts += ["", f"All losses {verdict} within {LOSS_RTOL:g} relative (worst {worst:.1e})."]
    return "\n".join(parts) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="10 steps and 20 calls per figure")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=None, help="timed steps per figure (default 40)")
    args = p.parse_args(argv)
    steps = args.steps or (10 if args.quick else 40)
    calls = 20 if args.quick else 50
    common = ["--steps", str(steps), "--calls", str(calls)]
    tf_py = tf_python()
    jax_env = dict(os.environ)
    flags = jax_env.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        jax_env["XLA_FLAGS"] = (flags + " --xla_force_host_platform_device_count=8").strip()
    jax_env["JAX_PLATFORMS"] = "cpu"
    t_start = time.perf_counter()
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        data = ["--data", os.path.join(tmp, "peer.npz")]
        for i in range(args.rounds):
            r = {}
            for c in TF_CONFIGS:
                cmd = [tf_py, os.path.join(PEER, "tf_loop.py"), "--cdo", c, *common, *data]
                r[c] = run_process(cmd)
            cmd = [sys.executable, os.path.join(PEER, "jax_loop.py"), *common, *data]
            r["jax"] = run_process(cmd, env=jax_env)
            walls = ", ".join(f"{k} {v['wall_s']:.0f} s" for k, v in r.items())
            print(f"bench_tf_peer: round {i + 1}/{args.rounds}: {walls}", file=sys.stderr)
            rounds.append(r)
    rows = summarize(rounds)
    loss_table, ref, worst = losses(rounds)
    first = rounds[0]
    meta = {
        "date": datetime.date.today().isoformat(),
        "machine": platform.machine(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "jax": first["jax"]["jax"],
        "jaxdist": first["jax"]["jaxdist"],
        "tf": first["default"]["tf"],
        "keras": first["default"]["keras"],
        "command": " ".join(["python -m benchmarks.bench_tf_peer", *(argv or sys.argv[1:])]),
        "rounds": args.rounds,
        "steps": steps,
        "calls": calls,
        "skipped": {k: v for r in rounds for k, v in r["jax"]["skipped"].items()},
        "total_s": time.perf_counter() - t_start,
    }
    if worst > LOSS_RTOL:
        print(
            f"bench_tf_peer: WARNING: losses after 10 steps disagree by {worst:.1e} relative "
            f"(> {LOSS_RTOL:g}): {json.dumps(loss_table)}",
            file=sys.stderr,
        )
    text = markdown(meta, rows, loss_table, ref, worst)
    with open(os.path.join(HERE, "PEER.md"), "w") as f:
        f.write(text)
    with open(os.path.join(HERE, "peer_results.json"), "w") as f:
        result = {**meta, "summary": rows, "loss10": loss_table, "loss10_worst_rel": worst}
        json.dump({**result, "runs": rounds}, f, indent=1)
    readme.update_section(text, "peer")
    print(text)
    print(f"bench_tf_peer: {meta['total_s']:.0f} s in all", file=sys.stderr)


if __name__ == "__main__":
    main()
