"""Keras' epoch iterator in a strategy's scope hands the step the host's batches as they are
(`jaxdist._keras.batches`): no placement per batch with the scope's data layout, which the
step would do again (a per-step cost that once made a tiny model's `fit` in a one-device
scope 0.47x plain Keras' speed; the timing guard is tests/package/test_speed_guard.py).

Expected values: the number of placements (none) and the weights of the same model trained by
plain Keras on one device (one replica, and a batch split over 2 replicas whose summed
gradients are the whole batch's).
"""

import os

import jax
import numpy as np
import pytest
from conftest import mirrored

os.environ.setdefault("KERAS_BACKEND", "jax")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "jax":
    pytest.skip("the Keras integration needs the JAX backend", allow_module_level=True)


def _model():
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


@pytest.mark.parametrize("inside", [True, False], ids=["fit in the scope", "fit outside"])
@pytest.mark.parametrize("n", (1, 2))
def test_fit_in_a_scope_places_no_batch_per_step(monkeypatch, n, inside):
    x = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    y = np.random.default_rng(1).normal(size=(64, 3)).astype(np.float32)
    plain = _model()
    plain.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    s = mirrored(n)
    with s.scope():
        model = _model()
    calls = []
    original = jax.make_array_from_process_local_data
    monkeypatch.setattr(
        jax,
        "make_array_from_process_local_data",
        lambda *a, **k: calls.append(1) or original(*a, **k),
    )
    if inside:
        with s.scope():
            model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    else:
        model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    assert calls == []
    for ours, theirs in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
