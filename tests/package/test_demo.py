"""The main demo (`python examples/demo.py`, `make demo`): replicas agree with one device, and learn."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_demo_replicas_match_one_device(tmp_path):
    png = tmp_path / "loss.png"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    argv = ["--epochs", "3", "--devices", "4", "--batch-size", "64", "--out", str(png)]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py"), *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout
    assert proc.returncode == 0, f"demo failed ({proc.returncode}):\n{out}\n{proc.stderr[-3000:]}"
    match = re.search(r"max \|param diff\| replicas vs one device: (\S+) \(OK\)", out)
    assert match, out
    assert float(match.group(1)) < 1e-4
    accuracies = [float(a) for a in re.findall(r"test accuracy (\d\.\d+)", out)]
    assert len(accuracies) == 2 and min(accuracies) > 0.9, out
    assert "MirroredStrategy x4" in out
    assert png.stat().st_size > 0


def _demo_module():
    spec = importlib.util.spec_from_file_location("jaxdist_demo", ROOT / "examples" / "demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_demo_rejects_bad_flags():
    demo = _demo_module()

    try:
        demo.parse_args(["--epochs", "0"])
    except SystemExit as e:
        assert e.code == 2
    else:  # pragma: no cover
        raise AssertionError("--epochs 0 was accepted")
    args = demo.parse_args(["--cross-device-ops", "one-device", "--no-plot", "--seed", "3"])
    assert (args.cross_device_ops, args.no_plot, args.seed) == ("one-device", True, 3)
