"""benchmarks/bench_accelerator.py's quick mode produces every row of issue 30's table (CI
keeps it from rotting; timings are not asserted here)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

ONE_DEVICE_ROWS = [
    "bf16 MLP",
    "same bf16 step, eager run",
    "f32 MLP 784-",
    "same f32 step, eager run",
    "tiny step v * 2, eager run",
    "tiny step v * 2, jitted",
    "TF-style trainer: eager step reads self.params",
    "TF-style trainer: jd.function reads and assigns self.params",
    "eager run returning 1 small arrays",
    "eager run returning 8 small arrays",
    "eager run returning 32 small arrays",
    "host batches",
]


@pytest.mark.parametrize("devices", [1, 2])
def test_quick_mode_writes_every_row(tmp_path, devices):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    cmd = [sys.executable, "-m", "benchmarks.bench_accelerator", "--quick", "--rounds", "1"]
    cmd += ["--cpu-devices", str(devices), "--out", str(tmp_path)]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((tmp_path / f"cpu-x{devices}.json").read_text())
    names = list(result["rows"])
    expected = ONE_DEVICE_ROWS + (
        [f"2 replicas: eager run on {k} PerReplica leaves" for k in (1, 32, 200)]
        if devices == 2
        else []
    )
    assert len(names) == len(expected)
    for prefix, name in zip(expected, names):
        assert name.startswith(prefix), (prefix, name)
        row = result["rows"][name]
        assert row["jaxdist_us"] > 0 and row["reference_us"] > 0 and row["ratio"] > 0
    meta = result["meta"]
    assert meta["device_count"] == devices and meta["platform"] == "cpu"
    assert meta["jax"] and meta["device_kind"] and meta["quick"] is True
    table = (tmp_path / f"cpu-x{devices}.md").read_text()
    assert all(name in table for name in names)
