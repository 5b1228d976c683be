"""One worker of tests/keras_wing/test_keras.py's multi-worker test: ``python keras_multiworker_worker.py
OUT_DIR``. The harness sets ``TF_CONFIG``; every worker has 2 simulated CPU devices.

The program is TF's multi-worker Keras program: build and compile in the
`MultiWorkerMirroredStrategy`'s scope, `fit` numpy arrays (every worker passes the same arrays and
keeps its replicas' rows; the last batch is partial), `evaluate`, `predict`, for a dense model and
one with batch norm; the chief alone saves the dense model as a ``.keras`` file inside the
scope and the other's weights outside it. Prints
``RESULT <json>`` ({model: history, evaluate, weights, predict}).

``python keras_multiworker_worker.py OUT_DIR save WHO TIMEOUT``: `save_in_scope` instead: a small
model fit inside the scope (9 rows in batches of 8), then ``model.save`` inside the scope by ``WHO`` (``chief`` or ``all``: the others
to a temporary path, TF's rule), with ``timeout_seconds=TIMEOUT``.
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


def save_data():
    """`save_in_scope`'s 9 rows (batches of 8 and 1) and initial kernel (bias 0)."""
    r = np.random.default_rng(3)
    x, y = r.normal(size=(9, 4)).astype("float32"), r.normal(size=(9, 2)).astype("float32")
    return x, y, (0.1 * np.arange(8, dtype="float32")).reshape(4, 2)


def save_in_scope(out_dir, who, timeout):
    options = jd.experimental.CommunicationOptions(timeout_seconds=timeout)
    strategy = jd.MultiWorkerMirroredStrategy(communication_options=options)
    x, y, kernel = save_data()
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile(keras.optimizers.SGD(0.1), "mse")
        model.layers[0].kernel.assign(kernel)
        # fit inside the scope: the last batch's 1 row is worker 0's; worker 1 has none
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    chief = strategy.cluster_resolver.task_id == 0
    with strategy.scope():
        if chief or who == "all":
            name = "model.keras" if chief else f"tmp_{strategy.cluster_resolver.task_id}.keras"
            model.save(os.path.join(out_dir, name))
    print("RESULT " + json.dumps({"weights": [w.tolist() for w in model.get_weights()]}))


def main():
    if len(sys.argv) > 2 and sys.argv[2] == "save":
        return save_in_scope(sys.argv[1], sys.argv[3], float(sys.argv[4]))
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
