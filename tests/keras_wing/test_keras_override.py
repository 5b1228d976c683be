"""A Keras model's own train_step / test_step / compute_loss under jaxdist strategies, against
TF 2.21 + Keras 3 (TF backend) under tf.distribute.MirroredStrategy: the same overrides written
with tf.GradientTape in tests/tf_oracle/keras/override_cases.py, recorded in override_answers.json
(weights and History after fit; evaluate's result), on 1, 2, 3 and 8 replicas, with last batches
that leave replicas with fewer rows and, on 8, none."""

import json
import os
import pathlib

import jax
import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "jax")
from conftest import mirrored, require  # noqa: E402

keras = require("keras")

from keras import ops  # noqa: E402

ORACLE = pathlib.Path(__file__).parents[1] / "tf_oracle" / "keras" / "override_answers.json"
TF = json.loads(ORACLE.read_text())
TOL = 1e-5
BATCH = 48

_rng = np.random.default_rng(7)  # override_cases.py's data
X = _rng.normal(size=(330, 16)).astype("float32")
Y = (X[:, :1] * 0.5 - X[:, 1:2] + 0.1 * _rng.normal(size=(330, 1))).astype("float32")
SW = np.linspace(0.5, 1.5, 330).astype("float32")
REAL = _rng.normal(1.0, 0.5, size=(330, 4)).astype("float32")
Z = _rng.normal(size=(330, 2)).astype("float32")

if keras.backend.backend() != "jax":
    pytest.skip("needs KERAS_BACKEND=jax", allow_module_level=True)


def set_weights(layers, seed):
    rng = np.random.default_rng(seed)
    for layer in layers:
        if isinstance(layer, keras.layers.Dense):
            layer.kernel.assign(rng.normal(0, 0.3, tuple(layer.kernel.shape)).astype("float32"))
            layer.bias.assign(rng.normal(0, 0.1, tuple(layer.bias.shape)).astype("float32"))


def dense_stack(cls, bn=False):
    inputs = keras.Input((16,))
    h = keras.layers.Dense(8)(inputs)
    if bn:
        h = keras.layers.BatchNormalization()(h)
    h = keras.layers.ReLU()(h)
    model = cls(inputs, keras.layers.Dense(1)(h))
    set_weights(model.layers, 1)
    return model


def update_metrics(model, metrics_variables, loss, y, y_pred, sample_weight):
    """The guide's loop over ``self.metrics``: the loss tracker with the loss, the others with
    y and y_pred; returns the logs and the new metric variables."""
    logs, new = {}, []
    for metric in model.metrics:
        mv = metrics_variables[len(new) : len(new) + len(metric.variables)]
        if metric.name == "loss":
            mv = metric.stateless_update_state(mv, loss)
        else:
            mv = metric.stateless_update_state(mv, y, y_pred, sample_weight=sample_weight)
        logs[metric.name] = metric.stateless_result(mv)
        new += mv
    return logs, new


class Basic(keras.Model):
    """keras-io's "Customizing what happens in fit() with JAX", first example."""

    def compute_loss_and_updates(self, tv, ntv, mv, x, y, sample_weight, training=False):
        y_pred, ntv = self.stateless_call(tv, ntv, x, training=training)
        loss, (tv, ntv, mv) = self.stateless_compute_loss(
            tv, ntv, mv, x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training
        )
        return loss, (y_pred, ntv, mv)

    def train_step(self, state, data):
        tv, ntv, ov, mv = state
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        grad_fn = jax.value_and_grad(self.compute_loss_and_updates, has_aux=True)
        (loss, (y_pred, ntv, mv)), grads = grad_fn(tv, ntv, mv, x, y, sample_weight, True)
        tv, ov = self.optimizer.stateless_apply(ov, grads, tv)
        logs, mv = update_metrics(self, mv, loss, y, y_pred, sample_weight)
        return logs, (tv, ntv, ov, mv)


class Lower(keras.Model):
    """The guide's "Going lower-level": its own loss, loss tracker and MAE metric."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")
        self.loss_fn = keras.losses.MeanSquaredError()

    def loss_and_updates(self, tv, ntv, x, y, sample_weight):
        y_pred, ntv = self.stateless_call(tv, ntv, x, training=True)
        return self.loss_fn(y, y_pred, sample_weight=sample_weight), (y_pred, ntv)

    def train_step(self, state, data):
        tv, ntv, ov, mv = state
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        grad_fn = jax.value_and_grad(self.loss_and_updates, has_aux=True)
        (loss, (y_pred, ntv)), grads = grad_fn(tv, ntv, x, y, sample_weight)
        tv, ov = self.optimizer.stateless_apply(ov, grads, tv)
        k = len(self.loss_tracker.variables)
        loss_vars = self.loss_tracker.stateless_update_state(mv[:k], loss)
        mae_vars = self.mae_metric.stateless_update_state(mv[k:], y, y_pred, sample_weight)
        logs = {
            "loss": self.loss_tracker.stateless_result(loss_vars),
            "mae": self.mae_metric.stateless_result(mae_vars),
        }
        return logs, (tv, ntv, ov, loss_vars + mae_vars)

    @property
    def metrics(self):
        return [self.loss_tracker, self.mae_metric]


class Extra(Lower):
    """Logs that are not ``self.metrics``' names: History is the last batch's logs, averaged
    over the replicas (TF's reduction of a step's outputs), each replica's metric results its
    own (sync-on-read metric variables)."""

    def train_step(self, state, data):
        logs, state = super().train_step(state, data)
        x, y = data
        y_pred, _ = self.stateless_call(state[0], state[1], x)
        logs["batch_mae"] = ops.mean(ops.abs(y_pred - y))
        return logs, state


class ComputeLoss(keras.Model):
    """Only compute_loss overridden: a mean of squares written by hand, no Keras loss."""

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        return ops.mean(ops.square(y_pred - y))


class OwnTestStep(keras.Model):
    """The guide's "Providing your own evaluation step"."""

    def test_step(self, state, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        tv, ntv, mv = state
        y_pred, ntv = self.stateless_call(tv, ntv, x, training=False)
        loss, (tv, ntv, mv) = self.stateless_compute_loss(
            tv, ntv, mv, x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=False
        )
        logs, mv = update_metrics(self, mv, loss, y, y_pred, sample_weight)
        return logs, (tv, ntv, mv)


class GAN(keras.Model):
    """Two models, two optimizers: ``d_optimizer`` is the compiled one, in Keras' state; the
    generator's is read from its variables and its new variables are dropped by the step (as a
    Keras JAX step must: they are not in Keras' state). TF keeps them, and so does jaxdist."""

    def __init__(self, discriminator, generator):
        super().__init__()
        self.discriminator, self.generator = discriminator, generator
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

    def train_step(self, state, data):
        tv, ntv, ov, mv = state
        real, z = data
        nd = len(self.discriminator.trainable_variables)
        d_tv, g_tv = tv[:nd], tv[nd:]
        d_ntv = ntv[: len(self.discriminator.non_trainable_variables)]
        g_ntv = ntv[len(d_ntv) :]
        n = real.shape[0]
        fake, _ = self.generator.stateless_call(g_tv, g_ntv, z)
        images = ops.concatenate([fake, real], axis=0)
        labels = ops.concatenate([ops.ones((n, 1)), ops.zeros((n, 1))], axis=0)

        def d_loss_fn(d_tv):
            logits, _ = self.discriminator.stateless_call(d_tv, d_ntv, images)
            return self.loss_fn(labels, logits)

        d_loss, d_grads = jax.value_and_grad(d_loss_fn)(d_tv)
        d_tv, ov = self.d_optimizer.stateless_apply(ov, d_grads, d_tv)

        def g_loss_fn(g_tv):
            fake, _ = self.generator.stateless_call(g_tv, g_ntv, z)
            logits, _ = self.discriminator.stateless_call(d_tv, d_ntv, fake)
            return self.loss_fn(ops.zeros((n, 1)), logits)

        g_loss, g_grads = jax.value_and_grad(g_loss_fn)(g_tv)
        g_ov = [v.value for v in self.g_optimizer.variables]
        g_tv, _ = self.g_optimizer.stateless_apply(g_ov, g_grads, g_tv)
        k = len(self.d_loss_tracker.variables)
        d_vars = self.d_loss_tracker.stateless_update_state(mv[:k], d_loss)
        g_vars = self.g_loss_tracker.stateless_update_state(mv[k:], g_loss)
        logs = {
            "d_loss": self.d_loss_tracker.stateless_result(d_vars),
            "g_loss": self.g_loss_tracker.stateless_result(g_vars),
        }
        return logs, (d_tv + g_tv, ntv, ov, d_vars + g_vars)


def gan_model(adam=False):
    d = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)]
    )
    g = keras.Sequential(
        [keras.Input((2,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(4)]
    )
    set_weights(d.layers, 2)
    set_weights(g.layers, 3)
    model = GAN(d, g)
    if adam:  # both optimizers keep moments and a step count from step to step
        model.compile(keras.optimizers.Adam(0.01), keras.optimizers.Adam(0.02))
    else:
        model.compile(keras.optimizers.SGD(0.05), keras.optimizers.SGD(0.1))
    return model


def make(case, **kw):
    if case in ("basic", "sw", "bn"):
        model = dense_stack(Basic, bn=case == "bn")
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"], **kw)
    elif case in ("lower", "extra"):
        model = dense_stack(Lower if case == "lower" else Extra)
        model.compile(optimizer=keras.optimizers.SGD(0.05), **kw)
    elif case == "closs":
        model = dense_stack(ComputeLoss)
        model.compile(optimizer=keras.optimizers.SGD(0.05), metrics=["mae"], **kw)
    elif case == "test":
        model = dense_stack(OwnTestStep)
        model.compile(loss="mse", metrics=["mae"], **kw)
    else:
        model = gan_model(adam=case == "gan_adam")
    return model


def run(strategy, case, rows, **kw):
    with strategy.scope():
        model = make(case, **kw)
    out = {}
    if case == "test":
        out["evaluate"] = model.evaluate(
            X[:rows], Y[:rows], batch_size=BATCH, verbose=0, return_dict=True
        )
    else:
        x, y = (REAL[:rows], Z[:rows]) if case.startswith("gan") else (X[:rows], Y[:rows])
        fit_kw = {"sample_weight": SW[:rows]} if case == "sw" else {}
        hist = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, **fit_kw)
        out["history"] = hist.history
    if case == "gan_adam":
        out["iterations"] = {
            "d": int(model.d_optimizer.iterations.value),
            "g": int(model.g_optimizer.iterations.value),
        }
    out["weights"] = model.get_weights()
    return out


def assert_close(got, want, where):
    if isinstance(want, dict):
        assert set(got) == set(want), (where, sorted(got), sorted(want))
        for k in want:
            assert_close(got[k], want[k], f"{where}.{k}")
        return
    if isinstance(want, list) and want and isinstance(want[0], dict):  # History of a dict
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close(g, w, f"{where}[{i}]")
        return
    got = (
        np.asarray(got, np.float64)
        if not isinstance(got, list)
        else np.asarray([np.asarray(g, np.float64) for g in got])
    )
    np.testing.assert_allclose(got, np.asarray(want, np.float64), atol=TOL, rtol=0, err_msg=where)


def without_nan(got, want):
    """TF's History where it is a number. A replica with no rows in a ``compute_loss`` override
    that means by hand: TF's loss tracker adds its NaN (weighted by 0 rows: NaN) to the epoch's
    loss; jaxdist's empty replica adds nothing (docs/guides/keras.md), and its loss is finite."""
    out = {}
    for k, values in want.items():
        nan = [i for i, v in enumerate(values) if v != v]
        assert np.all(np.isfinite(np.asarray(got[k])[nan])), (k, got[k])
        out[k] = [v for i, v in enumerate(values) if i not in nan]
        got[k] = [v for i, v in enumerate(got[k]) if i not in nan]
    return out


def check(case, rows, r, **kw):
    want = TF[f"{case}.n{rows}.r{r}"]
    got = run(mirrored(r), case, rows, **kw)
    if "history" in want:
        history = want["history"]
        if case == "closs":
            history = without_nan(got["history"], history)
        assert_close(got["history"], history, "history")
    if "evaluate" in want:
        assert_close(got["evaluate"], want["evaluate"], "evaluate")
    if "iterations" in want:
        assert got["iterations"] == want["iterations"]
    assert len(got["weights"]) == len(want["weights"])
    for i, (g, w) in enumerate(zip(got["weights"], want["weights"])):
        np.testing.assert_allclose(g, np.asarray(w), atol=TOL, rtol=0, err_msg=f"weight {i}")


# every recorded answer: each step at 250, 257 and 330 rows (last batches of 10, 17 and 42:
# replicas with fewer rows and, on 8, none), batch norm at 288, on 1, 2, 3 and 8 replicas
RECORDED = sorted(k for k in TF if not k.startswith("_"))


@pytest.mark.parametrize("key", RECORDED)
def test_override_matches_tf(key):
    """Weights, History (or ``evaluate``'s result) and, for two Adams, each optimizer's
    ``iterations``: TF's within 1e-5. ``sw``: ``sample_weight`` through the step to the loss
    and metrics; ``bn``: batch-norm moving statistics kept per replica (full batches: TF's
    per-replica statistics of no rows are NaN)."""
    case, rows, r = key.split(".")
    check(case, int(rows[1:]), int(r[1:]))


@pytest.mark.parametrize("case", ["basic", "gan", "gan_adam"])
def test_steps_per_execution_gives_the_answers_of_one_step(case):
    """``steps_per_execution=4``: TF's own fails there on several replicas (its README, surprise
    5), so the answer is TF's with one step an execution."""
    if case.startswith("gan"):  # GAN.compile takes the two optimizers only
        with mirrored(8).scope():
            model = gan_model(adam=case == "gan_adam")
        model.steps_per_execution = 4
        model.fit(REAL[:330], Z[:330], batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
        got = {"weights": model.get_weights()}
    else:
        got = run(mirrored(8), case, 330, steps_per_execution=4)
    want = TF[f"{case}.n330.r8"]
    for i, (g, w) in enumerate(zip(got["weights"], want["weights"])):
        np.testing.assert_allclose(g, np.asarray(w), atol=TOL, rtol=0, err_msg=f"weight {i}")
    if "history" in got:
        assert_close(got["history"], want["history"], "history")


class ClipsByHand(Basic):
    """A weight changed after the optimizer by the step itself: TF lets each replica assign its
    own copy; jaxdist cannot tell it is the same everywhere."""

    def train_step(self, state, data):
        logs, (tv, ntv, ov, mv) = super().train_step(state, data)
        return logs, ([ops.clip(v, -1.0, 1.0) for v in tv], ntv, ov, mv)


def test_a_weight_changed_by_hand_is_an_error_naming_it():
    with mirrored(2).scope():
        model = dense_stack(ClipsByHand)
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    with pytest.raises(NotImplementedError, match=r"dense(_\d+)?/kernel.*stateless_apply"):
        model.fit(X[:96], Y[:96], batch_size=BATCH, epochs=1, verbose=0)


class Doubles(keras.Model):
    def predict_step(self, state, data):
        y_pred, ntv = super().predict_step(state, data)
        return y_pred * 2.0, ntv


def test_predict_step_override_runs_on_every_replica_rows():
    """Each replica's rows (the last batch of 10 rows leaves three of 8 replicas empty),
    concatenated: twice Keras' prediction on one device."""
    want = 2.0 * dense_stack(keras.Model).predict(X[:250], batch_size=BATCH, verbose=0)
    with mirrored(8).scope():
        model = dense_stack(Doubles)
    got = model.predict(X[:250], batch_size=BATCH, verbose=0)
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)


OUTSIDE = {}


class OptimizerOutside(GAN):
    """The generator's optimizer is not held by the model (a property over a module's dict):
    fit could not keep its state."""

    @property
    def g_optimizer(self):
        return OUTSIDE["g"]

    @g_optimizer.setter
    def g_optimizer(self, value):
        OUTSIDE["g"] = value


def test_an_optimizer_the_model_does_not_hold_is_an_error_before_any_work():
    with mirrored(2).scope():
        model = gan_model(adam=True)
        outside = OptimizerOutside(model.discriminator, model.generator)
        outside.compile(keras.optimizers.Adam(0.01), keras.optimizers.Adam(0.02))
    before = outside.get_weights()
    with pytest.raises(ValueError, match="neither model.optimizer nor a built optimizer"):
        outside.fit(REAL[:96], Z[:96], batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    for b, a in zip(before, outside.get_weights()):
        np.testing.assert_array_equal(a, b)


FLAGS: dict = {}  # a Keras variable the model does not hold


class FlaggingGAN(GAN):
    """A GAN whose step also assigns another variable (``.assign``, stateful: Keras has
    emptied variables during ``fit``, so a constant)."""

    def train_step(self, state, data):
        FLAGS["seen"].assign(1.0)
        return super().train_step(state, data)


def test_an_assignment_the_scope_of_a_second_optimizer_would_drop_is_an_error():
    """With a second optimizer its variables are read through a `keras.StatelessScope`; any
    other ``.assign`` in the step would be kept by that scope and dropped: an error naming it."""
    with mirrored(2).scope():
        base = gan_model(adam=True)
        model = FlaggingGAN(base.discriminator, base.generator)
        model.compile(keras.optimizers.Adam(0.01), keras.optimizers.Adam(0.02))
        FLAGS["seen"] = keras.Variable(0.0, name="seen", trainable=False)
    with pytest.raises(ValueError, match="assigned a variable .* would be dropped"):
        model.fit(REAL[:96], Z[:96], batch_size=BATCH, epochs=1, shuffle=False, verbose=0)


@pytest.mark.parametrize("r", [1, 2], ids=lambda r: f"r{r}")
def test_the_second_optimizer_is_read_afresh_and_written_back(r):
    """Its variables are the step's inputs, not constants of its trace: a learning rate the
    host set to 0 stops the generator; its step count goes on from where fit left it."""
    with mirrored(r).scope():
        model = gan_model(adam=True)
    fit = dict(batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    model.fit(REAL[:96], Z[:96], **fit)  # two steps
    assert int(model.g_optimizer.iterations.value) == 2
    model.g_optimizer.learning_rate.assign(0.0)
    g_before = [np.asarray(w) for w in model.generator.get_weights()]
    d_before = [np.asarray(w) for w in model.discriminator.get_weights()]
    model.fit(REAL[:96], Z[:96], **fit)
    assert int(model.g_optimizer.iterations.value) == 4
    for b, a in zip(g_before, model.generator.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert any(
        not np.array_equal(a, b) for a, b in zip(d_before, model.discriminator.get_weights())
    )


@pytest.mark.parametrize("case", ["basic", "lower", "sw", "gan"])
def test_keras_data_parallel_is_a_second_reference_on_full_batches(case):
    """Keras 3's own ``DataParallel`` (JAX backend, 8 devices, one global view of the step)
    as a second reference where it runs: full batches (it cannot split a last batch of 10, 17
    or 42 rows over 8 devices). Same weights; the losses the step tracks are TF's, scaled by
    ``1 / replicas`` (docs/guides/keras.md), its other metrics the same."""
    rows = 288
    x, y = (REAL[:rows], Z[:rows]) if case == "gan" else (X[:rows], Y[:rows])
    fit_kw = {"sample_weight": SW[:rows]} if case == "sw" else {}
    with keras.distribution.DataParallel(devices=jax.devices()[:8]).scope():
        model = make(case)
        hist = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, **fit_kw)
        want_weights, want_history = model.get_weights(), hist.history
    got = run(mirrored(8), case, rows)
    for i, (g, w) in enumerate(zip(got["weights"], want_weights)):
        np.testing.assert_allclose(g, np.asarray(w), atol=TOL, rtol=0, err_msg=f"weight {i}")
    assert set(got["history"]) == set(want_history)
    for key, values in want_history.items():
        scale = 1 / 8 if "loss" in key else 1
        np.testing.assert_allclose(got["history"][key], np.asarray(values) * scale, atol=TOL)
