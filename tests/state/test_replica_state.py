"""TF's variables in the replica step: state updated inside ``strategy.run``'s step, read
per replica, written back as one value (mirrored) or a `PerReplica` (each replica its own).

Expected values are computed with NumPy on the whole batch (one device), never from jaxdist.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import mirrored

import jaxdist as jd

COUNTS = (1, 2, 3, 4, 8)
ROWS = 24  # split evenly over every replica count above
LR = 0.1


def _loss(w, x, y):
    return jnp.mean((x @ w - y) ** 2)


def _data(steps=3, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.rand(steps, ROWS, 3).astype(np.float32)
    return [(x[i], x[i].sum(1) + 0.5 * rng.rand(ROWS).astype(np.float32)) for i in range(steps)]


def _reference(batches, n):
    """The tutorial step on one device: each replica's mean-loss gradient, summed."""
    w, hits = np.zeros(3, np.float64), 0.0
    for x, y in batches:
        g = np.zeros(3)
        for xr, yr in zip(np.split(x, n), np.split(y, n)):
            g += 2.0 / len(xr) * xr.T.astype(np.float64) @ (xr @ w - yr)
        w = w - LR * g
        hits += float(np.sum(np.abs(x @ w - y) < 0.5))
    return w, hits


class Trainer:
    """TF's custom-training tutorial in its own shape: the update and the metric inside
    the replica step, the function around ``strategy.run`` only reduces the loss."""

    def __init__(self, strategy, hits=None):
        self.strategy = strategy
        self.w = jnp.zeros(3)
        self.hits = jnp.zeros(()) if hits is None else hits

    def replica_step(self, x, y):
        g = jd.get_replica_context().all_reduce("SUM", jax.grad(_loss)(self.w, x, y))
        self.w = self.w - LR * g  # TF: optimizer.apply_gradients
        self.hits = self.hits + jnp.sum(jnp.abs(x @ self.w - y) < 0.5)  # TF: metric update
        return _loss(self.w, x, y)

    @jd.function
    def train_step(self, batch):
        per_replica = self.strategy.run(self.replica_step, args=batch)
        return self.strategy.reduce("SUM", per_replica, axis=None)

    def eager_step(self, batch):
        per_replica = self.strategy.run(self.replica_step, args=batch)
        return self.strategy.reduce("SUM", per_replica, axis=None)


def _total(strategy, hits):
    if isinstance(hits, jd.DistributedValues):
        return float(strategy.reduce("SUM", hits, axis=None))
    return float(hits)


@pytest.mark.parametrize("n", COUNTS)
@pytest.mark.parametrize("how", ["jd.function", "eager"])
def test_the_tutorial_step_updates_state_inside_the_replica_step(n, how):
    strategy = mirrored(n)
    batches = _data()
    t = Trainer(strategy)
    for batch in strategy.experimental_distribute_dataset(batches):
        (t.train_step if how == "jd.function" else t.eager_step)(batch)
    w, hits = _reference(batches, n)
    # the weights are mirrored: one array the host reads, equal on every replica
    assert isinstance(t.w, jax.Array)
    np.testing.assert_allclose(np.asarray(t.w), w, rtol=1e-5, atol=1e-6)
    # the metric's total differs per replica: each replica keeps its own, summed on read
    assert isinstance(t.hits, jd.PerReplica) if n > 1 else isinstance(t.hits, jax.Array)
    assert _total(strategy, t.hits) == hits


@pytest.mark.parametrize("n", (1, 2, 8))
def test_state_made_per_replica_from_the_start_traces_once(n):
    strategy = mirrored(n)
    hits = strategy.experimental_distribute_values_from_function(lambda ctx: jnp.zeros(()))
    t = Trainer(strategy, hits=hits)
    batches = _data(steps=4)
    for batch in strategy.experimental_distribute_dataset(batches):
        t.train_step(batch)
    assert t.train_step.experimental_get_tracing_count() == 1
    w, total = _reference(batches, n)
    np.testing.assert_allclose(np.asarray(t.w), w, rtol=1e-5, atol=1e-6)
    assert _total(strategy, t.hits) == total


@pytest.mark.parametrize("n", (1, 2, 4, 8))
@pytest.mark.parametrize("how", ["jd.function", "eager"])
def test_a_step_storing_run_output_in_self_reads_its_own_component_next_call(n, how):
    """DenseNet's ``distributed_train_step`` shape: ``self.state = strategy.run(...)``,
    the replica step reading ``self.state`` (a dict of parameters)."""
    strategy = mirrored(n)

    class Model:
        def __init__(self):
            self.state = {"w": jnp.zeros(3), "b": jnp.zeros(())}

        def replica_step(self, x, y):
            def loss(p):
                return jnp.mean((x @ p["w"] + p["b"] - y) ** 2)

            g = jd.get_replica_context().all_reduce("SUM", jax.grad(loss)(self.state))
            return jax.tree.map(lambda p, d: p - LR * d, self.state, g)

        def step(self, batch):
            self.state = strategy.run(self.replica_step, args=batch)

    m = Model()
    step = jd.function(m.step) if how == "jd.function" else m.step
    batches = _data()
    for batch in strategy.experimental_distribute_dataset(batches):
        step(batch)
    w, b = np.zeros(3), 0.0
    for x, y in batches:
        gw, gb = np.zeros(3), 0.0
        for xr, yr in zip(np.split(x, n), np.split(y, n)):
            r = xr @ w + b - yr
            gw, gb = gw + 2.0 / len(xr) * xr.T @ r, gb + 2.0 / len(xr) * r.sum()
        w, b = w - LR * gw, b - LR * gb
    for r in range(n):
        state = jax.tree.map(
            lambda v, r=r: v.values[r] if isinstance(v, jd.DistributedValues) else v,
            m.state,
            is_leaf=lambda v: isinstance(v, jd.DistributedValues),
        )
        np.testing.assert_allclose(np.asarray(state["w"]), w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(float(state["b"]), b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", (2, 8))
@pytest.mark.parametrize("how", ["jd.function", "eager"])
def test_a_forgotten_all_reduce_leaves_each_replica_its_own_weights(n, how):
    strategy = mirrored(n)

    class T:
        w = None

        def replica_step(self, x):
            self.w = self.w - jnp.mean(x)  # no all-reduce: each replica's own
            return self.w

        def step(self, x):
            return strategy.run(self.replica_step, args=(x,))

    t = T()
    t.w = jnp.zeros(())
    step = jd.function(t.step) if how == "jd.function" else t.step
    x = np.arange(n * 2, dtype=np.float32)
    (batch,) = strategy.experimental_distribute_dataset([x])
    step(batch)
    assert isinstance(t.w, jd.PerReplica)  # never one replica's value chosen
    expected = [-x[2 * r : 2 * r + 2].mean() for r in range(n)]
    np.testing.assert_allclose([float(v) for v in t.w.values], expected)
    step(batch)  # each replica reads its own component on the next call
    np.testing.assert_allclose([float(v) for v in t.w.values], 2 * np.array(expected))


@pytest.mark.parametrize("n", (1, 2, 4, 8))
@pytest.mark.parametrize("how", ["eager", "jd.function", "jax.jit"])
def test_a_distributed_value_in_a_closure_is_read_per_replica(n, how):
    strategy = mirrored(n)
    table = strategy.experimental_distribute_values_from_function(
        lambda ctx: jnp.full((2,), float(ctx.replica_id_in_sync_group))
    )

    def step(x):
        return x + table["w"] if isinstance(table, dict) else x + table

    def call(x):
        return strategy.run(step, args=(x,))

    f = {"eager": call, "jd.function": jd.function(call), "jax.jit": jax.jit(call)}[how]
    out = strategy.experimental_local_results(f(jnp.ones(2)))
    for r, v in enumerate(out):
        np.testing.assert_allclose(np.asarray(v), [1.0 + r, 1.0 + r])


def test_an_assignment_under_a_users_jax_jit_names_the_replica_step():
    strategy = mirrored(2)

    class T:
        def __init__(self):
            self.w = jnp.zeros(())

        def replica_step(self, x):
            self.w = self.w + jd.get_replica_context().all_reduce("SUM", x)
            return x

    t = T()
    with pytest.raises(
        RuntimeError, match=r"T.replica_step assigned self.w while strategy.run was traced"
    ):
        jax.jit(lambda x: strategy.run(t.replica_step, args=(x,)))(jnp.ones(()))
    assert isinstance(t.w, jax.Array) and float(t.w) == 0.0  # as it was: no tracer left


class GlobalTrainer(Trainer):
    """The tutorial's loss: each replica's per-example losses over the global batch size
    (TF's ``compute_average_loss``), so that summing the replicas' gradients gives the
    global batch's, partial batches included."""

    def replica_step(self, x, y):
        def loss(w):
            return jd.nn.compute_average_loss((x @ w - y) ** 2, global_batch_size=GLOBAL)

        g = jd.get_replica_context().all_reduce("SUM", jax.grad(loss)(self.w))
        self.w = self.w - LR * g
        self.hits = self.hits + jnp.sum(jnp.abs(x @ self.w - y) < 0.5)
        return loss(self.w)


GLOBAL = 16


def _partial_reference(batches, splits):
    w, hits = np.zeros(3, np.float64), 0.0
    for (x, y), sizes in zip(batches, splits):
        g = np.zeros(3)
        for xr, yr in zip(np.split(x, np.cumsum(sizes)[:-1]), np.split(y, np.cumsum(sizes)[:-1])):
            g += 2.0 / GLOBAL * xr.T.astype(np.float64) @ (xr @ w - yr)
        w = w - LR * g
        hits += float(np.sum(np.abs(x @ w - y) < 0.5))
    return w, hits


@pytest.mark.parametrize("n", (2, 3, 4, 8))
@pytest.mark.parametrize("how", ["jd.function", "eager"])
def test_the_tutorial_step_on_a_partial_last_batch(n, how):
    """A partial last batch (21 rows: 16 then 5, some replicas empty on 8): the weights
    stay one value where the replicas agree, the metric's total each replica's own."""
    strategy = mirrored(n)
    rng = np.random.RandomState(1)
    x = rng.rand(21, 3).astype(np.float32)
    y = x.sum(1) + 0.5 * rng.rand(21).astype(np.float32)
    batches = [(x[:16], y[:16]), (x[16:], y[16:])] * 2  # two epochs
    t = GlobalTrainer(strategy)
    splits = []
    for batch in strategy.experimental_distribute_dataset(batches):
        splits.append([len(v) for v in strategy.experimental_local_results(batch[0])])
        (t.train_step if how == "jd.function" else t.eager_step)(batch)
    w, hits = _partial_reference(batches, splits)
    assert isinstance(t.w, jax.Array)  # the replicas agree: one value
    np.testing.assert_allclose(np.asarray(t.w), w, rtol=1e-5, atol=1e-6)
    assert _total(strategy, t.hits) == hits


@pytest.mark.parametrize("n", (1, 2, 8))
@pytest.mark.parametrize("placed", ["jd.function", "NamedSharding"])
def test_an_eager_step_differentiates_state_a_jd_function_wrote_or_a_mesh_holds(n, placed):
    """Train compiled, debug eagerly: after a jd.function wrote ``self.w`` back (or the
    user placed it with a NamedSharding on a mesh of their own), an eager step taking
    ``jax.grad`` of it gives the gradient (it was JAX's "Mesh for all inputs should be
    equal")."""
    strategy = mirrored(n)

    class T:
        def __init__(self):
            self.w = jnp.ones(3)

        def grad_step(self, x):
            g = jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(self.w)
            return jd.get_replica_context().all_reduce("SUM", g)

        @jd.function
        def train(self, x):
            g = strategy.run(self.grad_step, args=(x,))
            self.w = self.w - 0.1 * strategy.reduce("MEAN", g, axis=None)

    t = T()
    x = np.linspace(0.0, 1.0, 8 * 3, dtype=np.float32).reshape(8, 3)
    (batch,) = strategy.experimental_distribute_dataset([x])
    if placed == "jd.function":
        t.train(batch)
    else:
        mesh = jax.sharding.Mesh(np.array(jax.devices()[:n]), ("batch",))
        t.w = jax.device_put(
            jnp.full(3, 0.5), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        )
    w = np.asarray(t.w, np.float64)
    want = x.T.astype(np.float64) @ (1.0 - np.tanh(x @ w) ** 2)  # summed over replicas
    for g in strategy.experimental_local_results(strategy.run(t.grad_step, args=(batch,))):
        np.testing.assert_allclose(np.asarray(g), want, rtol=1e-5)
