"""Keras `model.fit` under a jaxdist strategy vs jaxdist's own jitted custom loop and Keras' own
`keras.distribution.DataParallel`, on the peer benchmark's MLP (784-512-512-10, global batch 256,
SGD 0.1, 8 simulated devices, full batches only). Paired: the loops alternate in one process,
and each round's ratio is taken between neighbours.

python -m benchmarks.bench_keras [--quick]

With TensorFlow's interpreter in ``$JAXDIST_TF_PYTHON`` (or ``.venv-tf``, as `make bench-tf`),
TF Keras `model.fit` under `tf.distribute.MirroredStrategy` on 8 logical CPUs
(`benchmarks/peer/tf_keras_fit.py`) runs too, in its own process between jaxdist's rounds.
"""

import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")

# isort: off
from benchmarks import common  # noqa: E402  (8 simulated devices before JAX starts)
import jaxdist as jd  # noqa: E402  (before Keras starts JAX: jaxdist sizes XLA's CPU pool)
import keras  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

# isort: on

R, BATCH, STEPS = 8, 256, 40


def _data(steps):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * BATCH, 784)).astype(np.float32)
    y = rng.integers(0, 10, size=(steps * BATCH,)).astype(np.int32)
    return x, y


def _model():
    model = keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(512, activation="relu"),
            keras.layers.Dense(512, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def fit_loop(distribution_scope, x, y):
    """One epoch of model.fit, built under ``distribution_scope`` (a jaxdist or Keras scope)."""
    with distribution_scope():
        model = _model()

    def epoch():
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        return model.trainable_variables[0].value

    return epoch


def custom_loop(strategy, x, y):
    """One epoch of jaxdist's jitted custom loop on the same Keras model (the recipe of docs/guides/keras.md)."""
    with strategy.scope():
        model = _model()
        optimizer = keras.optimizers.SGD(0.1)
        optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def step(state, x, y):
        tv, ov = state

        def loss_of(tv):
            logits, _ = model.stateless_call(tv, [], x, training=True)
            return jd.nn.compute_average_loss(loss_fn(y, logits))

        loss, grads = jax.value_and_grad(loss_of)(tv)
        grads = jd.get_replica_context().all_reduce(jd.ReduceOp.SUM, grads)
        tv, ov = optimizer.stateless_apply(ov, grads, tv)
        return (tv, ov), loss

    train = jax.jit(lambda state, x, y: strategy.run(step, args=(state, x, y)))
    state = ([v.value for v in model.trainable_variables], [v.value for v in optimizer.variables])
    box = [strategy.run(lambda s: s, args=(state,))]
    batches = [(x[i : i + BATCH], y[i : i + BATCH]) for i in range(0, len(x), BATCH)]
    dist = strategy.experimental_distribute_dataset(batches)

    def epoch():
        loss = None
        for xb, yb in dist:
            box[0], loss = train(box[0], xb, yb)
        return strategy.reduce(jd.ReduceOp.SUM, loss, axis=None)

    return epoch


def _tf_python():
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.environ.get("JAXDIST_TF_PYTHON") or os.path.join(
        here, "..", ".venv-tf", "bin", "python"
    )
    return path if os.path.exists(path) else None


def tf_keras_fit(python, rounds):
    """TF Keras fit ms/step per round (its own process; None without TensorFlow)."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer", "tf_keras_fit.py")
    out = subprocess.run([python, script, str(rounds)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["ms_per_step"]


def _time(fn):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    return (time.perf_counter() - t0) / STEPS


def main(quick=False):
    rounds = 3 if quick else 7
    x, y = _data(STEPS)
    strategy = jd.MirroredStrategy([f"/cpu:{i}" for i in range(R)])
    keras_dp = keras.distribution.DataParallel(devices=jax.devices()[:R])
    loops = {
        "fit_jaxdist": fit_loop(strategy.scope, x, y),
        "custom_jaxdist": custom_loop(strategy, x, y),
        "fit_keras_dataparallel": fit_loop(keras_dp.scope, x, y),
    }
    for fn in loops.values():  # compile
        _time(fn)
    times = {k: [] for k in loops}
    names = list(loops)
    for i in range(rounds):
        for k in names if i % 2 else names[::-1]:
            times[k].append(_time(loops[k]))
    python = _tf_python()
    if python:  # TF's fit: its own process after jaxdist's rounds (not interleaved with them)
        times["fit_tf_keras_mirrored"] = [t / 1e3 for t in tf_keras_fit(python, rounds)]
        names.append("fit_tf_keras_mirrored")
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = {
        other: statistics.median(a / b for a, b in zip(times["fit_jaxdist"], times[other]))
        for other in names[1:]
    }
    rows = [
        [k, f"{med[k] * 1e3:.1f}", f"{1 / med[k]:.1f}", f"{ratio.get(k, 1.0):.2f}"] for k in names
    ]
    markdown = common.table(["loop", "ms/step", "steps/s", "fit_jaxdist time / this"], rows)
    return {
        "ms_per_step": {k: v * 1e3 for k, v in med.items()},
        "ratio": ratio,
        "markdown": markdown,
    }


if __name__ == "__main__":
    out = main(quick="--quick" in sys.argv)
    print(out["markdown"])
