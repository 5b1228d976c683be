"""Keras inside a MultiWorkerMirroredStrategy's scope: fit (a last batch that leaves a worker
with no row) against TF's rule in NumPy, and model.save inside the scope, called by every worker
(TF's rule: the others to a temporary path) or by the chief alone (jaxdist: saving creates
nothing across the workers, so the others need not join)."""

import json
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "jax")
from conftest import COMPILE_FLAGS, require  # noqa: E402

keras = require("keras")
from keras_multiworker_worker import save_data  # noqa: E402

WORKER = pathlib.Path(__file__).parents[1] / "keras_multiworker_worker.py"
TIMEOUT_S = 6

pytestmark = pytest.mark.multiworker


def _port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(tmp_path, who):
    cluster = {"worker": [f"127.0.0.1:{_port()}", f"127.0.0.1:{_port()}"]}
    procs = []
    for i in range(2):
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
        env["XLA_FLAGS"] = COMPILE_FLAGS  # (its own device count)
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
        env["JAX_PLATFORMS"] = "cpu"
        env["PYTHONPATH"] = os.pathsep.join([str(WORKER.parents[1]), env.get("PYTHONPATH", "")])
        args = [sys.executable, str(WORKER), str(tmp_path), "save", who, str(TIMEOUT_S)]
        procs.append(
            subprocess.Popen(
                args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, err = p.communicate()
        outs.append((p.returncode, out, err))
    return outs


def by_hand():
    """The workers' fit in NumPy, TF's rule on 4 replicas: a full batch of 8 (2 rows each: the
    global mean gradient), then 1 row on replica 0 and none elsewhere (its mean-squared-error
    gradient / 4; the empty replicas add nothing)."""
    x, y, kernel = save_data()
    w, b = kernel.astype(np.float64), np.zeros(2)
    for rows, scale in ((slice(0, 8), 1.0), (slice(8, 9), 0.25)):
        xb, err = x[rows].astype(np.float64), (x[rows] @ w + b) - y[rows]
        w = w - 0.1 * scale * 2 * xb.T @ err / err.size
        b = b - 0.1 * scale * 2 * err.sum(0) / err.size
    return [w, b]


def test_every_worker_saving_inside_the_scope_works(tmp_path):
    outs = _run(tmp_path, "all")
    for rc, _, err in outs:
        assert rc == 0, err[-3000:]
    want = by_hand()
    for _, out, _ in outs:  # fit inside the scope, a worker with no row in the last batch
        line = next(x for x in out.splitlines() if x.startswith("RESULT "))
        for got, w in zip(json.loads(line[len("RESULT ") :])["weights"], want, strict=True):
            np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6)
    loaded = keras.models.load_model(tmp_path / "model.keras")
    for got, w in zip(loaded.get_weights(), want, strict=True):
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6)


def test_the_chief_alone_saving_inside_the_scope_works(tmp_path):
    """Was: every worker ended after timeout_seconds (Keras' saver builds a throw-away
    optimizer, whose variable the scope placed across the workers: a collective only the
    chief joined)."""
    outs = _run(tmp_path, "chief")
    for rc, _, err in outs:
        assert rc == 0, err[-3000:]
    loaded = keras.models.load_model(tmp_path / "model.keras")
    for got, w in zip(loaded.get_weights(), by_hand(), strict=True):
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6)
    assert not list(tmp_path.glob("tmp_*.keras"))  # the other worker saved nothing
