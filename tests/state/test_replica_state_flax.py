"""A flax linen model trained in DenseNet's ``distributed_train_step`` shape (issue 45):
``self.state = strategy.run(self.replica_step, args=batch)``, the replica step taking
``jax.grad`` through ``self.model.apply(self.state, x)`` and all-reducing the gradients.

TF's meaning of the reduction: each replica's loss is its rows' summed loss over the GLOBAL
batch size (``tf.nn.compute_average_loss`` with ``global_batch_size``), and the replicas'
gradients are summed (``all_reduce("SUM", ...)``), so the update is the global batch's mean
gradient whatever the split, and a replica with no rows (a partial batch's) adds nothing.

Expected values: the same training on one device in plain JAX (no jaxdist), splitting each
batch as TF does (``ceil(b / R)`` rows per replica, in order) and summing the replicas'
gradients in replica order.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import mirrored

import jaxdist as jd

nn = pytest.importorskip("flax.linen")
optax = pytest.importorskip("optax")

LR = 0.05
SIZES = (16, 16, 16, 10)  # three full batches and a partial last one


class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(4, (3, 3))(x))
        x = nn.Conv(4, (3, 3))(x)
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(1)(x)[:, 0]


def _data(seed=0):
    rng = np.random.RandomState(seed)
    out = []
    for b in SIZES:
        x = rng.randn(b, 6, 6, 3).astype(np.float32)
        y = (x.mean(axis=(1, 2, 3)) + 0.1 * rng.randn(b)).astype(np.float32)
        out.append((x, y))
    return out


def _init():
    return Net().init(jax.random.PRNGKey(0), jnp.zeros((1, 6, 6, 3)))


def _loss(model, params, x, y, global_batch):
    """One replica's loss: its rows' summed squared error over the global batch size."""
    return jnp.sum((model.apply(params, x) - y) ** 2) / global_batch


def _split(b, n):
    per = -(-b // n)
    return [(min(r * per, b), min((r + 1) * per, b)) for r in range(n)]


def _reference(batches, n, tx=None):
    """The same training on one device, plain JAX: each replica's gradient, summed in order."""
    model, params = Net(), _init()
    opt_state = tx.init(params) if tx is not None else None
    grad = jax.jit(jax.grad(_loss, argnums=1), static_argnums=0)
    for x, y in batches:
        b = x.shape[0]
        g = None
        for s, e in _split(b, n):
            gr = grad(model, params, jnp.asarray(x[s:e]), jnp.asarray(y[s:e]), jnp.float32(b))
            g = gr if g is None else jax.tree.map(jnp.add, g, gr)
        if tx is None:
            params = jax.tree.map(lambda p, d: p - LR * d, params, g)
        else:
            updates, opt_state = tx.update(g, opt_state, params)
            params = optax.apply_updates(params, updates)
    return params, opt_state


def _component(tree, r):
    """Replica ``r``'s component of a tree whose leaves may be distributed values."""
    return jax.tree.map(
        lambda v: v.values[r] if isinstance(v, jd.DistributedValues) else v,
        tree,
        is_leaf=lambda v: isinstance(v, jd.DistributedValues),
    )


def _assert_every_replica(strategy, got, want):
    for r in range(strategy.num_replicas_in_sync):
        mine = _component(got, r)
        assert jax.tree.structure(mine) == jax.tree.structure(want)
        for a, b in zip(jax.tree.leaves(mine), jax.tree.leaves(want)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


class FlaxModel:
    """DenseNet's shape: the replica step returns the new params, the step stores them."""

    def __init__(self, strategy):
        self.strategy = strategy
        self.model = Net()
        self.state = _init()

    def replica_step(self, x, y, global_batch):
        g = jax.grad(lambda p: _loss(self.model, p, x, y, global_batch))(self.state)
        g = jd.get_replica_context().all_reduce("SUM", g)
        return jax.tree.map(lambda p, d: p - LR * d, self.state, g)

    def step(self, batch, global_batch):
        x, y = batch
        self.state = self.strategy.run(self.replica_step, args=(x, y, global_batch))


class FlaxOptaxModel(FlaxModel):
    """The same with optax: the update made after the all-reduce, ``opt_state`` on ``self``
    and assigned in the replica step (TF's ``optimizer.apply_gradients``)."""

    def __init__(self, strategy, tx):
        super().__init__(strategy)
        self.tx = tx
        self.opt_state = tx.init(self.state)

    def replica_step(self, x, y, global_batch):
        g = jax.grad(lambda p: _loss(self.model, p, x, y, global_batch))(self.state)
        g = jd.get_replica_context().all_reduce("SUM", g)
        updates, self.opt_state = self.tx.update(g, self.opt_state, self.state)
        return optax.apply_updates(self.state, updates)


def _train(strategy, m, how, plain_start=True):
    step = jd.function(m.step) if how == "jd.function" else m.step
    batches = _data()
    for batch, (x, _) in zip(strategy.experimental_distribute_dataset(batches), batches):
        step(batch, jnp.float32(x.shape[0]))
    if how == "jd.function":
        # one trace per global batch shape (the full batches' and the partial last one's),
        # and on more than one replica one more: the first call reads the params as plain
        # arrays (every replica the same), the later ones as the `PerReplica` that
        # ``strategy.run`` returned (each replica its own component), a different input
        kinds = 2 if plain_start and strategy.num_replicas_in_sync > 1 else 1
        assert step.experimental_get_tracing_count() == len(set(SIZES)) + kinds - 1
    return batches


@pytest.mark.parametrize("n", (1, 2, 8))
@pytest.mark.parametrize("how", ["jd.function", "eager"])
def test_flax_apply_in_the_replica_step_trains_as_one_device(n, how):
    strategy = mirrored(n)
    m = FlaxModel(strategy)
    batches = _train(strategy, m, how)
    want, _ = _reference(batches, n)
    _assert_every_replica(strategy, m.state, want)


@pytest.mark.parametrize("n", (1, 2, 8))
@pytest.mark.parametrize("how", ["jd.function", "eager"])
def test_flax_apply_with_optax_state_on_self_trains_as_one_device(n, how):
    strategy = mirrored(n)
    tx = optax.sgd(LR, momentum=0.9)
    m = FlaxOptaxModel(strategy, tx)
    batches = _train(strategy, m, how)
    want, want_opt = _reference(batches, n, tx)
    _assert_every_replica(strategy, m.state, want)
    _assert_every_replica(strategy, m.opt_state, want_opt)


@pytest.mark.parametrize("n", (2, 8))
def test_flax_params_distributed_from_the_start_trace_once_per_batch_shape(n):
    """The params made a `PerReplica` before the first call: every call reads the same
    kind of input, so one trace per batch shape and no more."""
    strategy = mirrored(n)
    m = FlaxModel(strategy)
    params = m.state
    m.state = strategy.experimental_distribute_values_from_function(lambda ctx: params)
    batches = _train(strategy, m, "jd.function", plain_start=False)
    want, _ = _reference(batches, n)
    _assert_every_replica(strategy, m.state, want)
