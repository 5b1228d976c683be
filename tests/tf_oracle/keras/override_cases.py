"""Record TF 2.21 + Keras 3 answers for models that override train_step / test_step /
compute_loss, under tf.distribute.MirroredStrategy (test vectors for tests/keras_wing/test_keras_override.py).

Usage: /work/tfvenv/bin/python override_cases.py R [OUT_JSON [CASE,CASE...]]   (R in 1, 2, 3, 8;
a third argument records only those cases, e.g.
``override_cases.py 8 override_parts/r8_gan_adam.json gan_adam``)
then:  /work/tfvenv/bin/python override_cases.py merge   (joins every override_parts/r*.json into
override_answers.json). Same set-up as keras_cases.py: 8 logical CPUs, few threads, oneDNN off.

The overrides are the TF-backend versions (tf.GradientTape, ``optimizer.apply``,
``metric.update_state``) of the JAX ones in tests/keras_wing/test_keras_override.py, written line for line
after keras-io's "Customizing what happens in fit()" guides:

- ``basic``: ``compute_loss`` (compiled MSE) + the optimizer + every ``self.metrics`` updated
  (the loss tracker with the loss, unweighted, compiled metrics with y, y_pred); logs ``{m.name: m.result()}``
  (keys "loss", "compile_metrics": not get_metrics_result's, so History is the last batch's logs,
  the mean over the replicas of each replica's own results).
- ``sw``: ``basic`` with ``sample_weight`` in fit (passed to the loss and the metrics).
- ``lower``: no compiled loss; its own ``MeanSquaredError``, ``Mean("loss")`` and
  ``MeanAbsoluteError("mae")`` listed in ``metrics`` (keys match: History is the metrics' result).
- ``gan``: a discriminator and a generator (Dense), two SGD optimizers (``d_optimizer`` is the
  compiled one), latent vectors given as ``y`` (no random numbers: the same in both frameworks).
- ``gan_adam``: ``gan`` with two Adam optimizers (``d_optimizer`` Adam(learning_rate=0.01),
  ``g_optimizer`` Adam(learning_rate=0.02)): the generator's optimizer, not the compiled one,
  keeps moments and an iteration count that must carry from step to step. 250 and 330 rows;
  its keys also hold ``iterations`` ({"d": ..., "g": ...}: each optimizer's count after fit).
- ``closs``: only ``compute_loss`` overridden (a mean of squares, no Keras loss object), Keras'
  own train step.
- ``test``: a ``test_step`` override (the guide's): ``evaluate`` of the initial weights.
- ``extra``: ``lower`` whose logs also hold ``batch_mae`` (each replica's own mean absolute
  error of its rows, after the update): names that are not ``get_metrics_result()``'s, so History
  is the last batch's logs averaged over the replicas (each replica's metric results its own).
- ``bn``: ``basic`` on a model with BatchNormalization (per-replica moving statistics), full
  batches only (288 rows).

Data: rows of ``np.random.default_rng(7)``; batch size 48 (divisible by 1, 2, 3 and 8, so the
first batch splits evenly: TF's Keras fails otherwise, keras-team/keras#19246); 250, 257 and 330
rows end with batches of 10, 17 and 42 rows: replicas with fewer rows and, on 8, none.
"""

import glob
import json
import os
import sys
import time

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

if __name__ == "__main__" and sys.argv[1:2] != ["merge"]:
    _cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        _cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(8)]
    )
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)

import keras  # noqa: E402
from keras import ops  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BATCH = 48
ROWS = (250, 257, 330)
_rng = np.random.default_rng(7)
X = _rng.normal(size=(330, 16)).astype("float32")
Y = (X[:, :1] * 0.5 - X[:, 1:2] + 0.1 * _rng.normal(size=(330, 1))).astype("float32")
SW = np.linspace(0.5, 1.5, 330).astype("float32")
REAL = _rng.normal(1.0, 0.5, size=(330, 4)).astype("float32")
Z = _rng.normal(size=(330, 2)).astype("float32")


def fl(a):
    if isinstance(a, dict):
        return {k: fl(v) for k, v in a.items()}
    if isinstance(a, (list, tuple)):
        return [fl(v) for v in a]
    a = np.asarray(a)
    if a.dtype.kind == "f":
        return np.asarray(a, np.float32).astype(np.float64).tolist()
    return a.tolist()


def set_weights(layers, seed):
    rng = np.random.default_rng(seed)
    for layer in layers:
        if isinstance(layer, keras.layers.Dense):
            layer.kernel.assign(rng.normal(0, 0.3, tuple(layer.kernel.shape)).astype("float32"))
            layer.bias.assign(rng.normal(0, 0.1, tuple(layer.bias.shape)).astype("float32"))


def dense_stack(cls, bn=False, seed=1):
    inputs = keras.Input((16,))
    h = keras.layers.Dense(8)(inputs)
    if bn:
        h = keras.layers.BatchNormalization()(h)
    h = keras.layers.ReLU()(h)
    model = cls(inputs, keras.layers.Dense(1)(h))
    set_weights(model.layers, seed)
    return model


class Basic(keras.Model):
    def __init__(self, *args, sample_weighted=False, **kwargs):
        super().__init__(*args, **kwargs)
        self.sample_weighted = sample_weighted

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(grads, self.trainable_variables)
        logs = {}
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred, sample_weight=sample_weight)
            logs[metric.name] = metric.result()
        return logs


class Lower(keras.Model):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")
        self.loss_fn = keras.losses.MeanSquaredError()

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.loss_fn(y, y_pred, sample_weight=sample_weight)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(grads, self.trainable_variables)
        self.loss_tracker.update_state(loss)
        self.mae_metric.update_state(y, y_pred, sample_weight=sample_weight)
        return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}

    @property
    def metrics(self):
        return [self.loss_tracker, self.mae_metric]


class Extra(Lower):
    def train_step(self, data):
        logs = super().train_step(data)
        logs["batch_mae"] = ops.mean(ops.abs(self(data[0]) - data[1]))
        return logs


class ComputeLoss(keras.Model):
    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        return ops.mean(ops.square(y_pred - y))


class OwnTestStep(keras.Model):
    def test_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        y_pred = self(x, training=False)
        loss = self.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight)
        logs = {}
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred, sample_weight=sample_weight)
            logs[metric.name] = metric.result()
        return logs


class GAN(keras.Model):
    def __init__(self, discriminator, generator):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
        self.g_loss_tracker = keras.metrics.Mean(name="g_loss")
        self.loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)
        self.built = True

    @property
    def metrics(self):
        return [self.d_loss_tracker, self.g_loss_tracker]

    def compile(self, d_optimizer, g_optimizer):
        super().compile(optimizer=d_optimizer)
        self.d_optimizer, self.g_optimizer = d_optimizer, g_optimizer
        d_optimizer.build(self.discriminator.trainable_variables)
        g_optimizer.build(self.generator.trainable_variables)

    def train_step(self, data):
        real, z = data
        n = ops.shape(real)[0]
        fake = self.generator(z)
        images = ops.concatenate([fake, real], axis=0)
        labels = ops.concatenate([ops.ones((n, 1)), ops.zeros((n, 1))], axis=0)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(images))
        d_vars = self.discriminator.trainable_variables
        self.d_optimizer.apply(tape.gradient(d_loss, d_vars), d_vars)
        with tf.GradientTape() as tape:
            g_loss = self.loss_fn(ops.zeros((n, 1)), self.discriminator(self.generator(z)))
        g_vars = self.generator.trainable_variables
        self.g_optimizer.apply(tape.gradient(g_loss, g_vars), g_vars)
        self.d_loss_tracker.update_state(d_loss)
        self.g_loss_tracker.update_state(g_loss)
        return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}


def gan_model(adam=False):
    d = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                          keras.layers.Dense(1)])
    g = keras.Sequential([keras.Input((2,)), keras.layers.Dense(8, activation="relu"),
                          keras.layers.Dense(4)])
    set_weights(d.layers, 2)
    set_weights(g.layers, 3)
    model = GAN(d, g)
    if adam:
        model.compile(keras.optimizers.Adam(learning_rate=0.01),
                      keras.optimizers.Adam(learning_rate=0.02))
    else:
        model.compile(keras.optimizers.SGD(0.05), keras.optimizers.SGD(0.1))
    return model


def make(case):
    if case in ("basic", "sw", "bn"):
        model = dense_stack(Basic, bn=case == "bn")
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])
    elif case in ("lower", "extra"):
        model = dense_stack(Lower if case == "lower" else Extra)
        model.compile(optimizer=keras.optimizers.SGD(0.05))
    elif case == "closs":
        model = dense_stack(ComputeLoss)
        model.compile(optimizer=keras.optimizers.SGD(0.05), metrics=["mae"])
    elif case == "test":
        model = dense_stack(OwnTestStep)
        model.compile(loss="mse", metrics=["mae"])
    else:
        model = gan_model(adam=case == "gan_adam")
    return model


def run(strategy, case, rows):
    keras.backend.clear_session()
    with strategy.scope():
        model = make(case)
    out = {}
    if case == "test":
        ev = model.evaluate(X[:rows], Y[:rows], batch_size=BATCH, verbose=0, return_dict=True)
        out["evaluate"] = fl(ev)
    else:
        gan = case in ("gan", "gan_adam")
        x, y = (REAL[:rows], Z[:rows]) if gan else (X[:rows], Y[:rows])
        kw = {"sample_weight": SW[:rows]} if case == "sw" else {}
        hist = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, **kw)
        out["history"] = fl(hist.history)
    out["weights"] = fl(model.get_weights())
    out["weight_names"] = [w.path for w in model.weights]
    if case == "gan_adam":
        out["iterations"] = {k: int(o.iterations.numpy()) for k, o in
                             (("d", model.d_optimizer), ("g", model.g_optimizer))}
    return out


CASES = {"basic": ROWS, "sw": ROWS, "lower": ROWS, "gan": ROWS, "closs": ROWS, "test": ROWS,
         "bn": (288,), "extra": (257, 330), "gan_adam": (250, 330)}


def main():
    r = int(sys.argv[1])
    out_path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, "override_parts",
                                                                  f"r{r}.json")
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(r)])
    ans = {}
    only = sys.argv[3].split(",") if len(sys.argv) > 3 else list(CASES)
    for case, rows_list in ((c, CASES[c]) for c in only):
        for rows in rows_list:
            key, t = f"{case}.n{rows}.r{r}", time.time()
            try:
                ans[key] = run(strategy, case, rows)
            except Exception as e:  # TF's refusal is its answer
                ans[key] = {"error": f"{type(e).__name__}: {str(e)[:600]}"}
            print(key, f"{time.time() - t:.1f}s", ans[key].get("error", ""), flush=True)
    ans[f"_meta.r{r}"] = {"tf": tf.__version__, "keras": keras.__version__, "numpy": np.__version__}
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w") as f:
        json.dump(ans, f)


def merge():
    ans = {}
    for path in sorted(glob.glob(os.path.join(HERE, "override_parts", "r*.json"))):
        with open(path) as f:
            ans.update(json.load(f))
    with open(os.path.join(HERE, "override_answers.json"), "w") as f:
        json.dump(ans, f, sort_keys=True)
    print(len(ans), "keys")


if __name__ == "__main__":
    merge() if sys.argv[1] == "merge" else main()
