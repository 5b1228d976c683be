"""What real TF programs hit when run as written (issue 31, item 4), at 1, 2 and 8 replicas
and on OneDeviceStrategy.

Expected values come from the replica count (each replica's batch sums to 8 / R, so the
all-reduced sum is 8 on every strategy) or from the same computation on one device.
"""

import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ones_batch, require, total

import jaxdist as jd


def local(s, out):
    return s.experimental_local_results(out)[0]


def nest(value, levels):
    for k in range(levels):
        value = {f"level{k}": value}
    return value


@pytest.mark.parametrize("levels", [7, 25])
def test_state_many_dict_levels_deep_is_fresh(strat, levels):
    """Arrays 7 and 25 dict levels below ``self`` (it was frozen from 7: 8, 8, 8)."""

    class T:
        def __init__(self):
            self.state = nest(jnp.zeros(()), levels)

        def step(self, x):
            return jax.tree.leaves(self.state)[0] + total(x)

    t, x, seen = T(), ones_batch(strat), []
    for _ in range(3):
        v = local(strat, strat.run(t.step, args=(x,)))
        t.state = nest(v, levels)
        seen.append(float(v))
    assert seen == [8.0, 16.0, 24.0]
    assert jd.experimental.step_count(t.step) == 1


def test_optax_adam_over_a_flax_model_read_from_self_matches_one_device(strat):
    """An optax Adam state over a flax model (10+ levels): every leaf is read afresh, so
    the parameters after 4 steps are one device's (80 of 91 leaves stayed frozen)."""
    optax = require("optax")
    nn = require("flax.linen")

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            for i in range(3):
                x = nn.tanh(nn.Dense(4, name=f"dense{i}")(x))
            return x

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(1)(Block(name="encoder")(Block(name="inner")(x)))

    model, tx = Model(), optax.adam(0.05)
    params = model.init(jax.random.key(0), jnp.ones((1, 3)))
    data = np.linspace(-1, 1, 24, dtype=np.float32).reshape(8, 3)
    n = strat.num_replicas_in_sync

    class Trainer:
        def __init__(self):
            self.state = {"params": params, "opt": tx.init(params)}

        def train_step(self, x):  # reads the Adam moments too, 10+ levels below self
            def loss(p):
                return jnp.sum(model.apply(p, x) ** 2) / 8.0

            p = self.state["params"]
            g = jd.get_replica_context().all_reduce("SUM", jax.grad(loss)(p))
            updates, opt = tx.update(g, self.state["opt"], p)
            return optax.apply_updates(p, updates), opt

    t = Trainer()
    x = strat.experimental_distribute_values_from_function(
        lambda c: data[c.replica_id_in_sync_group * (8 // n) :][: 8 // n]
    )
    want_p, want_o = params, tx.init(params)
    for _ in range(4):
        new_p, new_o = strat.run(t.train_step, args=(x,))
        first = lambda tree: jax.tree.map(  # noqa: E731
            lambda v: local(strat, v), tree, is_leaf=jd.DistributedValues.__instancecheck__
        )
        t.state = {"params": first(new_p), "opt": first(new_o)}
        one = jax.grad(lambda p: jnp.mean(model.apply(p, data) ** 2))(want_p)
        updates, want_o = tx.update(one, want_o, want_p)
        want_p = optax.apply_updates(want_p, updates)
    for got, ref in zip(
        jax.tree.leaves(t.state), jax.tree.leaves({"params": want_p, "opt": want_o})
    ):
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-4, atol=1e-6)
    assert jd.experimental.step_count(t.train_step) == 1


def _rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


@pytest.mark.unchecked
def test_a_step_defined_inside_each_call_reuses_its_program(strat):
    """``def train_fn`` inside ``train_step`` (a new function each call, same code and same
    captured trainer): one trace for every call, and memory flat (it compiled every call,
    ~1.6-6 MB each)."""
    traces = []

    class Trainer:
        def __init__(self):
            self.w = jnp.zeros(())

        def train_step(self, x):
            def train_fn(x):
                traces.append(1)  # runs when the step is traced
                return self.w + total(x)

            return strat.run(train_fn, args=(x,))

    t, x = Trainer(), ones_batch(strat)
    for _ in range(3):
        t.w = local(strat, t.train_step(x))
    assert float(t.w) == 24.0 and len(traces) == 1
    gc.collect()
    before = _rss_mb()
    for _ in range(2000):
        t.train_step(x)
    gc.collect()
    assert len(traces) == 1
    assert _rss_mb() - before < 20.0


@pytest.mark.parametrize("where", ["self", "closure", "global"])
def test_a_per_replica_kept_in_state_is_never_read_as_its_stacked_array(strat, where):
    """A `PerReplica` stored where the step reads it: never the (R, 3) stacked array (the
    sum gave 72 on 8 replicas where each holds 9): each replica reads its own component."""
    global KEPT
    value = strat.experimental_distribute_values_from_function(lambda c: jnp.full(3, 3.0))

    class T:
        def __init__(self):
            self.params = value

        def step(self):
            return sum(jnp.sum(v) for v in jax.tree.leaves(self.params))

    def closure_step():
        return sum(jnp.sum(v) for v in jax.tree.leaves(value))

    def global_step():
        return sum(jnp.sum(v) for v in jax.tree.leaves(KEPT))

    KEPT = value
    fn = {"self": T().step, "closure": closure_step, "global": global_step}[where]
    if not isinstance(value, jd.DistributedValues):  # OneDeviceStrategy: a plain array
        assert float(local(strat, strat.run(fn))) == 9.0
        return
    out = strat.experimental_local_results(strat.run(fn))
    assert [float(v) for v in out] == [9.0] * len(out)


KEPT = None


def test_state_from_self_grad_and_a_retrace_on_one_replica(strat):
    """State read from ``self``, `jax.grad` and a new batch shape (the partial last batch):
    1-replica strategies ended in JAX's "Mesh for all inputs should be equal"."""

    class G:
        def __init__(self):
            self.w = jnp.ones(2)

        def step(self, x):
            g = jax.grad(lambda w: jnp.sum(w * x))(self.w)
            return self.w - 0.1 * jd.get_replica_context().all_reduce("SUM", g)

    g, n, want = G(), strat.num_replicas_in_sync, np.ones(2, np.float32)
    for rows in (8, 8, 16, 8):
        x = strat.experimental_distribute_values_from_function(
            lambda c, rows=rows: jnp.ones((rows // n, 2))
        )
        g.w = local(strat, strat.run(g.step, args=(x,)))
        want = want - 0.1 * rows  # d/dw sum(w * x) over all rows: rows per column
    np.testing.assert_allclose(np.asarray(g.w), want, rtol=1e-6)


def test_a_step_made_each_call_over_new_objects_runs_its_python(strat):
    """Same code, a new list captured each call: the compiled program is not reused for
    it (the step's Python appends to the list it captured, as TF eager runs it)."""
    x = ones_batch(strat)

    def call():
        kept = []

        def step(x):
            kept.append(1)
            return total(x)

        strat.run(step, args=(x,))
        return kept

    assert [call() for _ in range(3)] == [[1], [1], [1]]
