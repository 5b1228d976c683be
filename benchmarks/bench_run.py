"""Steady-state step time of `Strategy.run` divided by raw `jax.pmap` on the same step.

python -m benchmarks.bench_run
"""

# ruff: noqa: I001
from benchmarks import common

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import jaxdist as jd  # noqa: E402

R = 8


def _tiny(strategy):
    def step(x):
        return x + 1.0

    x = strategy.experimental_distribute_values_from_function(lambda c: jnp.ones(4))
    raw = jax.pmap(step, axis_name="r", devices=strategy.extended.replicas.devices)
    xs = jax.tree.leaves(x)[0]
    return (lambda: strategy.run(step, args=(x,))), (lambda: raw(xs))


def _mlp(strategy, batch=32):
    rng = np.random.default_rng(0)
    params = {
        "w1": rng.normal(size=(784, 256)).astype(np.float32) * 0.05,
        "b1": np.zeros(256, np.float32),
        "w2": rng.normal(size=(256, 10)).astype(np.float32) * 0.05,
        "b2": np.zeros(10, np.float32),
    }
    x = rng.normal(size=(R, batch, 784)).astype(np.float32)
    y = rng.integers(0, 10, size=(R, batch))

    def loss_fn(p, x, y):
        h = jax.nn.relu(x @ p["w1"] + p["b1"])
        logits = h @ p["w2"] + p["b2"]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))

    def jd_step(p, x, y):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        g = jd.get_replica_context().all_reduce("MEAN", g)
        return jax.tree.map(lambda a, b: a - 0.01 * b, p, g), loss

    def raw_step(p, x, y):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        g = lax.pmean(g, "r")
        return jax.tree.map(lambda a, b: a - 0.01 * b, p, g), loss

    dv = strategy.experimental_distribute_values_from_function
    state = {"jd": dv(lambda c: params), "raw": None}
    xd, yd = (
        dv(lambda c: x[c.replica_id_in_sync_group]),
        dv(lambda c: y[c.replica_id_in_sync_group]),
    )
    state["raw"] = jax.tree.map(
        lambda v: jax.tree.leaves(v)[0], state["jd"], is_leaf=jd.PerReplica.__instancecheck__
    )
    raw = jax.pmap(raw_step, axis_name="r", devices=strategy.extended.replicas.devices)

    def run_jd():
        state["jd"], loss = strategy.run(jd_step, args=(state["jd"], xd, yd))
        return jax.tree.leaves(loss)[0]

    def run_raw():
        state["raw"], loss = raw(state["raw"], jax.tree.leaves(xd)[0], jax.tree.leaves(yd)[0])
        return loss

    return run_jd, run_raw


def _captured(strategy):
    """A trainer whose eager step reads its weights from ``self`` (TF's style; jaxdist
    fetches them on every call) vs raw pmap given the same weights as an argument."""

    class Trainer:
        def __init__(self):
            self.w = jnp.ones((256, 256)) * 0.01
            self.b = jnp.zeros(256)

        def step(self, x):
            return jnp.tanh(x @ self.w + self.b)

    t = Trainer()
    x = strategy.experimental_distribute_values_from_function(lambda c: jnp.ones((8, 256)))
    xs = jax.tree.leaves(x)[0]
    wr = strategy.extended.replicas.replicate(t.w)
    br = strategy.extended.replicas.replicate(t.b)
    raw = jax.pmap(
        lambda x, w, b: jnp.tanh(x @ w + b),
        in_axes=(0, None, None),
        axis_name="r",
        devices=strategy.extended.replicas.devices,
    )
    return (lambda: strategy.run(t.step, args=(x,))), (lambda: raw(xs, wr, br))


def main():
    strategy = jd.MirroredStrategy([f"/cpu:{i}" for i in range(R)])
    rows, data = [], {}
    for name, make, n in (
        ("tiny (x + 1)", _tiny, 300),
        ("MLP train step (784-256-10, batch 32/replica)", _mlp, 60),
        ("step reading self.w, self.b (256x256) vs raw pmap given them", _captured, 200),
    ):
        ours, raw = make(strategy)
        # Same blocking policy for both: wait on the step 4 calls back (jaxdist's cap).
        r = common.paired(ours, raw, n)
        data[name], row = common.paired_row(name, r)
        rows.append(row)
    md = common.table(
        [
            "step (8 simulated CPU devices)",
            "strategy.run µs",
            "raw jax.pmap µs",
            "ratio, median of 9 rounds (range)",
        ],
        rows,
    )
    print(md)
    return {"title": "Strategy.run vs raw jax.pmap", "markdown": md, "data": data}


if __name__ == "__main__":
    main()
