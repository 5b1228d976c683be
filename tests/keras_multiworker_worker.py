"""One worker of tests/test_keras.py's multi-worker test: ``python keras_multiworker_worker.py
OUT_DIR``. The harness sets ``TF_CONFIG``; every worker has 2 simulated CPU devices.

The program is TF's multi-worker Keras program: build and compile in the
`MultiWorkerMirroredStrategy`'s scope, `fit` numpy arrays (every worker passes the same arrays and
keeps its replicas' rows; the last batch is partial), `evaluate`, `predict`, for a dense model and
one with batch norm; the chief alone saves the dense model as a ``.keras`` file inside the
scope and the other's weights outside it. Prints
``RESULT <json>`` ({model: history, evaluate, weights, predict}).
"""

import json
import os
import sys

os.environ["KERAS_BACKEND"] = "jax"

import jax  # noqa: E402

if __name__ == "__main__":  # (not when the test imports this file for build_and_fit)
    jax.config.update("jax_num_cpu_devices", 2)

import keras  # noqa: E402
import numpy as np  # noqa: E402

import jaxdist as jd  # noqa: E402

ROWS = 250  # the last batch (58 rows) splits 15, 15 | 15, 13 over the two workers


def data():
    """KERAS_SCENARIOS' data (tests/tf_oracle/keras): the TF answers apply."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 16)).astype("float32")
    return x, rng.integers(0, 2, size=(ROWS,)).astype("int32")


def build_and_fit(strategy, name="dense"):
    """The program every side runs (the test runs it on a 4-device MirroredStrategy too)."""
    x, y = data()
    L = keras.layers
    with strategy.scope():
        if name == "dense":
            layers = [L.Input((16,)), L.Dense(32, activation="relu"), L.Dense(2)]
        else:
            layers = [L.Input((16,)), L.Dense(32), L.BatchNormalization(), L.ReLU(), L.Dense(2)]
        model = keras.Sequential(layers)
        model.compile(
            optimizer=keras.optimizers.SGD(0.1),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    r = np.random.default_rng(1)
    for layer in (la for la in model.layers if isinstance(la, L.Dense)):
        layer.kernel.assign(r.normal(0, 0.2, tuple(layer.kernel.shape)).astype("float32"))
        layer.bias.assign(r.normal(0, 0.1, tuple(layer.bias.shape)).astype("float32"))
    hist = model.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0)
    ev = model.evaluate(x, y, batch_size=64, verbose=0, return_dict=True)
    return model, hist.history, ev


def main():
    strategy = jd.MultiWorkerMirroredStrategy()
    out = {}
    for name in ("dense", "bn"):
        model, history, ev = build_and_fit(strategy, name)
        x, _ = data()
        pred = model.predict(x[:70], batch_size=64, verbose=0)
        if strategy.cluster_resolver.task_id == 0:  # the chief saves, alone (TF: every worker)
            if name == "dense":  # inside the scope (Keras' saver builds an optimizer there)
                with strategy.scope():
                    model.save(os.path.join(sys.argv[1], "model.keras"))
            else:
                model.save_weights(os.path.join(sys.argv[1], "bn.weights.h5"))
        weights = [np.asarray(w).tolist() for w in model.get_weights()]
        out[name] = {
            "history": history,
            "evaluate": ev,
            "weights": weights,
            "predict": pred.tolist(),
        }
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
