"""TF Keras `model.fit` under `tf.distribute.MirroredStrategy` (8 logical CPUs) on the MLP of
benchmarks/bench_keras.py; runs in TensorFlow's interpreter, never jaxdist's.

python tf_keras_fit.py ROUNDS   -> prints one JSON line: {"ms_per_step": [one per round]}
"""

import json
import os
import sys
import time

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(8)]
)

import keras  # noqa: E402

R, BATCH, STEPS = 8, 256, 40


def main(rounds):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * BATCH, 784)).astype(np.float32)
    y = rng.integers(0, 10, size=(STEPS * BATCH,)).astype(np.int32)
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(R)])
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((784,)),
                keras.layers.Dense(512, activation="relu"),
                keras.layers.Dense(512, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(0.1),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)  # compile
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        times.append((time.perf_counter() - t0) / STEPS * 1e3)
    print(json.dumps({"ms_per_step": times}))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
