"""Keras `fit` under a strategy: batches handed to the step as they are, and
``steps_per_execution=k`` run as k steps in one program (TF's ``tf.function`` around k steps).

Expected values come from the same model trained one step per program (``k = 1``, itself
checked against TF's recorded answers in tests/keras_wing/test_keras.py) and from plain Keras."""

import os

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "jax")
from conftest import dev_required, mirrored, require  # noqa: E402

keras = require("keras")

import jaxdist as jd  # noqa: E402

if keras.backend.backend() != "jax":  # Keras was imported first with another backend
    if dev_required():
        raise RuntimeError(
            f"tests/keras_wing/test_keras_fused.py needs KERAS_BACKEND=jax; got {keras.backend.backend()}"
        )
    pytest.skip("needs KERAS_BACKEND=jax", allow_module_level=True)

rng = np.random.default_rng(3)
ROWS, BATCH = 330, 32  # 10 full batches and a partial one of 10 rows
X = rng.normal(size=(ROWS, 8)).astype("float32")
Y = rng.integers(0, 3, size=(ROWS,)).astype("int32")


def build(bn, k):
    L = keras.layers
    layers = [L.Input((8,)), L.Dense(16)]
    layers += [L.BatchNormalization(), L.ReLU()] if bn else [L.ReLU()]
    model = keras.Sequential([*layers, L.Dense(3)])
    r = np.random.default_rng(1)
    model.set_weights([r.normal(0, 0.3, w.shape).astype("float32") for w in model.get_weights()])
    model.compile(
        optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        steps_per_execution=k,
    )
    return model


def trained(strategy, bn, k, **kw):
    if strategy is None:
        model = build(bn, k)
    else:
        with strategy.scope():
            model = build(bn, k)
    hist = model.fit(X, Y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, **kw)
    return model, hist


@pytest.mark.parametrize("bn", [False, True], ids=["dense", "batchnorm"])
@pytest.mark.parametrize("n", [1, 4], ids=["r1", "r4"])
def test_k_steps_in_one_program_give_the_weights_of_single_steps(n, bn):
    single, h1 = trained(mirrored(n), bn, 1)
    fused, h4 = trained(mirrored(n), bn, 4)
    for a, b in zip(fused.get_weights(), single.get_weights()):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    for key, values in h1.history.items():
        np.testing.assert_allclose(h4.history[key], values, rtol=0, atol=1e-6)
    # k = 1: a full batch and the partial one. k = 4 over 10 full batches and a partial one:
    # 4 + 4 in one program each (traced once), then 2 full batches and the partial one singly.
    assert single.train_function.traces == 2
    assert fused.train_function.traces == 3
    ev1 = single.evaluate(X, Y, batch_size=BATCH, verbose=0)
    fused.compile(fused.optimizer, fused.loss, metrics=["accuracy"], steps_per_execution=4)
    ev4 = fused.evaluate(X, Y, batch_size=BATCH, verbose=0)
    np.testing.assert_allclose(ev4, ev1, rtol=0, atol=1e-6)
    p1 = single.predict(X, batch_size=BATCH, verbose=0)
    np.testing.assert_allclose(fused.predict(X, batch_size=BATCH, verbose=0), p1, atol=1e-6)


def test_callbacks_see_one_batch_end_per_execution():
    # TF/Keras: with steps_per_execution=k, on_train_batch_begin/end run once per k batches
    # (with the index of the execution's first batch, and that plus k - 1: Keras' epoch iterator
    # says 11 for the last execution of batches 8, 9, 10 too).
    seen = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_begin=lambda b, logs: seen.append(("begin", b)),
        on_train_batch_end=lambda b, logs: seen.append(("end", b)),
    )
    trained(mirrored(2), False, 4, callbacks=[record])
    epoch = [("begin", 0), ("end", 3), ("begin", 4), ("end", 7), ("begin", 8), ("end", 11)]
    assert seen == epoch * 2


def test_one_replica_scope_gives_plain_keras_weights():
    plain, hp = trained(None, True, 1)
    scoped, hs = trained(jd.OneDeviceStrategy("/cpu:0"), True, 1)
    for a, b in zip(scoped.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    np.testing.assert_allclose(hs.history["loss"], hp.history["loss"], rtol=0, atol=1e-6)


@pytest.mark.parametrize("n", [1, 4], ids=["r1", "r4"])
def test_fit_inside_the_scope_gives_the_weights_of_fit_outside(n):
    # Inside the scope Keras first puts each batch on one device (jaxdist's data layout); the
    # step reads it back and splits it as it splits NumPy batches.
    outside, h1 = trained(mirrored(n), True, 1)
    strategy = mirrored(n)
    with strategy.scope():
        inside = build(True, 1)
        h2 = inside.fit(X, Y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    for a, b in zip(inside.get_weights(), outside.get_weights()):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    np.testing.assert_allclose(h2.history["loss"], h1.history["loss"], rtol=0, atol=1e-6)
    assert inside.train_function.traces == 2  # a full batch and the partial one
