"""`jd.function` (TF's `tf.function`): the TF trainer idiom ported with one decorator changed.

Expected values come from the replica count or from the same training written out in NumPy
on one device; compile counts from the function's own `experimental_get_tracing_count`.
"""

import collections
import gc
import os
import tracemalloc

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import mirrored

import jaxdist as jd

R = (1, 2, 8)


@pytest.mark.parametrize("n", R)
def test_tf_trainer_idiom_reads_self_afresh(n):
    """TF's ``@tf.function def distributed_step(self, x): return strategy.run(self.step,
    ...)``: 8, 40 on 8 replicas where plain jax.jit freezes the first weights (8, 8)."""
    strategy = mirrored(n)

    class Trainer:
        def __init__(self):
            self.w = jnp.ones(())

        def step(self, x):
            return jd.get_replica_context().all_reduce("SUM", x * self.w)

        @jd.function
        def distributed_step(self, x):
            return strategy.run(self.step, args=(x,))

    t = Trainer()
    first = strategy.experimental_local_results(t.distributed_step(jnp.ones(())))
    t.w = jnp.full((), 5.0, jnp.float32)  # as the first (``jnp.full((), 5.0)`` is weakly typed)
    second = strategy.experimental_local_results(t.distributed_step(jnp.ones(())))
    assert [float(v) for v in first] == [float(n)] * n
    assert [float(v) for v in second] == [5.0 * n] * n
    assert t.distributed_step.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("n", R)
def test_plain_jax_jit_names_the_state_it_freezes(n):
    strategy = mirrored(n)

    class Trainer:
        def __init__(self):
            self.params = {"kernel": jnp.ones(())}

        def step(self, x):
            return x * self.params["kernel"]

    t = Trainer()
    with pytest.warns(RuntimeWarning, match=r"self\.params\['kernel'\].*@jd\.function"):
        jax.jit(lambda x: strategy.run(t.step, args=(x,)))(jnp.ones(()))


GB, ROWS, EPOCHS = 8, 37, 20  # 5 batches an epoch, the last of 5 rows: 100 steps


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 3)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5], np.float32) + 0.3).astype(np.float32)
    return [(x[i : i + GB], y[i : i + GB]) for i in range(0, ROWS, GB)]


def _numpy_training(batches, schedule):
    """The same training on one device, in NumPy (float64): (params after each step)."""
    w, b, lr, out, saved = np.zeros(3), 0.0, 0.1, [], None
    for step in range(EPOCHS * len(batches)):
        lr, restore = schedule(step, lr)
        if restore is not None:
            w, b = saved
        x, y = batches[step % len(batches)]
        err = x @ w + b - y
        w, b = w - lr * 2 * x.T @ err / GB, b - lr * 2 * err.sum() / GB
        if step == 29:
            saved = (w.copy(), b)
        out.append((w.copy(), b))
    return out


def _schedule(step, lr):
    """The host's changes between calls: a new learning rate at step 50, the weights saved
    after step 29 restored before step 70."""
    return (0.05 if step >= 50 else lr), (True if step == 70 else None)


class Trainer:
    """A TF-style trainer: parameters, learning rate and step count on ``self``."""

    def __init__(self, strategy):
        self.strategy = strategy
        self.params = {"w": jnp.zeros(3), "b": jnp.zeros(())}
        self.lr = 0.1
        self.steps = 0

    def replica_grads(self, x, y):
        def loss(p):
            return jnp.sum((x @ p["w"] + p["b"] - y) ** 2) / GB

        return jax.grad(loss)(self.params)

    @jd.function
    def train_step(self, x, y):
        grads = self.strategy.run(self.replica_grads, args=(x, y))
        grads = self.strategy.reduce("SUM", grads, axis=None)
        self.params = jax.tree.map(lambda p, g: p - self.lr * g, self.params, grads)
        self.steps += 1


@pytest.mark.parametrize("n", R)
def test_a_trainer_on_self_trains_to_one_devices_parameters(n):
    strategy, batches = mirrored(n), _data()
    expected = _numpy_training(batches, _schedule)
    t, dist = Trainer(strategy), strategy.experimental_distribute_dataset(batches)
    step, saved = 0, None
    for _ in range(EPOCHS):
        for x, y in dist:
            t.lr, restore = _schedule(step, t.lr)
            if restore:
                t.params = jax.tree.map(jnp.asarray, saved)  # a checkpoint restored
            t.train_step(x, y)
            if step == 29:
                saved = jax.tree.map(np.asarray, t.params)
            w, b = expected[step]
            np.testing.assert_allclose(np.asarray(t.params["w"]), w, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(float(t.params["b"]), b, rtol=1e-5, atol=1e-5)
            step += 1
    assert step == 100 and t.steps == 100 and type(t.steps) is int
    # one trace per batch shape (full, partial), each once more when the host first set lr
    assert t.train_step.experimental_get_tracing_count() <= 4


@pytest.mark.parametrize("n", R)
def test_a_flax_nnx_model_with_an_optax_optimizer_on_self(n):
    from conftest import require

    nnx, optax = require("flax.nnx"), require("optax")
    strategy, batches = mirrored(n), _data()
    expected = _numpy_training(batches, lambda step, lr: (lr, None))

    class Trainer:
        def __init__(self):
            model = nnx.Linear(3, 1, rngs=nnx.Rngs(0))
            self.graphdef, params = nnx.split(model, nnx.Param)
            self.params = jax.tree.map(jnp.zeros_like, params)  # the NumPy run starts at 0
            self.tx = optax.sgd(0.1)
            self.opt_state = self.tx.init(self.params)

        def replica_grads(self, x, y):
            def loss(params):
                model = nnx.merge(self.graphdef, params)
                return jnp.sum((model(x)[:, 0] - y) ** 2) / GB

            return jax.grad(loss)(self.params)

        @jd.function
        def train_step(self, x, y):
            grads = strategy.reduce("SUM", strategy.run(self.replica_grads, args=(x, y)), None)
            updates, self.opt_state = self.tx.update(grads, self.opt_state, self.params)
            self.params = optax.apply_updates(self.params, updates)

    t, step = Trainer(), 0
    for _ in range(EPOCHS):
        for x, y in strategy.experimental_distribute_dataset(batches):
            t.train_step(x, y)
            w, b = expected[step]
            model = nnx.merge(t.graphdef, t.params)
            np.testing.assert_allclose(np.asarray(model.kernel[...])[:, 0], w, atol=1e-5)
            np.testing.assert_allclose(np.asarray(model.bias[...])[0], b, atol=1e-5)
            step += 1
    assert t.train_step.experimental_get_tracing_count() == 2  # full and partial batches


@pytest.mark.parametrize("n", R)
def test_a_keras_stateless_call_trainer(n):
    from conftest import require

    keras = require("keras")
    strategy, batches = mirrored(n), _data()
    expected = _numpy_training(batches, lambda step, lr: (lr, None))

    class Trainer:
        def __init__(self):
            dense = keras.layers.Dense(1, kernel_initializer="zeros")
            self.model = keras.Sequential([keras.Input((3,)), dense])
            self.trainable = [v.value for v in self.model.trainable_variables]
            self.lr = 0.1

        def replica_grads(self, x, y):
            def loss(trainable):
                pred, _ = self.model.stateless_call(trainable, [], x)
                return jnp.sum((pred[:, 0] - y) ** 2) / GB

            return jax.grad(loss)(self.trainable)

        @jd.function
        def train_step(self, x, y):
            grads = strategy.reduce("SUM", strategy.run(self.replica_grads, args=(x, y)), None)
            self.trainable = [p - self.lr * g for p, g in zip(self.trainable, grads)]

    t, step = Trainer(), 0
    for _ in range(EPOCHS):
        for x, y in strategy.experimental_distribute_dataset(batches):
            t.train_step(x, y)
            w, b = expected[step]
            np.testing.assert_allclose(np.asarray(t.trainable[0])[:, 0], w, atol=1e-5)
            np.testing.assert_allclose(np.asarray(t.trainable[1])[0], b, atol=1e-5)
            step += 1
    assert t.train_step.experimental_get_tracing_count() == 2


TRACES: list = []


@pytest.mark.unchecked
def test_orbits_per_call_train_fn_compiles_once_and_memory_stays_flat():
    """Model Garden's orbit trainer: ``train_fn`` defined inside each ``train_step``, the
    step a lambda over it: the same code over the same captures is the same step."""
    strategy = mirrored(2)

    class Trainer:
        def __init__(self):
            self.state = {"w": jnp.ones(3)}

        def train_step(self, inputs):
            def train_fn(state, inputs):
                TRACES.append(1)  # runs when traced only
                return jd.get_replica_context().all_reduce("SUM", inputs * state["w"])

            return strategy.run(lambda inputs: train_fn(self.state, inputs), args=(inputs,))

    t, x = Trainer(), jnp.ones(3)
    for _ in range(200):  # warm: caches and allocator at their working size
        t.train_step(x)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(10_000):
        out = t.train_step(x)
        if i == 5_000:
            t.state = {"w": jnp.full(3, 2.0)}  # state changed from outside: seen
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert [float(v) for v in strategy.experimental_local_results(out)[0]] == [4.0] * 3
    assert grown < 50 * 2**20
    assert len(TRACES) <= 2


@pytest.mark.parametrize("n", R)
def test_next_of_an_iterator_argument_reads_a_new_batch_every_call(n):
    """TF's ``train_step(iterator)`` with ``next(iterator)`` inside the tf.function: each
    call reads the next batch (fetched on the host, passed in); a partial last batch is one
    more trace; the end of the data is TF's OutOfRangeError from the call."""
    strategy = mirrored(n)
    data = [np.full((8, 2), float(i), np.float32) for i in range(4)]
    data.append(np.full((5, 2), 10.0, np.float32))

    class Trainer:
        def __init__(self):
            self.total = jnp.zeros(())

        @jd.function
        def train_step(self, iterator):
            batch = next(iterator)
            sums = strategy.run(jnp.sum, args=(batch,))
            self.total = self.total + strategy.reduce("SUM", sums, axis=None)

    t = Trainer()
    for _ in range(3):
        iterator = iter(strategy.experimental_distribute_dataset(data))
        for _ in range(len(data)):
            t.train_step(iterator)
        with pytest.raises(jd.errors.OutOfRangeError):
            t.train_step(iterator)
    assert float(t.total) == 3 * sum(float(d.sum()) for d in data)
    assert t.train_step.experimental_get_tracing_count() == 2  # full and partial batches


@pytest.mark.parametrize("n", R)
def test_a_python_loop_of_next_calls_is_that_many_steps_in_one_program(n):
    strategy = mirrored(n)
    data = [np.full((8,), float(i), np.float32) for i in range(12)]

    class Trainer:
        def __init__(self):
            self.iterator = iter(strategy.experimental_distribute_dataset(data))
            self.seen = jnp.zeros(())

        @jd.function
        def train(self, steps):
            for _ in range(steps):  # a Python int: static, as in tf.function
                batch = next(self.iterator)
                self.seen = self.seen + strategy.reduce(
                    "SUM", strategy.run(jnp.sum, args=(batch,)), axis=None
                )

    t = Trainer()
    t.train(4)
    assert float(t.seen) == 8 * (0 + 1 + 2 + 3)
    t.train(4)
    assert float(t.seen) == 8 * sum(range(8))
    assert t.train.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("n", R)
def test_donated_state_trains_alike_and_frees_the_old_arrays(n):
    strategy, batches = mirrored(n), _data()

    class Donating(Trainer):
        @jd.function(donate_state=True)
        def train_step(self, x, y):
            grads = self.strategy.run(self.replica_grads, args=(x, y))
            grads = self.strategy.reduce("SUM", grads, axis=None)
            self.params = jax.tree.map(lambda p, g: p - self.lr * g, self.params, grads)

    plain, donating = Trainer(strategy), Donating(strategy)
    donating.params = jax.tree.map(jnp.copy, plain.params)
    for x, y in strategy.experimental_distribute_dataset(batches * 2):
        old = donating.params["w"]
        plain.train_step(x, y)
        donating.train_step(x, y)
        assert old.is_deleted()
        np.testing.assert_array_equal(np.asarray(donating.params["w"]), plain.params["w"])


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="donate_state"):
        jd.function(lambda: 0, donate_state="yes")
    with pytest.raises(TypeError, match="function or method; got int"):
        jd.function(3)
    with pytest.raises(TypeError, match="leaf 0 is an unhashable set"):
        jd.function(lambda x: x)({1, 2})


@pytest.mark.parametrize("n", (2, 8))
def test_a_step_reading_a_distributed_value_of_its_state_reads_its_own_component(n):
    """As eagerly: a `PerReplica` on ``self`` read inside the step (not passed to it) gives
    each replica its own component, as TF's per-replica variables do (it was the whole
    stacked array once, then an error)."""
    strategy = mirrored(n)

    class Trainer:
        def __init__(self):
            self.x = strategy.experimental_distribute_values_from_function(
                lambda c: jnp.full(2, float(c.replica_id_in_sync_group))
            )

        def step(self):
            return jax.tree.map(lambda a: a * 2, self.x)

        @jd.function
        def call(self):
            return strategy.run(self.step)

        @jd.function
        def passed(self):
            return strategy.run(lambda x: x * 2, args=(self.x,))  # the way: an argument

    t = Trainer()
    out = strategy.experimental_local_results(t.call())
    assert [float(v[0]) for v in out] == [2.0 * r for r in range(n)]
    out = strategy.experimental_local_results(t.passed())
    assert [float(v[0]) for v in out] == [2.0 * r for r in range(n)]


@pytest.mark.parametrize("n", (1, 2, 8))
def test_under_plain_jax_jit_every_state_route_is_current_or_named(n):
    """The routes of tests/state/test_state_routes.py under a user's own jax.jit: a change after
    the first call is either seen or was named by a warning at the trace: never silent."""
    import warnings

    from test_state_routes import CONTAINERS, NUMBER_ROUTES, T

    strategy = mirrored(n)
    x = strategy.experimental_distribute_values_from_function(lambda c: jnp.ones(8 // n))

    def total(v):
        return jd.get_replica_context().all_reduce("SUM", jnp.sum(v))

    def check(step, change):
        f = jax.jit(lambda v: strategy.run(step, args=(v,)))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            before = float(strategy.experimental_local_results(f(x))[0])
        change()
        after = float(strategy.experimental_local_results(f(x))[0])
        named = [w for w in caught if "@jd.function" in str(w.message)]
        assert named or after != before, (before, after)

    for read in NUMBER_ROUTES.values():
        t = T()
        check(lambda v, t=t, read=read: read(t) * total(v), lambda t=t: setattr(t, "lr", 3.0))
    for kind, (make, read) in CONTAINERS.items():
        if kind == "weakref":
            continue
        state = {"c": make(jnp.zeros(()))}
        check(
            lambda v, state=state, read=read: read(state["c"]) + total(v),
            lambda state=state, make=make: state.__setitem__("c", make(jnp.ones(()))),
        )


def test_a_function_that_fails_while_traced_leaves_its_state_as_it_was():
    strategy = mirrored(2)

    class Trainer:
        def __init__(self):
            self.w = jnp.ones(())

        @jd.function
        def broken(self):
            self.w = self.w + 1.0
            raise ValueError("user error after an assignment")

    t = Trainer()
    w = t.w
    with pytest.raises(ValueError, match="user error"):
        t.broken()
    assert t.w is w  # no tracer left on the object
    del strategy


@pytest.mark.parametrize("n", R)
def test_tf1_experimental_run_and_get_next_inside_a_jd_function(n):
    strategy = mirrored(n)
    data = [np.arange(8.0) + 8 * i for i in range(3)]
    totals = [float(d.sum()) for d in data]
    iterator = strategy.make_dataset_iterator(data)

    @jd.function
    def tf1_step(it):
        return strategy.reduce("SUM", strategy.experimental_run(jnp.sum, it), axis=None)

    with pytest.warns(DeprecationWarning):
        assert [float(tf1_step(iterator)) for _ in data] == totals
    it = iter(strategy.experimental_distribute_dataset(data))

    @jd.function
    def tf2_step(it):
        return strategy.reduce("SUM", strategy.run(jnp.sum, args=(it.get_next(),)), axis=None)

    assert [float(tf2_step(it)) for _ in data] == totals


@pytest.mark.parametrize("n", (1, 2, 3, 4, 8))
def test_a_function_traced_again_differentiates_state_an_earlier_call_stored(n):
    """A `jd.function` trainer traced again (a batch of another shape, a learning rate the
    host changed) after it stored ``self.w``: the stored array's sharding spans the
    replicas' own mesh, and the step's gradient of it inside the map gives TF's answer
    (was JAX's "Mesh for all inputs should be equal" on 2 replicas or more)."""
    strategy = mirrored(n)

    class Trainer:
        def __init__(self):
            self.w, self.lr = jnp.zeros(3), 0.1

        def replica_step(self, x):
            return jax.grad(lambda w: -jnp.sum(x @ w))(self.w)  # -(its rows) per entry

        @jd.function
        def train(self, x):
            g = strategy.reduce("SUM", strategy.run(self.replica_step, args=(x,)), axis=None)
            self.w = self.w - self.lr * g

    t = Trainer()
    rows = (8 * n, 4 * n, 4 * n)
    dist = strategy.experimental_distribute_dataset([np.ones((r, 3), np.float32) for r in rows])
    for i, x in enumerate(dist):
        t.lr = 0.05 if i == 2 else 0.1
        t.train(x)
    np.testing.assert_allclose(np.asarray(t.w), np.full(3, (0.8 + 0.4 + 0.2) * n), rtol=1e-6)


@pytest.mark.parametrize("n", (2, 4, 8))
def test_jit_of_run_takes_its_own_output_back(n):
    """``f(f(w, x), x)`` under the user's `jax.jit`: the first output is replicated over
    the replicas' mesh, and the step that closes over it (and differentiates it) runs."""
    strategy = mirrored(n)

    @jax.jit
    def f(w, x):
        g = strategy.run(lambda x: jax.grad(lambda v: jnp.sum(x @ v) * 2)(w), args=(x,))
        return w + strategy.reduce("SUM", g, axis=None)

    x = next(iter(strategy.experimental_distribute_dataset([np.ones((2 * n, 3), np.float32)])))
    w = f(f(jnp.zeros(3), x), x)
    np.testing.assert_allclose(np.asarray(w), np.full(3, 2 * 2 * 2.0 * n))


@pytest.mark.parametrize("n", (1, 2))
def test_appending_a_computed_value_to_a_list_is_an_error_naming_the_list(n):
    """``self.history.append(loss)`` inside a `jd.function` (TF runs it once, at the trace):
    a `RuntimeError` naming ``self.history`` and the fix, the list left as it was (was
    jaxdist's internal ``NotAPlace`` with an ``IndexError``'s text on every call); a dict
    entry the function assigns is written back."""
    strategy = mirrored(n)

    class Trainer:
        def __init__(self):
            self.w, self.history, self.metrics = jnp.ones(2), [], {}

        @jd.function
        def step(self, x):
            loss = strategy.reduce("SUM", strategy.run(lambda x: jnp.sum(self.w * x), (x,)), None)
            self.history.append(loss)
            return loss

        @jd.function
        def logged(self, x):
            self.metrics["loss"] = jnp.sum(self.w * x)
            return self.metrics["loss"]

    t = Trainer()
    for _ in range(2):
        with pytest.raises(RuntimeError, match=r"appended a value it computed to self\.history"):
            t.step(jnp.ones(2))
    assert t.history == []
    t.history = collections.deque()  # a deque alike (its index past the end is no place)
    with pytest.raises(RuntimeError, match=r"to self\.history \(a deque\)"):
        t.step(jnp.ones(2))
    assert len(t.history) == 0
    assert float(t.logged(jnp.full(2, 3.0))) == 6.0 and float(t.metrics["loss"]) == 6.0


def test_an_iterator_argument_is_read_inside_and_a_dataset_loop_says_what_to_pass():
    """``next(it)`` and ``for x in it`` inside a `jd.function` read an iterator argument's
    elements on each call; ``for x in dist_dataset`` inside is a `RuntimeError` telling to
    pass ``iter(dist_dataset)`` (it told to pass the dataset, which was passed)."""
    strategy = mirrored(2)
    batches = [np.full((4, 2), float(i), np.float32) for i in range(4)]
    dist = strategy.experimental_distribute_dataset(batches)
    total_of = lambda x: strategy.reduce("SUM", strategy.run(jnp.sum, (x,)), None)  # noqa: E731

    @jd.function
    def one(it):
        return total_of(next(it))

    @jd.function
    def total(it):
        t = 0.0
        for x in it:
            t = t + total_of(x)
        return t

    it = iter(dist)
    assert [float(one(it)) for _ in range(3)] == [0.0, 8.0, 16.0]
    assert float(total(iter(dist))) == 8.0 * (0 + 1 + 2 + 3)
    with pytest.raises(RuntimeError, match=r"for x in dataset.*iter\(dist_dataset\)"):
        total(dist)
