"""The host side of a Keras step under a strategy: batches that go to `jax.jit` as they are, and
several steps in one program (``steps_per_execution``).

A Keras batch of NumPy arrays whose rows split evenly over the replicas is TF's split without any
work: each leaf is viewed as ``(replicas, rows // replicas, ...)`` (a reshape, no copy) and handed
to the jitted step, whose ``in_shardings`` put row ``i`` on replica ``i`` in the one transfer
`jax.jit` makes anyway (`host_split`). Any other batch (a partial one, host-only leaves, several
processes) goes through the strategy's own split (`jaxdist._input.place.Placer`).

``steps_per_execution=k`` (TF: a ``tf.function`` around k steps) stacks k such batches and runs
the k steps in one program, a `jax.lax.scan` over them (`scan_steps`; unrolled on CPUs).

>>> import numpy as np
>>> leaves = host_split((np.zeros((8, 3)), np.arange(8)), 4)
>>> [x.shape for x in leaves[0]], leaves[1]
([(4, 2, 3), (4, 2)], 8)
>>> host_split((np.zeros((6, 3)),), 4) is None  # 6 rows over 4 replicas: TF's uneven split
True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def host_split(batch: Any, n: int, device: Any = None) -> tuple[Any, int] | None:
    """``batch`` with every leaf viewed as ``(n, rows // n, ...)`` (``n == 1``: as it is), and
    its number of rows; None unless every leaf is a NumPy array (or, with one replica, an
    array on its ``device``; or an array on one CPU device, read back as NumPy) of numbers with
    the same number of rows, divisible by ``n``."""
    if n == 1 and type(batch) is tuple and batch and numpy_rows(batch):
        return batch, batch[0].shape[0]  # Keras' own (x, y[, sample_weight]): as it is
    leaves, treedef = jax.tree.flatten(batch)
    if n == 1 and leaves and numpy_rows(leaves):  # one replica, NumPy leaves: as they are
        return batch, leaves[0].shape[0]
    rows = {int(np.shape(x)[0]) if np.ndim(x) else -1 for x in leaves}
    b = rows.pop() if len(rows) == 1 else -1
    if b <= 0 or b % n:
        return None
    out: list[Any] = []
    for x in leaves:
        if isinstance(x, jax.Array) and n == 1 and x.sharding.device_set == {device}:
            out.append(x)
            continue
        if isinstance(x, jax.Array) and _on_one_cpu(x):  # fit in the scope: Keras put it there
            x = np.asarray(x)
        if type(x) is not np.ndarray or x.dtype.kind not in "biufc":
            return None
        out.append(x if n == 1 else x.reshape((n, b // n, *x.shape[1:])))
    return jax.tree.unflatten(treedef, out), b


def numpy_rows(leaves: Sequence) -> bool:
    """Whether ``leaves`` are NumPy arrays of numbers with the same (non-zero) number of rows
    (a one-replica batch `host_split` passes as it is; Keras' own tuples are checked without
    a tree flatten: it runs on every step).

    >>> import numpy as np
    >>> numpy_rows((np.ones((4, 2)), np.zeros(4))), numpy_rows((np.ones((4, 2)), np.zeros(3)))
    (True, False)
    """
    b = leaves[0].shape[0] if type(leaves[0]) is np.ndarray and leaves[0].ndim else 0
    for x in leaves:
        if (
            type(x) is not np.ndarray
            or not x.ndim
            or x.shape[0] != b
            or x.dtype.kind not in "biufc"
        ):
            return False
    return b > 0


def _on_one_cpu(x: jax.Array) -> bool:
    devices = x.sharding.device_set
    return len(devices) == 1 and getattr(next(iter(devices)), "platform", None) == "cpu"


def same_shapes(batches: list) -> bool:
    """Whether the batches have one structure, shape and dtype (they can be stacked)."""
    specs = {
        (jax.tree.structure(b), tuple((np.shape(x), x.dtype) for x in jax.tree.leaves(b)))
        for b in batches
    }
    return len(specs) == 1


def scan_steps(
    step: Callable, state: Any, copies: Any, batches: tuple, concat: bool, unroll: bool
) -> tuple:
    """``len(batches)`` steps ``step(state, copies, batch) -> (outputs, state, copies)`` in one
    program: outputs of the last step, or (``concat``, predict) every step's concatenated.

    ``unroll``: the steps one after the other in the program rather than a loop (XLA's CPU
    backend runs convolutions inside a loop body about 20x slower: measured on the conv net
    of benchmarks/bench_keras.py, 8 simulated devices, jax 0.10)."""
    if len(batches) == 1:
        return step(state, copies, batches[0])
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *batches)

    def body(carry: tuple, batch: Any) -> tuple:
        outputs, state, copies = step(*carry, batch)
        return (state, copies), outputs

    scanned: tuple[Any, Any] = jax.lax.scan(body, (state, copies), stacked, unroll=unroll)
    (state, copies), stepwise = scanned
    if concat:
        return jax.tree.map(lambda x: x.reshape((-1, *x.shape[2:])), stepwise), state, copies
    return jax.tree.map(lambda x: x[-1], stepwise), state, copies
