"""Record TF 2.21 + Keras 3 answers over a grid of data sizes: empty replicas, one-row batches.

Usage: /work/tfvenv/bin/python keras_grid.py R [OUT_JSON [SHARD/SHARDS [sweep]]]
Runs the grid cases of R replicas (R in 2, 3, 4, 8; every SHARDS-th from SHARD) and writes
{key: answer} to OUT_JSON (default grid_parts/r{R}.json next to this file); merge_grid.py
joins the parts into keras_grid.json. With ``sweep``: the seeded sizes of `sweep_sizes`. Same set-up as keras_cases.py (8 logical CPUs, 1 intra-op thread, no oneDNN).

Keras' first-batch symbolic build fails when the first batch splits unevenly
(keras-team/keras#19246); every case here runs with the shape-only patch of keras_cases.py
(``_first_replica_symbolic_build``), which leaves the numbers untouched (valpatch == val
wherever val runs), so each case has TF's numbers.
"""

import json
import os
import sys
import time

import keras_cases as kc  # noqa: E402  (sets the logical devices before any TF op)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from keras.src.backend.tensorflow.trainer import TensorFlowTrainer  # noqa: E402

import keras  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

_rng = np.random.default_rng(24)
GX = _rng.normal(size=(400, 16)).astype("float32")
GY = _rng.integers(0, 2, size=(400,)).astype("int32")
GSW = np.linspace(0.5, 1.5, 400).astype("float32")

# (model, opt, variant, rows, batch) per R: sizes whose last (or only) batch leaves replicas
# empty or with one row (rows each replica gets, by TF's split, in the comments). R = 1 needs
# no TF: it is Keras on one device. TF's traces are slow (minutes per case on a loaded
# 2-core machine), so the grid is small and each fit also checks validation data.
CASES = {
    8: [
        ("dense", "sgd", "plain", 33, 32),  # last batch 1: 1,0x7
        ("dense", "sgd", "plain", 41, 32),  # last 9: 2,2,2,2,1,0,0,0
        ("dense", "sgd", "plain", 330, 64),  # last 10: 2x5,0,0,0
        ("dense", "sgd", "plain", 9, 8),  # last 1
        ("dense", "sgd", "plain", 7, 7),  # one batch of 7 (uneven first batch): 1x7,0
        ("dense", "sgd", "sw", 41, 32),
        ("dense", "sgd", "cw", 33, 32),
        ("bn", "sgd", "plain", 41, 32),
        ("syncbn", "sgd", "plain", 41, 32),
    ],
    4: [
        ("dense", "sgd", "plain", 99, 32),  # last 3: 1,1,1,0
        ("dense", "sgd", "plain", 5, 4),  # last 1: 1,0,0,0
        ("dense", "sgd", "plain", 13, 16),  # one batch of 13: 4,4,4,1
        ("dense", "sgd", "sw", 99, 32),
        ("dense", "adam", "plain", 99, 32),
    ],
    3: [
        ("dense", "sgd", "plain", 10, 4),  # batches of 4: 2,2,0 (every batch has an empty replica)
        ("bn", "sgd", "plain", 10, 4),
        ("syncbn", "sgd", "plain", 10, 4),
    ],
    2: [
        ("dense", "sgd", "plain", 65, 64),  # last 1: 1,0
        ("dense", "sgd", "plain", 1, 1),  # one row: 1,0
        ("dense", "sgd", "plain", 3, 2),  # last 1
        ("bn", "sgd", "plain", 65, 64),
        ("syncbn", "sgd", "plain", 65, 64),
    ],
}


def sweep_sizes(r, count=6):
    """Seeded draws of (rows 1..300, batch 1..70) for R replicas: the Keras axis of the sweep
    (tests/keras_wing/test_sweep_keras.py draws among the recorded ones)."""
    rng = np.random.default_rng(1000 + r)
    return [(int(rng.integers(1, 301)), int(rng.integers(1, 71))) for _ in range(count)]


def key(model, opt, variant, rows, batch, r):
    """The answer's key in keras_grid.json."""
    return f"{model}.{opt}.{variant}.n{rows}.b{batch}.r{r}"


def val_rows(rows):
    """validation_data=(GX[300:300+v], ...): a third of the rows, at least 1, at most 100."""
    return min(100, max(1, rows // 3))


def fit_case(strategy, rows, batch, model_name="dense", opt="sgd", variant="plain"):
    model = kc.make_model(strategy, model_name, opt)
    x, y = GX[:rows], GY[:rows]
    v = val_rows(rows)
    kw = dict(batch_size=batch, epochs=2, shuffle=False, verbose=0,
              validation_data=(GX[300:300 + v], GY[300:300 + v]))
    if variant == "sw":
        kw["sample_weight"] = GSW[:rows]
    elif variant == "cw":
        kw["class_weight"] = {0: 1.0, 1: 2.0}
    hist = model.fit(x, y, **kw)
    out = {"history": {k: kc.fl(h) for k, h in hist.history.items()}}
    out.update(kc.weights_of(model))
    ev = model.evaluate(x, y, batch_size=batch, verbose=0, return_dict=True)
    out["evaluate"] = {k: kc.fl(e) for k, e in ev.items()}
    out["predict"] = kc.fl(model.predict(x, batch_size=batch, verbose=0))
    return out


def main():
    R = int(sys.argv[1])
    out_path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, "grid_parts", f"r{R}.json")
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(R)])
    TensorFlowTrainer._maybe_symbolic_build = kc._first_replica_symbolic_build
    ans = {}

    def rec(k, fn, *a):
        t = time.time()
        try:
            ans[k] = fn(*a)
        except Exception as e:  # record TF's refusal as the answer
            msg = str(e)
            ans[k] = {"error": f"{type(e).__name__}: {msg[:300]} ... {msg[-600:]}"}
        err = "ERROR " + ans[k]["error"][-300:] if "error" in ans[k] else ""
        print(f"{k}: {time.time() - t:.1f}s {err}", flush=True)
        write()

    def write():  # after every case: a slow run keeps what it has
        os.makedirs(os.path.dirname(out_path), exist_ok=True)
        with open(out_path, "w") as f:
            json.dump(ans, f)

    shard, shards = (int(a) for a in (sys.argv[3] if len(sys.argv) > 3 else "0/1").split("/"))
    cases = CASES[R]
    if len(sys.argv) > 4 and sys.argv[4] == "sweep":
        cases = [("dense", "sgd", "plain", n, b) for n, b in sweep_sizes(R)]
    for case in cases[shard::shards]:
        rec(key(*case, R), fit_case, strategy, case[3], case[4], *case[:3])
    ans[f"_meta.r{R}"] = {"tf": tf.__version__, "keras": keras.__version__,
                          "numpy": np.__version__,
                          "devices": [d.name for d in tf.config.list_logical_devices("CPU")]}
    write()
    print("wrote", out_path)


if __name__ == "__main__":
    main()
