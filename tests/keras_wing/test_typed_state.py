"""Keras' objects as typed state (`jaxdist._state.typed`, `jaxdist._keras.typed`): the values a
step reads inside Keras' layers, variables, optimizers and metrics are compared only after an
assignment to one of them drew a new epoch, and every change a program makes is still seen.

Each case changes what a compiled step depends on, on the host between calls, and checks the
next call against the same computation in NumPy (and the number of traces). Cases: a layer's
``trainable``, a number on a layer of the program's own class, a list on such a layer appended
and set in place (Keras' tracked list), a dict on it, a config object of the program's held by a
layer (no barrier: compared on every call), a layer added to a model, a schedule's and a
regularizer's attribute, a class attribute read through a layer, and a value a step reads
and writes back in a layer (the write-back passes no barrier).
"""

import os

import numpy as np
import pytest
from conftest import mirrored

os.environ.setdefault("KERAS_BACKEND", "jax")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "jax":
    pytest.skip("the Keras integration needs the JAX backend", allow_module_level=True)

import jax.numpy as jnp  # noqa: E402

import jaxdist as jd  # noqa: E402
from jaxdist._state import typed  # noqa: E402

REPLICAS = (1, 2, 8)


class Scale(keras.layers.Layer):
    """A layer of the program's: its number, its list and its dict are read by ``call``."""

    def __init__(self):
        super().__init__()
        self.factor = 2.0
        self.extra = [1.0]
        self.table = {"shift": 0.0}
        self.config = None

    def call(self, x):
        out = x * self.factor * sum(self.extra) + self.table["shift"]
        if self.config is not None:
            out = out * self.config.gain
        return out


class Config:  # not a Keras class: no barrier sees its attributes change
    def __init__(self, gain):
        self.gain = gain


def _setup(n):
    strategy = mirrored(n)
    with strategy.scope():
        layer = Scale()
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, use_bias=False), layer])
    model.layers[0].kernel.assign(np.arange(6, dtype=np.float32).reshape(3, 2))
    traces = []

    @jd.function
    def step(x):
        traces.append(1)
        out = strategy.run(lambda xb: jnp.sum(model(xb)), args=(x,))
        return strategy.reduce("SUM", out, axis=None)

    x = strategy.experimental_distribute_values_from_function(
        lambda ctx: np.full((2, 3), ctx.replica_id_in_sync_group + 1.0, np.float32)
    )
    rows = np.concatenate([np.full((2, 3), r + 1.0, np.float32) for r in range(n)])
    return strategy, model, layer, step, x, rows, traces


def _expected(rows, model, layer):
    h = rows @ np.asarray(model.layers[0].kernel.value)
    gain = layer.config.gain if layer.config is not None else 1.0
    return float(np.sum((h * layer.factor * sum(layer.extra) + layer.table["shift"]) * gain))


@pytest.mark.parametrize("n", REPLICAS)
def test_keras_classes_are_typed_and_a_steady_step_draws_no_epoch(n):
    strategy, model, layer, step, x, rows, traces = _setup(n)
    step(x), step(x)  # (on several replicas the first call's trace builds what a second fits)
    assert typed.is_typed_class(keras.layers.Dense) and typed.is_typed_class(Scale)
    assert typed.is_typed_class(type(model.layers[0].kernel))
    before = typed.epoch()
    for _ in range(3):
        np.testing.assert_allclose(float(step(x)), _expected(rows, model, layer), rtol=1e-6)
    assert typed.epoch() == before  # the calls assign nothing on Keras' objects
    assert len(traces) <= 2


@pytest.mark.parametrize("n", REPLICAS)
@pytest.mark.parametrize(
    "change",
    [
        "factor",
        "append",
        "set_item",
        "dict",
        "config",
        "config_in_place",  # (the trace's reads, recorded: `jaxdist._state.record`)
    ],
)
def test_a_change_to_a_keras_object_is_seen_by_the_next_call(n, change):
    strategy, model, layer, step, x, rows, traces = _setup(n)
    if change == "config_in_place":
        layer.config = Config(1.5)
    np.testing.assert_allclose(float(step(x)), _expected(rows, model, layer), rtol=1e-6)
    step(x)
    if change == "factor":
        layer.factor = 3.0
    elif change == "append":
        layer.extra.append(2.0)
    elif change == "set_item":
        layer.extra[0] = 4.0
    elif change == "dict":
        layer.table["shift"] = 1.0
    elif change == "config":
        layer.config = Config(0.5)
    else:  # an object of the program's held by the layer, changed with no barrier
        layer.config.gain = 0.25
    np.testing.assert_allclose(float(step(x)), _expected(rows, model, layer), rtol=1e-6)
    np.testing.assert_allclose(float(step(x)), _expected(rows, model, layer), rtol=1e-6)
    # (two to start, as above) a changed number: one trace more, then an input at most
    assert len(traces) <= 4


@pytest.mark.parametrize("n", REPLICAS)
def test_a_layer_made_untrainable_changes_what_the_optimizer_updates(n):
    strategy = mirrored(n)
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)])
        opt = keras.optimizers.SGD(0.1)
        opt.build(model.trainable_variables)

    def replica_step(xb):
        import jax

        tv = [v.value for v in model.trainable_variables]
        ntv = [v.value for v in model.non_trainable_variables]

        def loss(tv):
            out, _ = model.stateless_call(tv, ntv, xb)
            return jnp.mean(out)

        grads = jax.grad(loss)(tv)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return len(tv)

    @jd.function
    def step(x):
        return strategy.run(replica_step, args=(x,))

    x = strategy.experimental_distribute_values_from_function(
        lambda ctx: np.ones((2, 3), np.float32)
    )
    step(x)
    first = model.layers[0].kernel.numpy().copy()
    model.layers[0].trainable = False
    counts = strategy.experimental_local_results(step(x))
    assert {int(c) for c in counts} == {2}  # the second layer's kernel and bias only
    np.testing.assert_array_equal(model.layers[0].kernel.numpy(), first)


def test_a_subclass_with_its_own_setattr_is_not_typed():
    class Own(keras.layers.Layer):
        def __setattr__(self, name, value):
            object.__setattr__(self, name, value)

        def __delattr__(self, name):
            object.__delattr__(self, name)

    with mirrored(1).scope():
        pass  # installs the barriers
    assert typed.is_typed_class(keras.layers.Dense)
    assert not typed.is_typed_class(Own)


def test_the_private_keras_names_the_barrier_relies_on_exist():
    from keras.src.backend.common.variables import Variable
    from keras.src.utils import tracking

    with mirrored(1).scope():
        v = keras.Variable(np.zeros(2, np.float32))
    assert isinstance(v, Variable) and "_value" in vars(v)
    for name in ("Tracker", "TrackedList", "TrackedDict", "TrackedSet"):
        assert hasattr(tracking, name)
    before = typed.epoch()
    v.assign(np.ones(2, np.float32))  # a variable's array: no epoch drawn
    assert typed.epoch() == before
    v.trainable = False
    assert typed.epoch() > before


def _stateless_step(strategy, model, traces, factor=lambda: 1.0):
    @jd.function
    def step(x):
        traces.append(1)

        def replica(xb):
            tv = [v.value for v in model.trainable_variables]
            ntv = [v.value for v in model.non_trainable_variables]
            out, _ = model.stateless_call(tv, ntv, xb)
            return jnp.sum(out) * factor() + sum(model.losses)

        return strategy.reduce("MEAN", strategy.run(replica, args=(x,)), axis=None)

    return step


def test_a_changed_schedule_or_regularizer_held_by_a_keras_object_is_seen():
    # (a schedule and a regularizer are Keras' own objects, not a layer's: their attributes
    # change with no layer's barrier, so they are typed themselves)
    strategy = mirrored(2)
    with strategy.scope():
        schedule = keras.optimizers.schedules.ExponentialDecay(1.0, 1, 0.5)
        dense = keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
        dense.kernel_regularizer = keras.regularizers.L2(0.5)
        model = keras.Sequential([keras.Input((2,)), dense])
        opt = keras.optimizers.SGD(schedule)
        opt.build(model.trainable_variables)
    traces = []
    step = _stateless_step(strategy, model, traces, lambda: opt.learning_rate)
    x = np.ones((4, 2), np.float32)
    assert float(step(x)) == float(step(x)) == 8.0 + 1.0
    schedule.initial_learning_rate = 2.0  # (the optimizer's own: reached through it)
    np.testing.assert_allclose(float(step(x)), 16.0 + 1.0)
    dense.kernel_regularizer.l2 = 1.0
    np.testing.assert_allclose(float(step(x)), 16.0 + 2.0)


def test_a_class_attribute_read_through_a_layer_is_compared_on_every_call():
    class Scaled(keras.layers.Layer):
        factor = 2.0

        def call(self, x):
            return x * self.factor

    strategy = mirrored(2)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((3,)),
                keras.layers.Dense(1, use_bias=False, kernel_initializer="ones"),
                Scaled(),
            ]
        )
    traces = []
    step = _stateless_step(strategy, model, traces)
    x = np.ones((2, 3), np.float32)
    assert float(step(x)) == float(step(x)) == 12.0
    Scaled.factor = 3.0  # the class's: no instance's barrier sees it
    np.testing.assert_allclose(float(step(x)), 18.0)


def test_a_step_writing_a_value_it_read_in_a_keras_object_is_traced_for_the_new_one():
    # the write-back writes the layer's dictionary past its barrier: an epoch is drawn, and
    # the step's own trace holds only if what it read still is what it wrote
    strategy = mirrored(2)
    with strategy.scope():
        dense = keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
        dense.build((None, 3))
    dense.mode = "a"

    @jd.function
    def step(x):
        def replica(xb):
            k = 1.0 if dense.mode == "a" else 10.0
            dense.mode = "b" if dense.mode == "a" else "a"
            return jnp.sum(dense(xb)) * k

        return strategy.reduce("MEAN", strategy.run(replica, args=(x,)), axis=None)

    @jd.function
    def reader(x):
        k = strategy.run(lambda xb: jnp.sum(dense(xb)) * (1.0 if dense.mode == "a" else 10.0), (x,))
        return strategy.reduce("MEAN", k, axis=None)

    x = np.ones((2, 3), np.float32)
    for _ in range(6):
        expected = 6.0 * (1.0 if dense.mode == "a" else 10.0)
        np.testing.assert_allclose(float(reader(x)), expected)
        np.testing.assert_allclose(float(step(x)), expected)
