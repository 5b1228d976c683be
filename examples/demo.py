"""The main demo: data-parallel training on N replicas gives the same model as one device.

Run it with ``python examples/demo.py`` (or ``make demo``). It trains a small MLP
classifier on scikit-learn's bundled 8x8 digits (no download) twice:

1. with `jaxdist.MirroredStrategy` on ``--devices`` replicas (8 simulated CPU
   devices by default, or the real accelerators when JAX finds some), input
   from `Strategy.experimental_distribute_dataset` (the last batch of every
   epoch is partial and is split unevenly over the replicas, as in TF),
   gradients combined with `ReplicaContext.all_reduce` inside `Strategy.run`,
   and the loss metric combined with `Strategy.reduce`;
2. with `jaxdist.OneDeviceStrategy` on the same global batches.

Every replica scales its summed per-example loss by the *global* batch size,
so an update never depends on how the batch was split, and both runs must end
with the same parameters (to float32 tolerance). The demo prints the largest
parameter difference, the test accuracy and the time per step of both runs,
writes a loss-curve PNG, and exits non-zero when the runs disagree or the
accuracy is below 0.9.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

TOLERANCE = 1e-4
MIN_ACCURACY = 0.9
DEFAULT_DEVICES = 8
HIDDEN = 64
TEST_SIZE = 300


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python examples/demo.py",
        description="Train an MLP on the 8x8 digits with MirroredStrategy, then check that "
        "it matches OneDeviceStrategy on the same global batches.",
    )
    p.add_argument(
        "--devices",
        type=int,
        default=None,
        help=f"replicas of MirroredStrategy (default: {DEFAULT_DEVICES} simulated CPU devices, "
        "or every accelerator when JAX finds some)",
    )
    p.add_argument("--epochs", type=int, default=10, help="training epochs (default: 10)")
    p.add_argument("--batch-size", type=int, default=64, help="global batch size (default: 64)")
    p.add_argument(
        "--cross-device-ops",
        choices=("all-reduce", "one-device"),
        default="all-reduce",
        help="NcclAllReduce() or ReductionToOneDevice() (default: all-reduce)",
    )
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    p.add_argument(
        "--learning-rate", type=float, default=None, help="default: 3e-3 (adam), 0.1 (sgd)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of init, split and shuffling")
    p.add_argument("--no-plot", action="store_true", help="do not write the loss-curve PNG")
    p.add_argument(
        "--out", default="loss_curve.png", help="path of the loss-curve PNG (default: %(default)s)"
    )
    args = p.parse_args(argv)
    if args.devices is not None and args.devices < 1:
        p.error("--devices must be >= 1")
    if args.epochs < 1:
        p.error("--epochs must be >= 1")
    if args.batch_size < 1:
        p.error("--batch-size must be >= 1")
    return args


def configure_simulated_devices(n: int) -> None:
    """Asks XLA for ``n`` host (CPU) devices, unless the user set the flag already.

    Must run before JAX initializes its backends; it only affects the CPU
    platform, so on a GPU machine the real devices are still used.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()


# -- data and model --------------------------------------------------------------------------


def load_data(seed: int) -> tuple:
    """The digits, scaled to [0, 1] and split into a train and a test set."""
    import numpy as np
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    test, train = order[:TEST_SIZE], order[TEST_SIZE:]
    return (x[train], y[train]), (x[test], y[test])


def make_batches(x: Any, y: Any, batch_size: int, rng: Any) -> list:
    """One epoch of ``(x, y)`` numpy batches in a shuffled order; the last may be partial."""
    order = rng.permutation(len(x)) if rng is not None else range(len(x))
    order = list(order)
    return [
        (x[order[i : i + batch_size]], y[order[i : i + batch_size]])
        for i in range(0, len(order), batch_size)
    ]


def init_params(seed: int, sizes: Sequence[int]) -> dict:
    """He-initialized MLP parameters as numpy arrays (the same for both runs)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    params = {}
    for i, (m, n) in enumerate(zip(sizes[:-1], sizes[1:])):
        params[f"w{i}"] = (rng.standard_normal((m, n)) * np.sqrt(2.0 / m)).astype(np.float32)
        params[f"b{i}"] = np.zeros((n,), np.float32)
    return params


def apply_mlp(params: dict, x: Any) -> Any:
    import jax

    n = len(params) // 2
    for i in range(n):
        x = x @ params[f"w{i}"] + params[f"b{i}"]
        if i < n - 1:
            x = jax.nn.relu(x)
    return x


def per_example_loss(params: dict, x: Any, y: Any) -> Any:
    import optax

    return optax.softmax_cross_entropy_with_integer_labels(apply_mlp(params, x), y)


def make_train_step(optimizer: Any):
    """The replica step: per-example loss, local grads, SUM all-reduce, optimizer update.

    The step is traced once for a full batch (one `jax.pmap` program for every
    replica) and, for a partial batch, once per shape of replica slice inside one
    program (see docs/guides/input.md, "Partial batches"); the local pieces are `jax.jit`
    functions, inlined there.
    """
    import jax
    import jax.numpy as jnp
    import optax

    import jaxdist as jd

    @jax.jit
    def local_grads(params, x, y, global_batch):
        def loss_fn(p):
            losses = per_example_loss(p, x, y)
            return jnp.sum(losses) / global_batch, losses

        return jax.grad(loss_fn, has_aux=True)(params)

    @jax.jit
    def apply_update(params, opt_state, grads):
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def train_step(params, opt_state, batch):
        x, y = batch
        ctx = jd.get_replica_context()
        # The global batch size of *this* step (a partial batch has fewer examples):
        # each replica scales its summed loss by it, so the split does not matter.
        global_batch = ctx.all_reduce(jd.ReduceOp.SUM, jnp.float32(x.shape[0]))
        grads, losses = local_grads(params, x, y, global_batch)
        # The sum of the replicas' contributions is the gradient of the global-batch mean.
        grads = ctx.all_reduce(jd.ReduceOp.SUM, grads)
        params, opt_state = apply_update(params, opt_state, grads)
        return params, opt_state, losses

    return train_step


def _eval_step(params, x, y):
    import jax.numpy as jnp

    return (jnp.argmax(apply_mlp(params, x), axis=-1) == y).astype(jnp.float32)


def eval_step(params, x, y):
    """Per-example correctness (1.0 or 0.0) of the test examples of one replica."""
    import jax

    global _EVAL_JIT
    if _EVAL_JIT is None:
        _EVAL_JIT = jax.jit(_eval_step)
    return _EVAL_JIT(params, x, y)


_EVAL_JIT = None


# -- training --------------------------------------------------------------------------------


def train(strategy, name, params0, optimizer, epochs_of_batches, test_batches, log):
    """Trains from ``params0`` on the given batches; returns params, losses, times, accuracy."""
    import jax
    import numpy as np
    from tqdm.auto import tqdm

    import jaxdist as jd

    n = strategy.num_replicas_in_sync
    step = make_train_step(optimizer)
    with strategy.scope():
        # Replicated state: every replica starts from the same parameters.
        params = strategy.experimental_distribute_values_from_function(lambda ctx: params0)
        opt_state = strategy.experimental_distribute_values_from_function(
            lambda ctx: optimizer.init(params0)
        )
    total = sum(len(b[1]) for batches in epochs_of_batches for b in batches)
    losses, step_times, full_times = [], [], []
    nominal = len(epochs_of_batches[0][0][1])
    bar = tqdm(
        total=total,
        unit="ex",
        unit_scale=True,
        desc=f"{name:>22}",
        leave=True,
        file=log,
        dynamic_ncols=True,
    )
    start = time.perf_counter()
    for batches in epochs_of_batches:
        for batch, dist_batch in zip(batches, strategy.experimental_distribute_dataset(batches)):
            t0 = time.perf_counter()
            params, opt_state, per_ex = strategy.run(step, args=(params, opt_state, dist_batch))
            loss = float(strategy.reduce(jd.ReduceOp.MEAN, per_ex, axis=0))
            dt = time.perf_counter() - t0
            losses.append(loss)
            step_times.append(dt)
            if len(batch[1]) == nominal:
                full_times.append(dt)
            bar.update(len(batch[1]))
            bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
    bar.close()
    train_s = time.perf_counter() - start

    correct = 0.0
    count = 0
    dist_test = strategy.experimental_distribute_dataset(test_batches)
    for (_, y), (dx, dy) in zip(test_batches, dist_test):
        hits = strategy.run(eval_step, args=(params, dx, dy))
        correct += float(strategy.reduce(jd.ReduceOp.SUM, hits, axis=0))
        count += len(y)
    replicas = [jax.tree.map(np.asarray, p) for p in strategy.experimental_local_results(params)]
    # Steady-state step time: the median of full-batch steps (skips the compiling ones).
    per_step = float(np.median(full_times or step_times))
    return {
        "name": name,
        "replicas": replicas,
        "params": replicas[0],
        "losses": losses,
        "per_step_s": per_step,
        "train_s": train_s,
        "accuracy": correct / count,
        "num_replicas": n,
    }


def max_abs_diff(a: dict, b: dict) -> float:
    import numpy as np

    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


def plot(results: list, path: str, steps_per_epoch: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    styles = ["-", "--"]
    for r, style in zip(results, styles):
        ax.plot(range(1, len(r["losses"]) + 1), r["losses"], style, label=r["name"], lw=1.5)
    for e in range(steps_per_epoch, len(results[0]["losses"]), steps_per_epoch):
        ax.axvline(e + 0.5, color="0.85", lw=0.8, zorder=0)
    ax.set_yscale("log")
    ax.set_xlabel("step (grey lines: epoch ends, after a partial batch)")
    ax.set_ylabel("training loss (global-batch mean)")
    ax.set_title("8x8 digits MLP: replicas vs one device")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    configure_simulated_devices(max(DEFAULT_DEVICES, args.devices or 0))

    import jax
    import numpy as np
    import optax

    import jaxdist as jd

    log = sys.stderr
    backend = jax.default_backend()
    available = jax.local_devices()
    if args.devices is None:
        n = len(available) if backend != "cpu" else min(DEFAULT_DEVICES, len(available))
    else:
        n = args.devices
    if n > len(available):
        print(
            f"error: --devices {n} but JAX has {len(available)} local {backend} device(s); "
            "on CPU, set XLA_FLAGS=--xla_force_host_platform_device_count=N before starting.",
            file=sys.stderr,
        )
        return 2
    devices = available[:n]
    cdo = jd.NcclAllReduce() if args.cross_device_ops == "all-reduce" else jd.ReductionToOneDevice()
    mirrored = jd.MirroredStrategy(devices, cross_device_ops=cdo)
    one = jd.OneDeviceStrategy(devices[0])

    (x_train, y_train), (x_test, y_test) = load_data(args.seed)
    rng = np.random.default_rng(args.seed + 1)
    epochs = [make_batches(x_train, y_train, args.batch_size, rng) for _ in range(args.epochs)]
    test_batches = make_batches(x_test, y_test, args.batch_size, None)
    partial = len(x_train) % args.batch_size
    lr = args.learning_rate or (3e-3 if args.optimizer == "adam" else 0.1)
    optimizer = optax.adam(lr) if args.optimizer == "adam" else optax.sgd(lr, momentum=0.9)
    params0 = init_params(args.seed, (x_train.shape[1], HIDDEN, HIDDEN, 10))

    print(f"jax {jax.__version__}, backend {backend}, {len(available)} local device(s)")
    print(
        f"data: 8x8 digits, {len(x_train)} train / {len(x_test)} test; global batch "
        f"{args.batch_size}, {len(epochs[0])} steps/epoch, last batch {partial or args.batch_size}"
        f" examples; {args.epochs} epoch(s); {args.optimizer} lr={lr:g}"
    )
    print(f"strategy: {type(mirrored).__name__} x{n} with {cdo!r}; reference: {one!r}")
    sys.stdout.flush()

    results = [
        train(mirrored, f"MirroredStrategy x{n}", params0, optimizer, epochs, test_batches, log),
        train(one, "OneDeviceStrategy", params0, optimizer, epochs, test_batches, log),
    ]
    rep, ref = results
    spread = max(max_abs_diff(rep["replicas"][0], r) for r in rep["replicas"])
    diff = max_abs_diff(rep["params"], ref["params"])
    agree = diff < TOLERANCE and spread < TOLERANCE
    for r in results:
        print(
            f"{r['name']:>22}: final loss {r['losses'][-1]:.4f}, test accuracy "
            f"{r['accuracy']:.4f}, {r['per_step_s'] * 1e3:.2f} ms/step "
            f"({args.batch_size / r['per_step_s']:,.0f} examples/s), "
            f"trained in {r['train_s']:.1f} s"
        )
    print(f"max |param diff| between replicas: {spread:.1e}")
    print(
        f"max |param diff| replicas vs one device: {diff:.1e} "
        f"({'OK' if agree else f'FAIL: tolerance {TOLERANCE:g}'})"
    )
    if not args.no_plot:
        plot(results, args.out, len(epochs[0]))
        print(f"loss curve written to {os.path.abspath(args.out)}")
    accurate = all(r["accuracy"] > MIN_ACCURACY for r in results)
    if not accurate:
        print(f"FAIL: test accuracy must be above {MIN_ACCURACY}", file=sys.stderr)
    return 0 if agree and accurate else 1


if __name__ == "__main__":
    sys.exit(main())
