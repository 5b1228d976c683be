"""Keras under a strategy at data sizes whose last (or only) batch leaves replicas empty or with
one row, against TF 2.21 + Keras 3 under tf.distribute.MirroredStrategy (the grid of
tests/tf_oracle/keras/keras_grid.py, recorded in keras_grid.json; TF averages the replicas'
local-mean losses, so an uneven split differs from one device and TF is the answer), and
against Keras on one device where the split cannot matter (one replica)."""

import json
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "jax")
from conftest import mirrored, require  # noqa: E402

keras = require("keras")

from test_keras import build, close, compile_  # noqa: E402

GRID_FILE = pathlib.Path(__file__).parents[1] / "tf_oracle" / "keras" / "keras_grid.json"
GRID = {k: v for k, v in json.loads(GRID_FILE.read_text()).items() if not k.startswith("_")}


def finite(answer):
    """Whether TF's answer has no NaN: TF's per-replica batch norm on an empty replica takes
    the moments of no rows (0 / 0) and its gradient 0 * NaN, so its weights turn NaN."""
    return all(np.all(np.isfinite(h)) for h in answer["history"].values())


TF_OK = sorted(k for k, v in GRID.items() if finite(v))
TF_NAN = sorted(k for k, v in GRID.items() if not finite(v))
TOL = 1e-5

_rng = np.random.default_rng(24)  # keras_grid.py's data
GX = _rng.normal(size=(400, 16)).astype("float32")
GY = _rng.integers(0, 2, size=(400,)).astype("int32")
GSW = np.linspace(0.5, 1.5, 400).astype("float32")


def parse(key):
    """'dense.sgd.plain.n33.b32.r8' -> ('dense', 'sgd', 'plain', 33, 32, 8)."""
    model, opt, variant, n, b, r = key.split(".")
    return model, opt, variant, int(n[1:]), int(b[1:]), int(r[1:])


def fit_kwargs(rows, batch, variant):
    """keras_grid.fit_case's arguments."""
    v = min(100, max(1, rows // 3))
    kw = dict(batch_size=batch, epochs=2, shuffle=False, verbose=0)
    kw["validation_data"] = (GX[300 : 300 + v], GY[300 : 300 + v])
    if variant == "sw":
        kw["sample_weight"] = GSW[:rows]
    elif variant == "cw":
        kw["class_weight"] = {0: 1.0, 1: 2.0}
    return kw


def run_case(strategy, model_name, opt, variant, rows, batch):
    """fit (2 epochs, validation data) -> evaluate -> predict, as keras_grid.fit_case."""
    if strategy is None:
        model = compile_(build(model_name), opt)
    else:
        with strategy.scope():
            model = compile_(build(model_name), opt)
    x, y = GX[:rows], GY[:rows]
    hist = model.fit(x, y, **fit_kwargs(rows, batch, variant))
    return {
        "history": hist.history,
        "weights": model.get_weights(),
        "evaluate": model.evaluate(x, y, batch_size=batch, verbose=0, return_dict=True),
        "predict": model.predict(x, batch_size=batch, verbose=0),
    }


def check(got, want, tol=TOL):
    assert set(got["history"]) == set(want["history"])
    for k, v in want["history"].items():
        assert np.all(np.isfinite(got["history"][k])), (k, got["history"][k])
        close(got["history"][k], v, tol, f"history[{k}]")
    for i, (w, t) in enumerate(zip(got["weights"], want["weights"], strict=True)):
        close(w, t, tol, f"weight {i}")
    for k, v in want["evaluate"].items():
        close(got["evaluate"][k], v, tol, f"evaluate[{k}]")
    close(got["predict"], want["predict"], tol, "predict")


@pytest.mark.parametrize("key", TF_OK)
def test_fit_evaluate_predict_with_empty_replicas_match_tf(key):
    model_name, opt, variant, rows, batch, r = parse(key)
    got = run_case(mirrored(r), model_name, opt, variant, rows, batch)
    check(got, GRID[key])


def tf_split(rows, replicas):
    """TF's split of a batch: ceil(rows / replicas) rows each, the last replicas the rest."""
    each = -(-rows // replicas)
    return [min(each, max(0, rows - i * each)) for i in range(replicas)]


def by_hand(model_name, replicas, rows, batch, epochs=2):
    """TF's data-parallel SGD(0.1) step written out on Keras with no strategy, each replica
    with its own batch-norm statistics, where an empty replica contributes nothing: the
    gradient is the sum of the non-empty replicas' local-mean gradients / replicas.
    Returns the trainable variables and replica 0's non-trainable ones."""
    model = compile_(build(model_name))
    tv = [v.value for v in model.trainable_variables]
    own = [[v.value for v in model.non_trainable_variables] for _ in range(replicas)]
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def loss(tv, ntv, x, y):
        logits, ntv = model.stateless_call(tv, ntv, x, training=True)
        return loss_fn(y, logits), ntv

    grad = jax.jit(jax.grad(loss, has_aux=True))
    for _ in range(epochs):
        for start in range(0, rows, batch):
            total = None
            for i, k in enumerate(tf_split(min(batch, rows - start), replicas)):
                if k:
                    g, own[i] = grad(tv, own[i], GX[start : start + k], GY[start : start + k])
                    total = g if total is None else jax.tree.map(jnp.add, total, g)
                start += k
            tv = [w - 0.1 * g / replicas for w, g in zip(tv, total)]
    return tv, own[0]


@pytest.mark.parametrize("key", TF_NAN)
def test_batch_norm_with_empty_replicas_is_finite_where_tf_gives_nan(key):
    """jaxdist differs from TF on purpose: an empty replica's batch norm adds nothing (TF's
    turns the weights NaN). The answer: the step by hand; TF's first epoch's loss and accuracy
    where the first empty replica comes in the epoch's last batch (its loss is computed before
    that step's update)."""
    model_name, opt, variant, rows, batch, r = parse(key)
    assert (model_name, opt, variant) == ("bn", "sgd", "plain"), key
    with mirrored(r).scope():
        model = compile_(build(model_name))
    hist = model.fit(GX[:rows], GY[:rows], batch_size=batch, epochs=2, shuffle=False, verbose=0)
    for k in ("loss", "accuracy"):  # where TF's is still finite (not when every batch has
        if np.isfinite(GRID[key]["history"]["loss"][0]):  # an empty replica, as 10/4/3)
            close(hist.history[k][0], GRID[key]["history"][k][0], TOL, f"TF's epoch-1 {k}")
    tv, ntv = by_hand(model_name, r, rows, batch)
    close_all = zip([*model.trainable_variables, *model.non_trainable_variables], [*tv, *ntv])
    for v, want in close_all:
        close(v.value, want, TOL, v.path)
    predictions = model.predict(GX[:rows], batch_size=batch, verbose=0)
    assert np.all(np.isfinite(predictions))
    assert np.all(np.isfinite(model.evaluate(GX[:rows], GY[:rows], batch_size=batch, verbose=0)))


@pytest.mark.parametrize(("rows", "batch"), [(33, 32), (1, 1), (10, 4)])
def test_one_replica_is_keras_on_one_device(rows, batch):
    want = run_case(None, "bn", "sgd", "sw", rows, batch)
    check(run_case(mirrored(1), "bn", "sgd", "sw", rows, batch), want)
