"""`Strategy.reduce`, `Strategy.gather` and `experimental_local_results`, one leaf at a time.

Each function works on concrete values (eager) and on traced ones (inside
`jax.jit`, `lax` loops, ``merge_fn``) with the same rules: which op really runs
(`effective_ops`), Mirrored + SUM, non-distributed values, and MEAN as
`finish` with the true element count (also for uneven partial batches).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxdist._base.devices import AXIS, Replicas
from jaxdist._base.layout import all_on_cpu, as_array, host_view, is_tracer, shard_rows
from jaxdist._base.reduce_op import ReduceOp, finish
from jaxdist._collective.all_reduce import HierarchicalCopyAllReduce, NcclAllReduce
from jaxdist._collective.cross_device_ops import (
    ReductionToOneDevice,
    check_mirrored_sum,
    check_plain_sum,
    effective_ops,
)
from jaxdist._program import compile as _compile
from jaxdist._values.layout import is_traced, padded, stack
from jaxdist._values.values import DistributedValues, from_parts, from_stacked, is_distributed

MULTI_WORKER_RAGGED = (
    "Per-replica values of different shapes (a partial batch) cannot be combined across "
    "several workers here: make every global batch divisible by num_replicas_in_sync "
    "(e.g. drop the remainder)"
)


RANK0_FIX = {
    "strategy.reduce": "reduce rank-0 values (a loss, a count) across replicas with axis=None: "
    "strategy.reduce(op, value, axis=None)",
    "strategy.gather": "give each replica's value an axis to concatenate along first "
    "(x[None] inside the step)",
}


GATHER = "strategy.gather"


def _axis(axis: int, ndim: int, what: str, call: str = "strategy.reduce") -> int:
    if ndim == 0:
        raise ValueError(
            f"{call}(..., axis={axis}): there is no axis {axis} in {what} (rank 0: "
            f"scalars); {RANK0_FIX[call]}."
        )
    if not -ndim <= axis < ndim:
        raise ValueError(
            f"axis={axis} is out of range for {what} of rank {ndim} (valid: {-ndim} to {ndim - 1})."
        )
    return axis % ndim


@jax.jit
def _sum_rows(x: jax.Array) -> jax.Array:
    return jnp.sum(x, axis=1)


def _global(replicas: Replicas, value: DistributedValues, kind: str, op: Any = None) -> Any:
    """Multi-worker: ``value`` psum-ed or all-gathered over every process's replicas.

    One collective program; every process gets the same array (its first row).
    """
    pad = padded(value)
    x = stack(value, replicas) if pad is None else pad[0]
    if x is None:
        raise NotImplementedError(f"{MULTI_WORKER_RAGGED} (strategy.{kind}).")
    if x.sharding != replicas.sharding:
        x = jax.device_put(x, replicas.sharding)
    n = replicas.num

    def body(x: jax.Array) -> list:
        return [lax.all_gather(x, AXIS) if kind == "gather" else finish(op, lax.psum(x, AXIS), n)]

    program = _compile.collective(replicas, ("global", kind, op, x.shape, x.dtype), lambda: body)
    out = _compile.dispatch(program, replicas, x, what=f"strategy.{kind} across workers")
    return shard_rows(out[0])[0]


def all_rows(replicas: Replicas, value: DistributedValues) -> Any:
    """Every replica's row of a stacked or padded value, on this process's first device."""
    if replicas.multi_process and not is_traced(value):
        return _global(replicas, value, "gather")
    pad = padded(value)
    x = stack(value) if pad is None else pad[0]
    return x if is_traced(value) else jax.device_put(x, replicas.first_device)


@jax.jit
def _masked_row_sums(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Each row's sum over its first ``mask``-selected entries of axis 1."""
    mask = mask.reshape(mask.shape + (1,) * (x.ndim - 2))
    return jnp.sum(jnp.where(mask, x, 0), axis=1)


def _padded_sums(value: DistributedValues, ax: int) -> tuple:
    """Per-replica sums of a padded value along its batch axis, and the true count."""
    data, lengths = padded(value) or (None, ())
    if ax != 0:
        raise ValueError(
            f"A partial batch can be reduced along its batch axis (axis=0) only; got axis={ax}."
        )
    mask = np.arange(data.shape[1])[None, :] < np.asarray(lengths)[:, None]
    return from_stacked(_masked_row_sums(data, mask)), sum(lengths)


_BUILT_IN = (ReductionToOneDevice, NcclAllReduce, HierarchicalCopyAllReduce)
SMALL_BYTES = 1 << 16
"""Up to this many bytes, an eager CPU reduction is summed on the host (see `_host_sum`)."""


def across(replicas: Replicas, cdo: Any, op: ReduceOp, value: DistributedValues) -> Any:
    """``value``'s components combined onto this process's first replica device."""
    if replicas.multi_process and not is_traced(value):
        return _global(replicas, value, "reduce", op)
    target = replicas.first_device
    ops = effective_ops(cdo, value, (target,))
    small = _host_sum(ops, op, value, replicas)
    return small if small is not None else ops.reduce(op, value, target)


def _host_sum(ops: Any, op: ReduceOp, value: DistributedValues, replicas: Replicas) -> Any:
    """A small plain sum between CPU devices, computed where CPU devices keep their data.

    The components of a CPU value already live in host memory: reading them (a
    view), adding them with NumPy and placing the result costs a fraction of the
    separate device programs of the general path (TF's reduce of a metric is a
    host-side add too). Anything else (an ``accumulation_fn``, other devices,
    traced or large values) returns None.
    """
    x = stack(value)
    if type(ops) not in _BUILT_IN or getattr(ops, "accumulation_fn", None) is not None:
        return None  # a user's own CrossDeviceOps subclass always runs
    if x is None or is_tracer(x):
        return None
    if not replicas.on_cpu or x.nbytes > SMALL_BYTES or not all_on_cpu(x, ()):
        return None
    total = host_view(x).sum(axis=0, dtype=x.dtype)
    if op is ReduceOp.MEAN:
        total = np.true_divide(total, x.shape[0]).astype(_mean_dtype(x.dtype, x.shape[0]))
    if replicas.first_device == jax.local_devices()[0]:
        return jax.device_put(total)  # uncommitted there (see `released`): one transfer
    return jax.device_put(total, replicas.first_device)


@functools.lru_cache(maxsize=64)
def _mean_dtype(dtype: Any, count: int) -> Any:
    """The dtype of TF's MEAN of ``count`` values of ``dtype`` (`finish` decides)."""
    return jax.eval_shape(lambda: finish(ReduceOp.MEAN, jnp.zeros((), dtype), count)).dtype


def reduce_value(replicas: Replicas, cdo: Any, op: ReduceOp, value: Any, axis: int | None) -> Any:
    """`Strategy.reduce` of one leaf."""
    if not is_distributed(value):
        return _reduce_plain(replicas, op, value, axis)
    if axis is None:
        if check_mirrored_sum(op, value):
            first = value.values[0]
            return first if is_traced(value) else jax.device_put(first, replicas.first_device)
        return across(replicas, cdo, op, value)
    x = stack(value)
    if x is not None and is_traced(value):
        ax = _axis(axis, x.ndim - 1, "the per-replica values") + 1
        return finish(op, jnp.sum(x, axis=(0, ax)), x.shape[0] * x.shape[ax], elements=True)
    pad = padded(value)
    if pad is not None:
        sums, count = _padded_sums(value, _axis(axis, jnp.ndim(pad[0]) - 1, "the values"))
    elif x is not None:
        ax = _axis(axis, x.ndim - 1, "the per-replica values")
        sums = from_stacked(_sum_rows(jnp.moveaxis(x, ax + 1, 1) if ax else x))
        count = x.shape[0] * x.shape[ax + 1]
    else:
        rows = [as_array(p) for p in value.values]
        axes = [_axis(axis, p.ndim, f"replica {i}'s value") for i, p in enumerate(rows)]
        if replicas.multi_process:
            raise NotImplementedError(f"{MULTI_WORKER_RAGGED} (strategy.reduce).")
        sums = from_parts([jnp.sum(p, axis=a) for p, a in zip(rows, axes)])
        count = sum(p.shape[a] for p, a in zip(rows, axes))
    return finish(op, across(replicas, cdo, ReduceOp.SUM, sums), count, elements=True)


def released(x: Any, replicas: Replicas) -> Any:
    """An eager CPU result on the default device, uncommitted (a zero-copy view).

    Committed arrays on different devices cannot meet in one `jax.jit` call; an
    uncommitted one can join the replicas' stacked values there, as a TF tensor
    can be used anywhere. Other devices keep the committed result.
    """
    if not isinstance(x, jax.Array) or is_tracer(x) or not (replicas.on_cpu and x.committed):
        return x
    if x.devices() != {jax.local_devices()[0]}:
        return x
    return jax.device_put(np.asarray(x))


def _reduce_plain(replicas: Replicas, op: ReduceOp, value: Any, axis: int | None) -> Any:
    """A non-distributed value is the same on every replica (TF's semantics); a None as
    well: MEAN gives it back, SUM over several replicas is TF's error, an axis a
    `TypeError`."""
    n = replicas.num
    if value is None:
        if axis is not None:
            raise TypeError(
                f"strategy.reduce: a None in the value cannot be reduced along axis {axis}: "
                "expected a distributed value or an array there."
            )
        check_plain_sum(op, n, "None")
        return None
    x = as_array(value)
    if axis is None:
        if op is ReduceOp.SUM:
            check_plain_sum(op, n)
        return x
    ax = _axis(axis, x.ndim, "value")
    if op is ReduceOp.MEAN:
        return finish(op, jnp.sum(x, axis=ax), x.shape[ax], elements=True)
    return jnp.sum(x, axis=ax) * n if n > 1 else jnp.sum(x, axis=ax)


def gather_value(replicas: Replicas, value: Any, axis: int) -> Any:
    """`Strategy.gather` of one leaf: the replicas' values concatenated along ``axis``.

    A non-distributed value is returned unchanged, as in TF. The axis must be
    non-negative (TF's gather rejects negative axes too).
    """
    if not is_distributed(value):
        return value
    if axis < 0:
        raise ValueError(f"axis must be >= 0 for gather (as in TF); got {axis}.")
    x, pad = stack(value), padded(value)
    if pad is not None:
        full = all_rows(replicas, value)
        rows = [full[i, :n] for i, n in enumerate(pad[1])]
        return jnp.concatenate(
            rows, axis=_axis(axis, rows[0].ndim, "the per-replica values", GATHER)
        )
    if is_traced(value) and x is None:
        rows = [as_array(r) for r in value.values]
        return jnp.concatenate(
            rows, axis=_axis(axis, rows[0].ndim, "the per-replica values", GATHER)
        )
    if x is not None:
        ax = _axis(axis, x.ndim - 1, "the per-replica values", GATHER)
        shape = list(x.shape[1:])
        shape[ax] *= x.shape[0]
        if x.size == 0 and not is_traced(value):  # zero rows (a replica with no examples)
            return jax.device_put(np.zeros(shape, x.dtype), replicas.first_device)
        if replicas.multi_process and not is_traced(value):
            x = _global(replicas, value, "gather")
        elif not is_traced(value):
            x = jax.device_put(x, replicas.first_device)
        out = jnp.moveaxis(x, 0, ax).reshape(shape)
        if replicas.multi_process and is_traced(value):  # readable on every worker, as TF's
            out = jax.lax.with_sharding_constraint(out, replicas.replicated)
        return out
    rows = [as_array(p) for p in value.values]
    ax = _axis(axis, rows[0].ndim, "the per-replica values", GATHER)
    target = [replicas.first_device] * len(rows)
    return jnp.concatenate(jax.device_put(rows, target), axis=ax)


def local_results(value: Any, num_local: int) -> tuple:
    """`experimental_local_results`: one entry per local replica (TF's rules).

    A distributed value gives its components; a nested structure (list, tuple,
    dict) gives one structure per replica, its distributed leaves replaced by their
    components (a structure without any: ``num_local`` copies of it, as TF); any
    other plain value gives ``(value,)``.
    """
    if is_distributed(value):
        return value.values
    leaves = [x for x in jax.tree.leaves(value, is_leaf=is_distributed) if is_distributed(x)]
    if not leaves:
        return (value,) * num_local if isinstance(value, (list, tuple, dict)) else (value,)
    n = len(leaves[0].values)

    def pick(i: int) -> Any:
        return jax.tree.map(
            lambda x: x.values[i] if is_distributed(x) else x, value, is_leaf=is_distributed
        )

    return tuple(pick(i) for i in range(n))
