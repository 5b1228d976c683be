"""One worker of tests/test_keras.py's multi-worker test: ``python keras_multiworker_worker.py
OUT_DIR``. The harness sets ``TF_CONFIG``; every worker has 2 simulated CPU devices.

The program is TF's multi-worker Keras program: build and compile in the
`MultiWorkerMirroredStrategy`'s scope, `fit` numpy arrays (every worker passes the same arrays and
keeps its replicas' rows), `evaluate`; the chief saves the model as a ``.keras`` file. Prints
``RESULT <json>`` (history, evaluate, weights).
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

ROWS = 256  # full batches of 64 (a partial batch inside jit across workers is not supported)


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 16)).astype("float32")
    return x, rng.integers(0, 2, size=(ROWS,)).astype("int32")


def build_and_fit(strategy):
    """The program every side runs (the test runs it on a 4-device MirroredStrategy too)."""
    x, y = data()
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(2)]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(0.1),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    r = np.random.default_rng(1)
    for layer in model.layers:
        layer.kernel.assign(r.normal(0, 0.2, tuple(layer.kernel.shape)).astype("float32"))
        layer.bias.assign(r.normal(0, 0.1, tuple(layer.bias.shape)).astype("float32"))
    hist = model.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0)
    ev = model.evaluate(x, y, batch_size=64, verbose=0, return_dict=True)
    return model, hist.history, ev


def main():
    strategy = jd.MultiWorkerMirroredStrategy()
    model, history, ev = build_and_fit(strategy)
    if strategy.cluster_resolver.task_id == 0:  # the chief saves
        model.save(os.path.join(sys.argv[1], "model.keras"))
    weights = [np.asarray(w).tolist() for w in model.get_weights()]
    print("RESULT " + json.dumps({"history": history, "evaluate": ev, "weights": weights}))


if __name__ == "__main__":
    main()
