"""Reading a Keras model's distributed state on the host after a custom loop's steps.

A ``BatchNormalization``'s moving statistics are mirrored variables of aggregation ``NONE``:
in a replica step each replica assigns its own batch's statistics, and TF 2.21 keeps each
replica's value (``MirroredVariable``: each component updated on its own device); a read
outside the replicas (``model.get_weights()``, ``v.numpy()``, ``np.asarray(v)``, a checkpoint)
is the first replica's, TF's primary component. Before, jaxdist kept a plain `PerReplica`
there and every such read raised ``TypeError: A PerReplica holds a different value on each
replica`` (Model Garden's ResNet custom loop stopped at its first checkpoint).

Expected values: the moving statistics computed with NumPy from replica 0's rows and the
layer's momentum (Keras' documented update), and TF 2.21's recorded answers
(``vars.tfvar.mirrored.none.*`` in tests/tf_oracle/answers.json) for a variable of
aggregation ``NONE`` assigned ``r + 2.0`` on replica ``r``.
"""

import json
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import mirrored

os.environ.setdefault("KERAS_BACKEND", "jax")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "jax":
    pytest.skip("the Keras integration needs the JAX backend", allow_module_level=True)

import jaxdist as jd  # noqa: E402

ANSWERS = json.loads((pathlib.Path(__file__).parents[1] / "tf_oracle" / "answers.json").read_text())
GLOBAL, FEATURES, MOMENTUM, STEPS = 24, 3, 0.9, 3
RNG = np.random.default_rng(7)
X = RNG.normal(size=(STEPS, GLOBAL, FEATURES)).astype(np.float32) * np.arange(1, 4) + 2.0
Y = RNG.normal(size=(STEPS, GLOBAL)).astype(np.float32)


def expected_moving_stats(n, steps):
    """Replica 0's moving mean and variance after ``steps`` steps: Keras' update
    (``moving = moving * momentum + batch_stat * (1 - momentum)``, the variance biased) over
    the rows TF gives replica 0 of each global batch (the first ``GLOBAL // n``)."""
    mean, var = np.zeros(FEATURES), np.ones(FEATURES)
    for k in range(steps):
        rows = X[k, : GLOBAL // n].astype(np.float64)
        mean = mean * MOMENTUM + rows.mean(0) * (1 - MOMENTUM)
        var = var * MOMENTUM + rows.var(0) * (1 - MOMENTUM)
    return mean, var


def build(strategy):
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((FEATURES,)),
                keras.layers.BatchNormalization(momentum=MOMENTUM),
                keras.layers.Dense(1),
            ]
        )
        optimizer = keras.optimizers.SGD(0.01)
        optimizer.build(model.trainable_variables)
    return model, optimizer


def replica_step(model, optimizer, form):
    """The custom loop's replica step: the batch's loss and gradients (Keras' stateless
    call), applied by the optimizer; the moving statistics assigned from the stateless
    call's outputs (``"assign"``) or by a stateful ``model(x, training=True)`` (``"call"``)."""

    def step(x, y):
        tv = [v.value for v in model.trainable_variables]
        ntv = [v.value for v in model.non_trainable_variables]

        def loss_of(tv):
            pred, new_ntv = model.stateless_call(tv, ntv, x, training=True)
            per_example = jnp.square(pred[:, 0] - y)
            return jd.nn.compute_average_loss(per_example, global_batch_size=GLOBAL), new_ntv

        (loss, new_ntv), grads = jax.value_and_grad(loss_of, has_aux=True)(tv)
        if form == "assign":
            for v, value in zip(model.non_trainable_variables, new_ntv):
                v.assign(value)
        else:
            model(x, training=True)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return step


def train_fn(strategy, step, how):
    def train(batch):
        return strategy.reduce("SUM", strategy.run(step, args=batch), axis=None)

    return jd.function(train) if how == "jd.function" else train


@pytest.mark.parametrize("form", ["assign", "call"])
@pytest.mark.parametrize("n", (1, 2, 3, 8))
@pytest.mark.parametrize("how", ["eager", "jd.function"])
def test_host_reads_of_batch_norm_moving_stats_are_replica_0s(how, n, form):
    s = mirrored(n)
    model, optimizer = build(s)
    bn = model.layers[0]
    train = train_fn(s, replica_step(model, optimizer, form), how)
    data = s.experimental_distribute_dataset([(X[k], Y[k]) for k in range(STEPS)])
    for k, batch in enumerate(data, start=1):
        loss = float(train(batch))  # the step after each read still runs
        assert np.isfinite(loss)
        mean, var = expected_moving_stats(n, k)
        weights = model.get_weights()  # gamma, beta, moving mean, moving variance, kernel, bias
        np.testing.assert_allclose(weights[2], mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(weights[3], var, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(bn.moving_mean.numpy(), mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(bn.moving_variance.value), var, rtol=1e-5)
        np.testing.assert_allclose(np.asarray(bn.moving_mean), mean, rtol=1e-5, atol=1e-6)
    # each replica still holds its own statistics (replica r's from its own rows)
    own = s.experimental_local_results(bn.moving_mean.value)
    assert len(own) == n
    if n > 1:
        last = GLOBAL // n
        mean = np.zeros(FEATURES)
        for k in range(STEPS):
            mean = mean * MOMENTUM + X[k, GLOBAL - last :].mean(0) * (1 - MOMENTUM)
        np.testing.assert_allclose(np.asarray(own[-1]), mean, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", (2, 3, 8))
@pytest.mark.parametrize("how", ["eager", "jd.function"])
def test_the_weights_read_on_the_host_restore_and_the_loop_resumes(how, n):
    """A checkpoint's round trip: ``get_weights()`` then ``set_weights()`` (every replica then
    reads replica 0's statistics, as TF's host assignment sets every component) and the
    next steps run from there."""
    s = mirrored(n)
    model, optimizer = build(s)
    train = train_fn(s, replica_step(model, optimizer, "assign"), how)
    data = list(s.experimental_distribute_dataset([(X[k], Y[k]) for k in range(STEPS)]))
    train(data[0])
    saved = model.get_weights()
    model.set_weights(saved)
    own = s.experimental_local_results(model.layers[0].moving_mean.value)
    for x in own:
        np.testing.assert_allclose(np.asarray(x), saved[2], rtol=1e-6)
    train(data[1])
    mean = np.zeros(FEATURES)
    for k in (0, 1):
        mean = mean * MOMENTUM + X[k, : GLOBAL // n].mean(0) * (1 - MOMENTUM)
    np.testing.assert_allclose(model.get_weights()[2], mean, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["assign", "assign_add"])
@pytest.mark.parametrize("n", (1, 2, 3, 8))
@pytest.mark.parametrize("how", ["eager", "jd.function"])
def test_a_variable_of_aggregation_none_reads_as_tf_reads_it(how, n, op):
    tf = ANSWERS[f"vars.tfvar.mirrored.none.{op}.r{n}"]["result"]
    s = mirrored(n)
    with s.scope():
        v = keras.Variable(1.0, aggregation="none")

    def step():
        r = jd.get_replica_context().replica_id_in_sync_group
        getattr(v, op)(jnp.float32(r) + 2.0)
        return v.value * 1.0

    run = (lambda: s.run(step)) if how == "eager" else jd.function(lambda: s.run(step))
    inside = run()
    assert [float(x) for x in s.experimental_local_results(inside)] == tf["read_inside_step"]
    assert float(v.numpy()) == tf["host_read"]
    assert float(np.asarray(v.value)) == tf["host_read"]
    assert float(v) == tf["host_read"]
    if n > 1:
        assert [float(x) for x in s.experimental_local_results(v.value)] == tf["local_results"]


@pytest.mark.parametrize("n", (2, 8))
def test_a_host_assignment_of_a_variable_of_aggregation_none_sets_every_replica(n):
    tf = ANSWERS[f"vars.tfvar.mirrored.none.host_assign.r{n}"]["result"]
    s = mirrored(n)
    with s.scope():
        v = keras.Variable(1.0, aggregation="none")

    def step():
        v.assign(v.value + jnp.float32(jd.get_replica_context().replica_id_in_sync_group))
        return v.value * 1.0

    s.run(step)
    v.assign(12.0)
    assert float(v.numpy()) == tf["host_read"]
    local = s.run(lambda: v.value * 1.0)
    assert [float(x) for x in s.experimental_local_results(local)] == tf["local_results"]
