"""State held by objects passed in a step's arguments (issue 46): a model, trainer or
optimizer given to ``strategy.run(step, args=(model, x))`` or to a `jd.function` is read
at every call and written back, as the same object on ``self`` or in a closure is.

Expected values come from the same code run as plain Python (the arithmetic below),
on 1, 2 and 8 replicas and `OneDeviceStrategy` (`strat`), eagerly and under `jd.function`.
"""

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ones_batch, total

import jaxdist as jd


class Model:
    def __init__(self):
        self.w = jnp.ones(())
        self.lr = 0.5
        self.training = True


def replica_step(x, model):
    # a Python bool and number picked per call, an array read: all from the argument
    scale = 1.0 if model.training else -1.0
    return total(x) * model.w * model.lr * scale


def local(s, out):
    return float(s.experimental_local_results(out)[0])


def test_eager_run_reads_an_argument_objects_state_now(strat):
    s, m, x = strat, Model(), ones_batch(strat)

    def step(x, model):  # (its own function: the trace count is this test's)
        return replica_step(x, model)

    got = []
    for w, lr, training in [
        (1.0, 0.5, True),
        (2.0, 0.5, True),
        (2.0, 0.25, True),
        (3.0, 1.0, False),
    ]:
        m.w, m.lr, m.training = jnp.asarray(w), lr, training
        got.append(local(s, s.run(step, args=(x, m))))
    assert got == [4.0, 8.0, 4.0, -24.0]  # 8 * w * lr * (+-1)
    assert jd.experimental.step_count(step) <= 3  # lr once traced, the bool twice


def test_a_jd_function_taking_a_model_trains_it(strat):
    """The issue's ``@jd.function def train_step(model, x): model.w = ...``: no tracer is
    left in the model, it trains, and its learning rate set by the host is read."""
    s = strat

    @jd.function
    def train_step(model, x):
        g = s.reduce("SUM", s.run(lambda v: total(v) * model.w, args=(x,)), axis=None)
        model.w = model.w - model.lr * g / 8.0
        return g

    m, x = Model(), ones_batch(s)
    w, seen = 1.0, []
    for lr in (0.5, 0.5, 0.1):
        m.lr = lr
        seen.append(float(train_step(m, x)))
        g = s.num_replicas_in_sync * 8.0 * w
        assert seen[-1] == pytest.approx(g)
        w = w - lr * g / 8.0
        assert not isinstance(m.w, jax.core.Tracer)
        assert float(m.w) == pytest.approx(w)
    assert train_step.experimental_get_tracing_count() <= 2


def test_two_objects_of_one_class_keep_their_own_state(strat):
    s, x = strat, ones_batch(strat)
    a, b = Model(), Model()
    b.w = jnp.ones(()) * 5.0

    def step(x, model):  # (its own function: its traces are this test's)
        return replica_step(x, model)

    for _ in range(2):
        assert local(s, s.run(step, args=(x, a))) == 4.0
        assert local(s, s.run(step, args=(x, b))) == 20.0
    a.w = jnp.ones(()) * 2.0
    assert local(s, s.run(step, args=(x, a))) == 8.0
    assert local(s, s.run(step, args=(x, b))) == 20.0


@dataclasses.dataclass
class Config:  # unhashable (eq=True): an argument by identity
    scale: float


def test_an_unregistered_dataclass_argument_is_read_now(strat):
    s, x = strat, ones_batch(strat)
    cfg = Config(2.0)

    @jd.function
    def f(x, cfg):
        return s.reduce("SUM", s.run(lambda v: total(v) * cfg.scale, args=(x,)), axis=None)

    n = s.num_replicas_in_sync
    assert float(f(x, cfg)) == 16.0 * n
    cfg.scale = 3.0
    assert float(f(x, cfg)) == 24.0 * n


def test_a_model_argument_under_a_partial_batch_is_read_now():
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    ragged = s.experimental_distribute_values_from_function(
        lambda c: jnp.ones(3) if c.replica_id_in_sync_group == 0 else jnp.ones(2)
    )
    m = Model()
    assert local(s, s.run(replica_step, args=(ragged, m))) == 2.5  # 5 * 1 * 0.5
    m.w = jnp.asarray(4.0)
    assert local(s, s.run(replica_step, args=(ragged, m))) == 10.0


def test_an_argument_objects_array_under_jax_jit_is_named_when_frozen():
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    m, x = Model(), ones_batch(s)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = jax.jit(lambda x: s.run(replica_step, args=(x, m)))(x)
    assert local(s, out) == 4.0
    assert any("(model.w, model.lr" in str(w.message) for w in caught), [
        str(w.message) for w in caught
    ]


def test_an_argument_object_is_keyed_by_identity_its_eq_never_runs(strat):
    """Two equal objects are two objects (each read for itself); a user ``__eq__`` or
    ``__hash__`` that raises or returns an array never runs in jaxdist's lookups."""

    class Strict:
        def __init__(self, w):
            self.w = jnp.asarray(w)

        def __eq__(self, other):
            raise AssertionError("jaxdist ran __eq__")

        def __hash__(self):
            raise AssertionError("jaxdist ran __hash__")

    s, x = strat, ones_batch(strat)

    def step(x, m):
        return total(x) * m.w

    a, b = Strict(1.0), Strict(2.0)
    for _ in range(2):
        assert local(s, s.run(step, args=(x, a))) == 8.0
        assert local(s, s.run(step, args=(x, b))) == 16.0


def test_value_arguments_are_not_walked():
    from jaxdist._state import arguments

    assert not any(
        arguments.holds_state(v) for v in (None, True, "relu", 3, 2.5, np.float32(1), b"x")
    )
    assert all(arguments.holds_state(v) for v in (Model(), replica_step, Model, [1]))


def test_a_trainer_and_the_model_it_is_given_are_freed_when_dropped(strat):
    """Deleting a trainer frees it, its `jd.function` programs and the objects passed to
    them (the traces JAX keeps do not hold the step: `jaxdist._state.stage.released`)."""
    import gc
    import weakref

    s = strat

    class Trainer:
        def __init__(self):
            self.w = jnp.ones(())

        def replica(self, x):
            return total(x) * self.w

        @jd.function
        def train_step(self, x):
            out = s.reduce("SUM", s.run(self.replica, args=(x,)), axis=None)
            self.w = self.w - 0.01 * out
            return out

        @jd.function
        def with_model(self, model, x):
            return s.reduce("SUM", s.run(replica_step, args=(x, model)), axis=None)

    t, m, x = Trainer(), Model(), ones_batch(s)
    for _ in range(3):
        t.train_step(x)
        t.with_model(m, x)
    refs = weakref.ref(t), weakref.ref(m)
    del t, m
    gc.collect()
    assert [r() is None for r in refs] == [True, True]
