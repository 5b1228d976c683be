"""Eager `run` reads the state a step captures afresh on every call (TF eager's meaning).

The step's closure cells, the globals its code names and its bound object's attributes
(and what they hold: attributes, items, pytree children) are read on every call. Only a
change of shape, dtype or of a Python number/string/function the step reads traces again.
TF 2.21 eager ``strategy.run`` gives 8, 16, 24 for the issue's trainer (the step adds the
all-reduced batch sum, 8, to the state it read).
"""

import functools
import gc
import types
import warnings
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import mirrored, require

import jaxdist as jd


def batch(strategy):
    """A (4, 2) batch of ones split over the replicas: the all-reduced sum is 8."""
    return next(iter(strategy.experimental_distribute_dataset([np.ones((4, 2), np.float32)])))


def first(strategy, out):
    return float(strategy.experimental_local_results(out)[0])


def total(x):
    return jd.get_replica_context().all_reduce("SUM", jnp.sum(x))


class Trainer:
    def __init__(self):
        self.w = jnp.zeros(())

    def step(self, x):
        return self.w + total(x)


def test_bound_object_attribute_is_read_each_call(strategy):
    t, x = Trainer(), batch(strategy)
    seen = []
    for _ in range(3):
        t.w = strategy.experimental_local_results(strategy.run(t.step, args=(x,)))[0]
        seen.append(float(t.w))
    assert seen == [8.0, 16.0, 24.0]  # TF eager
    assert jd.experimental.step_count(t.step) == 1  # values changed, not the trace


W = jnp.zeros(())


def global_step(x):
    return W + total(x)


def test_module_global_is_read_each_call(strategy):
    global W
    x = batch(strategy)
    W = jnp.zeros(())
    seen = []
    for _ in range(3):
        W = strategy.experimental_local_results(strategy.run(global_step, args=(x,)))[0]
        seen.append(float(W))
    assert seen == [8.0, 16.0, 24.0]


def test_closure_cell_is_read_each_call(strategy):
    x = batch(strategy)
    w = jnp.zeros(())

    def step(x):
        return w + total(x)

    seen = []
    for _ in range(3):
        w = strategy.experimental_local_results(strategy.run(step, args=(x,)))[0]
        seen.append(float(w))
    assert seen == [8.0, 16.0, 24.0]
    assert jd.experimental.step_count(step) == 1


def test_nested_state_dict_on_an_object(strategy):
    class Model:
        def __init__(self):
            self.params = {"w": jnp.ones(3), "b": jnp.zeros(())}

    class Orbit:
        def __init__(self):
            self.model = Model()

        def train_fn(self, x):
            p = self.model.params
            return jnp.sum(p["w"]) + p["b"] + total(x)

    o, x = Orbit(), batch(strategy)
    assert first(strategy, strategy.run(o.train_fn, args=(x,))) == 3.0 + 8.0
    # float32 as the first (``jnp.full(3, 2.0)`` is weakly typed: a trace of its own, as jit's)
    o.model.params = {"w": jnp.full(3, 2.0, jnp.float32), "b": jnp.float32(5.0)}
    assert first(strategy, strategy.run(o.train_fn, args=(x,))) == 6.0 + 5.0 + 8.0
    o.model = Model()  # a new object at the same place
    assert first(strategy, strategy.run(o.train_fn, args=(x,))) == 3.0 + 8.0
    assert jd.experimental.step_count(o.train_fn) == 1


def test_numpy_state_changed_in_place_is_seen(strategy):
    table = np.zeros(3, np.float32)

    def step():
        return jnp.sum(jnp.asarray(table)) + 1.0

    assert first(strategy, strategy.run(step)) == 1.0
    table[:] = 2.0
    assert first(strategy, strategy.run(step)) == 7.0


def test_new_shape_or_number_traces_again(strategy):
    class Box:
        pass

    box = Box()
    box.state, box.k = {"w": jnp.ones(2)}, 3.0

    def step():
        return jnp.sum(box.state["w"]) * box.k

    assert first(strategy, strategy.run(step)) == 6.0
    box.state["w"] = jnp.ones(5)  # a new shape: a new trace, the right answer
    assert first(strategy, strategy.run(step)) == 15.0
    box.k = 2.0  # a number that changes: an input from then on (one more trace at most)
    assert first(strategy, strategy.run(step)) == 10.0
    box.k = 4.0
    assert first(strategy, strategy.run(step)) == 20.0
    assert jd.experimental.step_count(step) <= 3  # 3 the first time this code runs


def test_python_number_read_from_a_global_is_current(strategy):
    global FACTOR
    FACTOR = 2.0

    def step():
        return jnp.float32(1.0) * FACTOR

    assert first(strategy, strategy.run(step)) == 2.0
    FACTOR = 5.0
    assert first(strategy, strategy.run(step)) == 5.0
    FACTOR = 2.0  # the number is an input now: no third compile
    assert first(strategy, strategy.run(step)) == 2.0
    assert jd.experimental.step_count(step) <= 2  # 2 the first time this code runs


FACTOR = 2.0


def test_state_returned_as_it_is_is_current(strategy):
    t = Trainer()
    t.w = jnp.float32(1.0)
    assert float(strategy.run(lambda: t.w)) == 1.0
    t.w = jnp.float32(2.0)
    assert float(strategy.run(lambda: t.w)) == 2.0


def test_the_name_the_code_reads_wins_over_an_alias(strategy):
    class T:
        def __init__(self):
            self.backup = self.w = jnp.float32(1.0)  # one array, two names

        def step(self):
            return self.w * 1.0

    t = T()
    assert first(strategy, strategy.run(t.step)) == 1.0
    t.w = jnp.float32(4.0)
    assert first(strategy, strategy.run(t.step)) == 4.0


def test_experimental_run_and_call_for_each_replica_read_state(strategy):
    t = Trainer()
    it = iter(strategy.experimental_distribute_dataset([np.ones((4, 2), np.float32)] * 3))
    with pytest.warns(DeprecationWarning):
        for _ in range(2):
            t.w = strategy.experimental_local_results(strategy.experimental_run(t.step, it))[0]
    assert float(t.w) == 16.0
    with strategy.scope():
        out = strategy.extended.call_for_each_replica(t.step, args=(next(it),))
    assert first(strategy, out) == 24.0


def test_partial_batch_reads_state_each_call():
    s = mirrored(4)
    t = Trainer()
    x = next(iter(s.experimental_distribute_dataset([np.ones((2, 2), np.float32)])))  # [1,1,0,0]
    seen = []
    for _ in range(3):
        t.w = s.experimental_local_results(s.run(t.step, args=(x,)))[0]
        seen.append(float(t.w))
    assert seen == [4.0, 8.0, 12.0]
    assert jd.experimental.step_count(t.step) == 1


def test_equal_strategies_share_one_compiled_step():
    def step(x):
        return x * 2.0

    for _ in range(5):
        s = mirrored(2)
        out = s.run(step, args=(jnp.ones(3),))
        np.testing.assert_allclose(np.asarray(s.experimental_local_results(out)[1]), 2.0)
    assert jd.experimental.step_count(step) == 1
    mirrored(4).run(step, args=(jnp.ones(3),))  # other devices: a step of their own
    assert jd.experimental.step_count(step) == 2


@pytest.mark.parametrize("make", [lambda: jd.OneDeviceStrategy("/cpu:0"), lambda: mirrored(1)])
def test_one_device_per_replica_and_plain_state_share_a_step(make):
    s = make()

    def step(w):
        return w + 1.0

    w = s.experimental_distribute_values_from_function(lambda c: jnp.zeros(3))
    for _ in range(3):
        w = s.run(step, args=(w,))
    np.testing.assert_allclose(np.asarray(w), 3.0)
    assert jd.experimental.step_count(step) == 1


def test_captured_state_does_not_keep_the_object_alive(strategy):
    t = Trainer()
    strategy.run(t.step, args=(batch(strategy),))
    ref = weakref.ref(t)
    del t
    gc.collect()
    assert ref() is None


def test_inside_jax_jit_closures_are_constants_as_in_jax_and_named(strategy):
    """JAX's rule inside the user's own jax.jit: what the trace read is baked in, and the
    trace says so, naming it and the fix (jd.function); jd.function reads it afresh."""
    box = {"w": jnp.float32(1.0)}

    @jax.jit
    def f():
        return strategy.run(lambda: box["w"] * 1.0)

    with pytest.warns(RuntimeWarning, match=r"box\['w'\].*@jd\.function"):
        assert first(strategy, f()) == 1.0
    box["w"] = jnp.float32(2.0)
    assert first(strategy, f()) == 1.0  # jax.jit's cache: documented in docs/guides/state.md
    g = jd.function(lambda: strategy.run(lambda: box["w"] * 1.0))
    assert first(strategy, g()) == 2.0
    box["w"] = jnp.float32(3.0)
    assert first(strategy, g()) == 3.0


def test_inside_jax_jit_a_librarys_settings_are_not_named_the_users_numbers_are():
    """The frozen-state warning names the Python numbers a program keeps (``self.lr`` on
    its own class, a ``types.SimpleNamespace`` of settings) and not an installed
    library's (a Keras optimizer's ``beta_1``; here a class of numpy's module), which
    TF's ``tf.function`` bakes in as well: the Keras custom-loop recipe warns of nothing."""
    import types

    strategy = mirrored(2)
    Library = type("Library", (), {"__module__": "numpy"})  # as if numpy defined it
    lib, cfg = Library(), types.SimpleNamespace(scale=3.0)
    lib.beta_1 = 0.9

    class Trainer:
        def __init__(self):
            self.lr, self.lib, self.cfg = 0.5, lib, cfg

        def step(self, x):
            return x * self.lr * self.lib.beta_1 * self.cfg.scale

    t = Trainer()
    with pytest.warns(RuntimeWarning, match="traced inside your own jax.jit") as seen:
        out = jax.jit(lambda x: strategy.run(t.step, args=(x,)))(jnp.float32(1.0))
    message = str(seen[0].message)
    assert "self.lr" in message and "self.cfg.scale" in message
    assert "beta_1" not in message
    np.testing.assert_allclose(first(strategy, out), 0.5 * 0.9 * 3.0, rtol=1e-6)


def test_unchanged_captured_array_is_not_copied_again(strategy):
    big = {"w": jnp.ones((64, 64))}

    def step(x):
        return jnp.sum(big["w"]) + x

    x = strategy.experimental_distribute_values_from_function(lambda c: jnp.zeros(()))
    strategy.run(step, args=(x,))
    with jax.transfer_guard("disallow"):  # the state's replicated copy is reused
        out = strategy.run(step, args=(x,))
    assert first(strategy, out) == 64.0 * 64.0
    big["w"] = jnp.full((64, 64), 2.0)  # a new array: placed once, then reused
    assert first(strategy, strategy.run(step, args=(x,))) == 2 * 64.0 * 64.0


def test_a_captured_mirrored_value_is_read_each_call(strategy):
    """A Mirrored read as an array inside the step stands for its local component (TF)."""
    devices = strategy.experimental_distribute_values_from_function(lambda c: jnp.zeros(()))
    state = {"m": strategy.extended.broadcast_to(jnp.float32(1.0), devices)}
    if strategy.num_replicas_in_sync > 1:
        assert isinstance(state["m"], jd.Mirrored)

    def step():
        return state["m"] * 2.0

    assert first(strategy, strategy.run(step)) == 2.0
    state["m"] = strategy.extended.broadcast_to(jnp.float32(5.0), devices)
    assert first(strategy, strategy.run(step)) == 10.0
    assert jd.experimental.step_count(step) == 1


def test_a_nan_read_by_the_step_does_not_retrace(strategy):
    box = {"best": float("nan")}

    def step():
        return jnp.float32(1.0) + (0.0 if box["best"] != box["best"] else 1.0)

    for _ in range(3):
        assert first(strategy, strategy.run(step)) == 1.0
    assert jd.experimental.step_count(step) == 1


def test_a_typed_prng_key_on_the_object_is_read_each_call(strategy):
    class T:
        def __init__(self):
            self.key = jax.random.key(0)

        def step(self):
            return jax.random.normal(self.key, ())

    t, seen, want = T(), [], []
    for _ in range(3):
        seen.append(first(strategy, strategy.run(t.step)))
        want.append(float(jax.random.normal(t.key, ())))
        t.key = jax.random.split(t.key)[0]
    assert seen == pytest.approx(want) and len(set(seen)) == 3
    assert jd.experimental.step_count(t.step) == 1


# -- a hostile review's programs (each gave a stale answer, or traced on every call) --------


def accumulate(strategy, step, set_state, calls=3):
    """Runs ``step`` ``calls`` times, storing its result as the state it reads."""
    x, seen = batch(strategy), []
    for _ in range(calls):
        out = strategy.experimental_local_results(strategy.run(step, args=(x,)))[0]
        set_state(out)
        seen.append(float(out))
    return seen


def test_one_array_read_under_two_names_then_rebound_under_one(strategy):
    """``self.w = self.ema = zeros`` traces one constant; rebinding ``w`` alone must not
    feed the new ``w`` to the read of ``ema`` as well."""

    class T:
        def __init__(self):
            self.w = self.ema = jnp.zeros(())

        def step(self, x):
            return self.w + 10.0 * self.ema + 0.0 * total(x)

    t, x = T(), batch(strategy)
    assert first(strategy, strategy.run(t.step, args=(x,))) == 0.0
    t.w = jnp.float32(1.0)
    assert first(strategy, strategy.run(t.step, args=(x,))) == 1.0  # TF eager: 1 + 10 * 0
    t.ema = jnp.float32(2.0)
    assert first(strategy, strategy.run(t.step, args=(x,))) == 21.0


def test_a_class_level_default_then_an_instance_attribute(strategy):
    class Counter:
        w = jnp.zeros(())  # the class's default, until the instance sets its own

        def step(self, x):
            return self.w + total(x)

    c = Counter()
    assert accumulate(strategy, c.step, lambda v: setattr(c, "w", v)) == [8.0, 16.0, 24.0]
    assert jd.experimental.step_count(c.step) == 1


def test_a_number_the_class_holds_then_the_instance_sets(strategy):
    class T:
        scale = 1.0

        def step(self, x):
            return self.scale * total(x)

    t, x = T(), batch(strategy)
    assert first(strategy, strategy.run(t.step, args=(x,))) == 8.0
    t.scale = 3.0
    assert first(strategy, strategy.run(t.step, args=(x,))) == 24.0


def test_an_object_with_slots_is_read_each_call_and_traced_once(strategy):
    class T:
        __slots__ = ("w",)  # not weakly referenceable, no __dict__

        def __init__(self):
            self.w = jnp.zeros(())

        def step(self, x):
            return self.w + total(x)

    t = T()
    assert accumulate(strategy, t.step, lambda v: setattr(t, "w", v), 4) == [8, 16, 24, 32]
    assert jd.experimental.step_count(t.step) == 1


def test_state_found_past_big_unrelated_containers_on_the_object(strategy):
    """A trainer holding its data (thousands of arrays) next to its model."""

    class Model:
        def __init__(self):
            self.params = {"dense": {"kernel": jnp.zeros(())}}

    class T:
        def __init__(self):
            self.train_batches = [np.ones(2, np.float32) for _ in range(2500)]
            self.eval_batches = [np.ones(2, np.float32) for _ in range(2500)]
            self.model = Model()

        def step(self, x):
            return self.model.params["dense"]["kernel"] + total(x)

    t = T()

    def set_state(v):
        t.model.params = {"dense": {"kernel": v}}

    assert accumulate(strategy, t.step, set_state) == [8.0, 16.0, 24.0]


def test_a_number_read_from_a_big_dict_of_hyperparameters(strategy):
    class T:
        def __init__(self):
            self.hp = {f"unused_{i}": float(i) for i in range(100)}
            self.hp["lr"] = 1.0

        def step(self, x):
            return self.hp["lr"] * total(x)

    t, x = T(), batch(strategy)
    assert first(strategy, strategy.run(t.step, args=(x,))) == 8.0
    t.hp["lr"] = 3.0
    assert first(strategy, strategy.run(t.step, args=(x,))) == 24.0


def test_a_function_or_loss_object_swapped_on_a_nested_object(strategy):
    class Huber:
        def __call__(self, v):
            return v * 0.5

    class Mse:
        def __call__(self, v):
            return v * 2.0

    class Model:
        def __init__(self):
            self.activation = jnp.tanh
            self.loss = Mse()

    class T:
        def __init__(self):
            self.model = Model()

        def step(self, x):
            return self.model.loss(self.model.activation(total(x) * 0.0 + 1.0))

    t, x = T(), batch(strategy)
    assert first(strategy, strategy.run(t.step, args=(x,))) == pytest.approx(2 * np.tanh(1.0))
    t.model.activation = jnp.exp
    assert first(strategy, strategy.run(t.step, args=(x,))) == pytest.approx(2 * np.e)
    t.model.loss = Huber()  # another class, no state of its own
    assert first(strategy, strategy.run(t.step, args=(x,))) == pytest.approx(0.5 * np.e)


def test_a_default_argument_is_read_each_call(strategy):
    def step(x, w=jnp.zeros(())):
        return w + total(x)

    def set_state(v):
        step.__defaults__ = (v,)

    assert accumulate(strategy, step, set_state) == [8.0, 16.0, 24.0]


def test_a_zero_d_numpy_array_changed_in_place(strategy):
    """JAX inlines a 0-d NumPy constant into the program: it is compared by value."""
    acc = np.zeros((), np.float32)

    def step(x):
        return jnp.asarray(acc) + total(x)

    def set_state(v):
        acc[...] = v

    assert accumulate(strategy, step, set_state) == [8.0, 16.0, 24.0]


params = {"w": jnp.zeros(())}  # a script's initial parameters, under the name a model uses


class Holder:
    pass


model = Holder()


def test_a_global_named_like_an_attribute_the_step_reads_is_not_read(strategy):
    """``model.params`` reads an attribute, not the global ``params`` (the same dict at
    first): rebinding ``model.params`` is what the step must see."""
    model.params = params
    step = lambda x: model.params["w"] + total(x)  # noqa: E731

    def set_state(v):
        model.params = {"w": v}

    assert accumulate(strategy, step, set_state) == [8.0, 16.0, 24.0]


def test_one_dict_read_under_two_names_then_rebound_under_one(strategy):
    class T:
        def __init__(self):
            self.params = self.ema = {"w": jnp.zeros(())}

        def step(self, x):
            return self.params["w"] + 10.0 * self.ema["w"] + 0.0 * total(x)

    t, x = T(), batch(strategy)
    assert first(strategy, strategy.run(t.step, args=(x,))) == 0.0
    t.params = {"w": jnp.float32(1.0)}
    assert first(strategy, strategy.run(t.step, args=(x,))) == 1.0  # TF eager: 1 + 10 * 0


def test_a_flax_train_state_on_the_trainer_is_traced_once():
    """TrainState.apply_gradients counts its Python int ``step``; a step that does not
    read it must not be traced again on every call (it was: 1 trace per call)."""
    optax = require("optax")
    nn = require("flax.linen")
    train_state = require("flax.training.train_state")
    s, dense = mirrored(4), nn.Dense(1)
    init = dense.init(jax.random.key(0), jnp.ones((1, 2)))
    data = np.arange(8, dtype=np.float32).reshape(4, 2)

    class Trainer:
        def __init__(self):
            self.state = train_state.TrainState.create(
                apply_fn=dense.apply, params=init, tx=optax.sgd(0.1)
            )

        def train_step(self, x):
            def loss(p):
                per_example = self.state.apply_fn(p, x)[:, 0] ** 2
                return jd.nn.compute_average_loss(per_example, global_batch_size=4)

            grads = jax.grad(loss)(self.state.params)
            return jd.get_replica_context().all_reduce("SUM", grads)

    t, want = (
        Trainer(),
        train_state.TrainState.create(apply_fn=dense.apply, params=init, tx=optax.sgd(0.1)),
    )
    x = next(iter(s.experimental_distribute_dataset([data])))
    for _ in range(4):
        grads = s.experimental_local_results(s.run(t.train_step, args=(x,)))[0]
        t.state = t.state.apply_gradients(grads=grads)
        one = jax.grad(lambda p: jnp.mean(dense.apply(p, data)[:, 0] ** 2))(want.params)
        want = want.apply_gradients(grads=one)
    for got, ref in zip(jax.tree.leaves(t.state.params), jax.tree.leaves(want.params)):
        np.testing.assert_allclose(got, ref, rtol=1e-5)
    assert jd.experimental.step_count(t.train_step) == 1


TABLE = np.arange(6, dtype=np.float32).reshape(2, 3)  # itself a view of its arange


def test_a_numpy_view_taken_in_the_step_is_taken_again_each_call(strategy):
    """``table[0]`` and ``table.T`` computed by NumPy in the step: the view is taken again
    of the array now there (changed in place, or rebound), with one trace."""
    global TABLE
    TABLE = np.arange(6, dtype=np.float32).reshape(2, 3)

    def step():
        return jnp.asarray(TABLE[1]), jnp.asarray(TABLE.T), jnp.asarray(TABLE[:, ::-1])

    def check():
        row, t, flipped = (first_all(strategy, v) for v in strategy.run(step))
        np.testing.assert_array_equal(row, TABLE[1])
        np.testing.assert_array_equal(t, TABLE.T)
        np.testing.assert_array_equal(flipped, TABLE[:, ::-1])

    check()
    TABLE[1] = [7.0, 8.0, 9.0]  # in place
    check()
    TABLE = np.full((2, 3), 5.0, np.float32)  # rebound, same layout
    check()
    assert jd.experimental.step_count(step) == 1


def first_all(strategy, out):
    return np.asarray(strategy.experimental_local_results(out)[0])


def test_a_step_assigning_a_computed_value_to_its_state_updates_it_per_replica(strategy):
    """``self.w = self.w + g`` inside the step is a variable update, as in TF's replica
    step (it was a stored tracer kept silently, and every later call gave the first
    call's answer; then an error): each replica's own value, a `PerReplica` (the values
    differ), read back by each replica on the next call."""

    class T:
        def __init__(self):
            self.w = jnp.zeros(())

        def step(self, x):
            self.w = self.w + total(x)
            return self.w

    t = T()
    (x,) = strategy.experimental_distribute_dataset([np.ones((8, 2), np.float32)])
    first = strategy.experimental_local_results(strategy.run(t.step, args=(x,)))
    second = strategy.experimental_local_results(strategy.run(t.step, args=(x,)))
    now = strategy.experimental_local_results(t.w)
    for a, b, w in zip(first, second, now):
        assert float(b) == 2 * float(a) == float(w)


def test_a_python_number_the_step_changes_is_current_on_every_call(strategy):
    """TF eager runs the step's Python on every call: a counter it increments and reads
    gives 1, 2, 3 (it gave 1, 1, 1: the Python ran once, at the trace). The count is an
    input and an output of the program, written back after each call."""

    class T:
        def __init__(self):
            self.calls = 0

        def step(self, x):
            self.calls += 1
            return self.calls * total(x)

    t = T()  # a full batch on every replica count: one trace runs the Python once
    x = next(iter(strategy.experimental_distribute_dataset([np.ones((8, 1), np.float32)])))
    seen = [first(strategy, strategy.run(t.step, args=(x,))) for _ in range(3)]
    assert seen == [8.0, 16.0, 24.0] and t.calls == 3


def test_a_config_class_read_by_the_step_is_current(strategy):
    """``Config.lr`` / ``Config.w`` on a class, and a classmethod's ``cls.w``."""

    class Config:
        lr = 1.0
        w = jnp.zeros(())

        @classmethod
        def step(cls, x):
            return cls.w + cls.lr * total(x)

    def step(x):
        return Config.w + Config.lr * total(x)

    x = batch(strategy)
    for fn in (step, Config.step):
        Config.lr, Config.w = 1.0, jnp.zeros(())
        assert first(strategy, strategy.run(fn, args=(x,))) == 8.0
        Config.lr = 2.0
        assert first(strategy, strategy.run(fn, args=(x,))) == 16.0
        Config.w = jnp.float32(1.0)
        assert first(strategy, strategy.run(fn, args=(x,))) == 17.0


def test_numbers_read_through_helper_methods_and_properties_are_current(strategy):
    """``self.scale()`` reading ``self.lr``, ``self.opt.apply()`` reading its ``beta``, and
    a property: the step's own code names none of them."""

    class Opt:
        def __init__(self):
            self.beta = 0.0

        def apply(self):
            return self.beta

    class T:
        def __init__(self):
            self.lr, self.opt, self.bias = 1.0, Opt(), 0.0

        @property
        def offset(self):
            return self.bias

        def scale(self):
            return self.lr

        def step(self, x):
            return self.scale() * total(x) + self.opt.apply() + self.offset

    t, x = T(), batch(strategy)
    assert first(strategy, strategy.run(t.step, args=(x,))) == 8.0
    t.lr = 2.0
    assert first(strategy, strategy.run(t.step, args=(x,))) == 16.0
    t.opt.beta = 1.0
    assert first(strategy, strategy.run(t.step, args=(x,))) == 17.0
    t.bias = 10.0
    assert first(strategy, strategy.run(t.step, args=(x,))) == 27.0


config = types.ModuleType("config")  # a user's config.py, imported as a module


def test_state_in_a_module_of_the_program_is_current(strategy):
    """``config.W`` / ``config.LR`` of the user's own module (it was a stale constant)."""
    config.W, config.LR = jnp.zeros(()), 1.0

    def step(x):
        return config.W + config.LR * total(x)

    x = batch(strategy)
    assert first(strategy, strategy.run(step, args=(x,))) == 8.0
    config.W = jnp.float32(1.0)
    assert first(strategy, strategy.run(step, args=(x,))) == 9.0
    config.LR = 2.0
    assert first(strategy, strategy.run(step, args=(x,))) == 17.0


def test_a_number_five_levels_deep_is_current(strategy):
    class Box:
        pass

    class T:
        def __init__(self):
            self.cfg = Box()
            self.cfg.optimizer = Box()
            self.cfg.optimizer.schedule = Box()
            self.cfg.optimizer.schedule.lr = 1.0

        def step(self, x):
            return self.cfg.optimizer.schedule.lr * total(x)

    t, x = T(), batch(strategy)
    assert first(strategy, strategy.run(t.step, args=(x,))) == 8.0
    t.cfg.optimizer.schedule.lr = 2.0
    assert first(strategy, strategy.run(t.step, args=(x,))) == 16.0


def test_an_entry_added_to_what_the_step_reads_is_seen(strategy):
    """A list the step sums over, a dict it reads with ``.get`` and a partial that gets
    a new keyword: each grew by an entry the first trace never saw (it was ignored)."""

    def loss(v, weight, scale=1.0):
        return v * weight * scale

    class T:
        def __init__(self):
            self.ws, self.hp = [jnp.float32(1.0)], {}
            self.loss = functools.partial(loss, weight=jnp.float32(1.0))

        def step(self, x):
            return self.loss(sum(self.ws) * total(x) * self.hp.get("scale", 1.0))

    t, x = T(), batch(strategy)
    assert first(strategy, strategy.run(t.step, args=(x,))) == 8.0
    t.ws.append(jnp.float32(2.0))
    assert first(strategy, strategy.run(t.step, args=(x,))) == 24.0
    t.hp["scale"] = 0.5
    assert first(strategy, strategy.run(t.step, args=(x,))) == 12.0
    t.loss = functools.partial(loss, weight=jnp.float32(1.0), scale=2.0)
    assert first(strategy, strategy.run(t.step, args=(x,))) == 24.0


def test_a_new_partial_or_bound_method_each_call_is_not_a_new_trace(strategy):
    """Rebuilt each step with new array arguments (or rebound to the same method): the
    arrays are inputs, so one trace; a callback reading a growing history is not the
    step's state."""

    def loss(v, weight):
        return v * weight

    class T:
        def __init__(self):
            self.history = []
            self.on_epoch_end = lambda: print(self.history[-1])

        def scaled(self, v):
            return v

        def step(self, x):
            return self.post(self.loss(total(x)))

    t, x, seen = T(), batch(strategy), []
    for i in range(4):
        t.loss, t.post = functools.partial(loss, weight=jnp.float32(i)), t.scaled
        seen.append(first(strategy, strategy.run(t.step, args=(x,))))
        t.history.append(seen[-1])
    assert seen == [0.0, 8.0, 16.0, 24.0]
    assert jd.experimental.step_count(t.step) == 1


def test_a_generator_in_the_state_is_not_walked(strategy):
    """JAX warns when a generator is flattened as a pytree: the state walk never does that."""
    batches = (i for i in range(3))

    def step():
        return jnp.float32(len(str(batches)) > 0)

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert first(strategy, strategy.run(step)) == 1.0


_HELPER_SCALE = jnp.ones(2)


@jax.jit
def _scaled_by_a_global(x):
    return x * _HELPER_SCALE


def test_a_jitted_helper_reading_a_rebound_global_reads_it_now(strategy):
    """A module-level ``@jax.jit`` helper reading a global array, called from the step: JAX
    keeps the helper's jaxpr with the array it read then as a constant, so the step kept the
    first value after the global was rebound (silently, eager and under jd.function)."""
    global _HELPER_SCALE

    def step(x):
        return _scaled_by_a_global(x)

    compiled = jd.function(lambda: strategy.run(step, args=(jnp.ones(2),)))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing left a constant, nothing to warn of
            for value in (1.0, 5.0, 7.0):
                _HELPER_SCALE = jnp.asarray(np.full(2, value, np.float32))
                eager = strategy.run(step, args=(jnp.ones(2),))
                for out in (eager, compiled()):
                    for v in strategy.experimental_local_results(out):
                        np.testing.assert_array_equal(v, [value, value])
        assert jd.experimental.step_count(step) == 1  # the rebound global is an input
        _HELPER_SCALE = jnp.full(2, 9.0)  # weakly typed: traced again, and read
        out = strategy.run(step, args=(jnp.ones(2),))
        np.testing.assert_array_equal(strategy.experimental_local_results(out)[0], [9.0, 9.0])
    finally:
        _HELPER_SCALE = jnp.ones(2)
