"""Runs every benchmark, one process each, and writes benchmarks/RESULTS.md and results.json.

make bench        # or: python -m benchmarks.run_all
"""

import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile

from benchmarks import readme

HERE = os.path.dirname(os.path.abspath(__file__))
BENCHMARKS = [
    "bench_run",
    "bench_one_device",
    "bench_jit",
    "bench_function",
    "bench_cross_device_ops",
    "bench_input",
    "bench_keras",
]
RUNNER = (
    "import json, sys, importlib; m = importlib.import_module('benchmarks.' + sys.argv[1]); "
    "json.dump(m.main(), open(sys.argv[2], 'w'), default=float)"
)


def run_one(name):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    try:
        subprocess.run(
            [sys.executable, "-c", RUNNER, name, path], check=True, cwd=os.path.dirname(HERE)
        )
        with open(path) as f:
            return json.load(f)
    finally:
        os.unlink(path)


def _markdown(name, result):
    if "markdown" in result:
        return result["markdown"]
    rows = [
        f"| {k} | {v:.3g} |" if isinstance(v, float) else f"| {k} | {v} |"
        for k, v in result.items()
    ]
    return "| figure | value |\n|---|---|\n" + "\n".join(rows)


def main():
    import jax

    results = {name: run_one(name) for name in BENCHMARKS}
    when = datetime.date.today().isoformat()
    machine = f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}, jax {jax.__version__}"
    parts = [
        "# Benchmark results",
        "",
        f"Measured {when} on {machine}, 8 simulated CPU devices "
        "(`--xla_force_host_platform_device_count=8`), each benchmark in its own process.",
        "Command: `make bench` (`python -m benchmarks.run_all`). Timings on 2 shared cores vary by "
        "about ±30% from run to run; ratios within one process are steadier than absolute figures.",
    ]
    for name, result in results.items():
        parts += ["", f"## {result.get('title', name)}", "", _markdown(name, result)]
    text = "\n".join(parts) + "\n"
    with open(os.path.join(HERE, "RESULTS.md"), "w") as f:
        f.write(text)
    with open(os.path.join(HERE, "results.json"), "w") as f:
        json.dump({"date": when, "machine": machine, **results}, f, indent=1, default=float)
    readme.update_section(text, "benchmarks")
    print(text)


if __name__ == "__main__":
    main()
