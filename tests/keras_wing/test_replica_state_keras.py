"""Keras 3 state inside the replica step, as TF's custom-training tutorial keeps it: a metric's
``update_state`` (sync-on-read: each replica its own total, summed when read) and the
optimizer's ``apply_gradients`` (the gradients summed over the replicas first, the weights
mirrored), eagerly and under ``jd.function``.

Expected values: NumPy on the whole batch, and the same program on one replica.
"""

import functools
import os

import numpy as np
import pytest
from conftest import mirrored

os.environ.setdefault("KERAS_BACKEND", "jax")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "jax":
    pytest.skip("the Keras integration needs the JAX backend", allow_module_level=True)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxdist as jd  # noqa: E402
from jaxdist._state.aggregation import SyncOnRead  # noqa: E402

GLOBAL = 16


def _data(rows=48):
    rng = np.random.RandomState(0)
    return rng.rand(rows, 5).astype(np.float32), rng.randint(0, 3, rows)


def _model():
    m = keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(3)]
    )
    m.set_weights(
        [
            np.random.RandomState(i).randn(*np.shape(w)).astype(np.float32) * 0.5
            for i, w in enumerate(m.get_weights())
        ]
    )
    return m


def _tutorial(n, how, optimizer, epochs=2, rows=48):
    """TF's custom-training tutorial in its own shape on ``n`` replicas: the losses, the
    accuracy per epoch and the weights."""
    strategy = mirrored(n)
    x, y = _data(rows)
    with strategy.scope():
        model = _model()
        opt = optimizer()
        accuracy = keras.metrics.SparseCategoricalAccuracy()
        opt.build(model.trainable_variables)
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def train_step(xb, yb):
        tv = [v.value for v in model.trainable_variables]
        ntv = [v.value for v in model.non_trainable_variables]

        def loss_fn(tv):
            logits, _ = model.stateless_call(tv, ntv, xb, training=True)
            per_example = loss_object(yb, logits)
            return jd.nn.compute_average_loss(per_example, global_batch_size=GLOBAL), logits

        (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(tv)
        opt.apply_gradients(zip(grads, model.trainable_variables))  # summed over replicas
        accuracy.update_state(yb, logits)  # each replica its own total and count
        return loss

    def distributed_train_step(batch):
        per_replica = strategy.run(train_step, args=batch)
        return strategy.reduce("SUM", per_replica, axis=None)

    step = jd.function(distributed_train_step) if how == "jd.function" else distributed_train_step
    data = strategy.experimental_distribute_dataset(
        [(x[i : i + GLOBAL], y[i : i + GLOBAL]) for i in range(0, len(x), GLOBAL)]
    )
    losses, accuracies = [], []
    for _ in range(epochs):
        losses += [float(step(batch)) for batch in data]
        accuracies.append(float(accuracy.result()))
        accuracy.reset_state()
    weights = [np.asarray(w) for w in model.get_weights()]
    return losses, accuracies, weights, int(opt.iterations)


# Every `_tutorial` run makes its model and its step anew: one step code over other captured
# objects each time, which strategy.run counts (and names, past 8 compiles) as it should.
MANY_MODELS = pytest.mark.filterwarnings("ignore:strategy.run has compiled:UserWarning")

OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.1),
    "adam": lambda: keras.optimizers.Adam(0.01),
}


@functools.cache
def _one_device(opt, rows=48):
    """The reference: the same program on one replica (computed once per worker process)."""
    return _tutorial(1, "eager", OPTIMIZERS[opt], rows=rows)


@MANY_MODELS
@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
@pytest.mark.parametrize("n", (2, 4, 8))
@pytest.mark.parametrize("how", ["jd.function", "eager"])
def test_the_tutorial_step_with_a_keras_optimizer_and_metric_equals_one_device(how, n, opt):
    losses, accuracies, weights, steps = _tutorial(n, how, OPTIMIZERS[opt])
    want_losses, want_acc, want_weights, _ = _one_device(opt)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    np.testing.assert_allclose(accuracies, want_acc, rtol=1e-6)
    for w, want in zip(weights, want_weights):
        np.testing.assert_allclose(w, want, rtol=1e-5, atol=1e-6)
    assert steps == 6  # the iteration count: once per step, not once per replica


@MANY_MODELS
@pytest.mark.parametrize("n", (3, 8))
@pytest.mark.parametrize("how", ["jd.function", "eager"])
def test_the_tutorial_step_with_a_partial_last_batch_equals_one_device(how, n):
    """45 rows in batches of 16: the last batch (13 rows) leaves replicas short or empty."""
    sgd = OPTIMIZERS["sgd"]
    losses, accuracies, weights, steps = _tutorial(n, how, sgd, rows=45)
    want_losses, want_acc, want_weights, _ = _one_device("sgd", rows=45)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    np.testing.assert_allclose(accuracies, want_acc, rtol=1e-6)
    for w, want in zip(weights, want_weights):
        np.testing.assert_allclose(w, want, rtol=1e-5, atol=1e-6)
    assert steps == 6


@pytest.mark.parametrize("n", (1, 2, 4, 8))
@pytest.mark.parametrize("how", ["jd.function", "eager"])
def test_a_keras_metric_updated_in_the_replica_step_reads_the_sum_of_the_replicas(how, n):
    strategy = mirrored(n)
    with strategy.scope():
        mean = keras.metrics.Mean()
        total = keras.metrics.Sum()

    def step(x):
        mean.update_state(x)
        total.update_state(x)
        return x

    def call(batch):
        return strategy.run(step, args=(batch,))

    f = jd.function(call) if how == "jd.function" else call
    x = np.arange(16, dtype=np.float32)
    (batch,) = strategy.experimental_distribute_dataset([x])
    f(batch)
    f(batch)
    assert float(mean.result()) == pytest.approx(float(x.mean()))
    assert float(total.result()) == pytest.approx(2 * float(x.sum()))
    if n > 1:  # TF's sync-on-read variable: each replica's own count, summed when read
        count = mean.variables[1].value
        assert isinstance(count, SyncOnRead)
        assert [float(c) for c in count.values] == [2 * 16 / n] * n
    mean.reset_state()
    f(batch)
    assert float(mean.result()) == pytest.approx(float(x.mean()))


def test_a_sync_on_read_value_reads_as_its_aggregate_on_the_host():
    v = SyncOnRead.from_stacked(jnp.asarray([1.0, 2.0, 3.0]))
    assert float(v) == 6.0 and np.asarray(v).tolist() == 6.0 and float(jnp.asarray(v) + 1) == 7.0
    assert f"{v:.1f}" == "6.0" and v.shape == () and v.dtype == jnp.float32
    strategy = mirrored(3)
    assert float(strategy.reduce("MEAN", v, axis=None)) == 2.0


@pytest.mark.parametrize("n", (1, 2, 8))
def test_a_step_differentiating_keras_conv_variables_eagerly_equals_jd_function(n):
    """conv -> relu -> conv on a model made in the scope (its variables placed on the
    scope's mesh): the eager step's gradients equal the same step's under jd.function."""
    strategy = mirrored(n)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((6, 6, 2)),
                keras.layers.Conv2D(3, 3, activation="relu"),
                keras.layers.Conv2D(2, 3),
            ]
        )

    def grads(x):
        tv = [v.value for v in model.trainable_variables]
        ntv = [v.value for v in model.non_trainable_variables]

        def loss(tv):
            out, _ = model.stateless_call(tv, ntv, x)
            return jnp.mean(out**2)

        return jd.get_replica_context().all_reduce("SUM", jax.grad(loss)(tv))

    def call(batch):
        return strategy.run(grads, args=(batch,))

    x = np.random.RandomState(0).rand(8, 6, 6, 2).astype(np.float32)
    (batch,) = strategy.experimental_distribute_dataset([x])
    eager = strategy.experimental_local_results(call(batch))[0]
    compiled = strategy.experimental_local_results(jd.function(call)(batch))[0]
    for a, b in zip(eager, compiled):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_fit_walks_no_state_of_its_own_step(n, monkeypatch):
    """``model.fit``'s step takes Keras' state as arguments (`explicit_state`): no trace walks
    the objects it reaches (the model, the optimizer, the strategy) for variables, which cost
    seconds per trace; a custom loop's step is still walked. One replica (its own program), and
    10 rows in batches of 4 on 3 replicas: a partial last batch (the replay path) too."""
    from jaxdist._state import capture

    walked, walk = [], capture.walk

    def counting(fn, *args, **kwargs):
        walked.append(fn)
        return walk(fn, *args, **kwargs)

    monkeypatch.setattr(capture, "walk", counting)
    strategy = mirrored(n)
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
    history = model.fit(np.ones((10, 3)), np.ones((10, 1)), batch_size=4, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2
    assert walked == []
    with strategy.scope():
        w = jnp.ones(3)
    strategy.run(lambda x: jnp.sum(w * x), args=(jnp.ones(3),))
    assert walked  # (the check can fail: a plain step is walked)
