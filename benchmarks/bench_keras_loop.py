"""TF's custom-training tutorial shape over a Keras model, per call, against Keras' stateless step.

python -m benchmarks.bench_keras_loop            # one CPU device
python -m benchmarks.bench_keras_loop --devices 8

Ours: a Keras model, optimizer and metric built in ``strategy.scope()``; the replica step calls
the model, takes the gradients, calls ``optimizer.apply_gradients`` and ``metric.update_state``;
``strategy.run`` inside ``@jd.function`` (the state on the objects, read afresh and written back
by jaxdist). The reference: the Keras JAX guide's stateless step (``stateless_call``,
``optimizer.stateless_apply``, ``metric.stateless_update_state``) under raw ``jax.jit``, the
state passed in and returned. A model of 10 and of 40 Dense layers (16 wide), batch 8; the
median of interleaved rounds (`benchmarks.common.paired`).
"""

# isort: off
from benchmarks import common  # first: 8 simulated devices, before JAX and jaxdist start

import os  # noqa: E402

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import jaxdist as jd  # noqa: E402

# isort: on


def _objects(layers):
    model = keras.Sequential(
        [keras.Input((16,))]
        + [keras.layers.Dense(16, activation="relu") for _ in range(layers - 1)]
        + [keras.layers.Dense(4)]
    )
    opt = keras.optimizers.SGD(0.01)
    opt.build(model.trainable_variables)
    metric = keras.metrics.SparseCategoricalAccuracy()
    return model, opt, metric


LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")


def _ours(strategy, layers, x, y):
    with strategy.scope():
        model, opt, metric = _objects(layers)

    def replica_step(xb, yb):
        tv = [v.value for v in model.trainable_variables]
        ntv = [v.value for v in model.non_trainable_variables]

        def loss_fn(tv):
            logits, _ = model.stateless_call(tv, ntv, xb)
            return jnp.mean(LOSS(yb, logits)), logits

        (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(tv)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        metric.update_state(yb, logits)
        return loss

    @jd.function
    def train_step(xb, yb):
        losses = strategy.run(replica_step, args=(xb, yb))
        return strategy.reduce("SUM", losses, axis=None)

    if strategy.num_replicas_in_sync > 1:
        x, y = (
            strategy.experimental_distribute_values_from_function(
                lambda ctx, a=a: np.split(a, strategy.num_replicas_in_sync)[
                    ctx.replica_id_in_sync_group
                ]
            )
            for a in (x, y)
        )
    return lambda: train_step(x, y)


def _reference(layers, x, y):
    model, opt, metric = _objects(layers)
    model.build((None, 16))

    @jax.jit
    def step(state, xb, yb):
        tv, ntv, ov, mv = state

        def loss_fn(tv):
            logits, ntv2 = model.stateless_call(tv, ntv, xb)
            return jnp.mean(LOSS(yb, logits)), (logits, ntv2)

        (loss, (logits, ntv2)), grads = jax.value_and_grad(loss_fn, has_aux=True)(tv)
        tv, ov = opt.stateless_apply(ov, grads, tv)
        mv = metric.stateless_update_state(mv, yb, logits)
        return loss, (tv, ntv2, ov, mv)

    box = {
        "s": (
            [v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables],
            [v.value for v in opt.variables],
            [v.value for v in metric.variables],
        )
    }

    def call():
        loss, box["s"] = step(box["s"], x, y)
        return loss

    return call


def rows(devices=1, sizes=(10, 40), n=300):
    strategy = jd.MirroredStrategy([f"/cpu:{i}" for i in range(devices)])
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8 * devices, 16)).astype(np.float32)
    y = rng.integers(0, 4, 8 * devices)
    out, data = [], {}
    for layers in sizes:
        name = f"{layers} Dense layers, batch 8 a replica"
        r = common.paired(_ours(strategy, layers, x, y), _reference(layers, x, y), n)
        data[name], row = common.paired_row(name, r)
        out.append(row)
    header = [
        f"({devices} CPU device{'s' if devices > 1 else ''})",
        "tutorial step under jd.function µs",
        "stateless step under jax.jit µs",
        "time ratio (range)",
    ]
    return {"markdown": common.table(header, out), **data}


if __name__ == "__main__":
    import sys

    devices = int(sys.argv[sys.argv.index("--devices") + 1]) if "--devices" in sys.argv else 1
    print(rows(devices)["markdown"])
