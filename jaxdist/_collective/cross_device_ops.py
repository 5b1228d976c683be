"""Cross-device ops, and the one home of TF's rules on which reduction really runs.

* `ReductionToOneDevice`: `jax.device_put` gathers onto one device, accumulation
  there (``accumulation_fn``, default a jitted add_n), then an explicit
  `jax.device_put` broadcast to the destinations.
* `NcclAllReduce` / `HierarchicalCopyAllReduce`: an all-reduce through XLA
  collectives (one `lax.psum` per pack over the replica axis; NCCL on GPU) on the
  sharded value, which never leaves its devices; `batch_reduce` packs small
  tensors. Unlike TF's, they also run on CPU devices.

Every method also works on traced values (inside `jax.jit`, `lax` loops and
``merge_fn``): the same rules, computed with `jax.numpy` on the stacked tracer.

TF's rules, used by every execution path (`effective_ops`, `accumulation_for`):
int32 values are always reduced by a plain `ReductionToOneDevice`; an
``accumulation_fn`` is not used towards CPU destinations by ``reduce_to``; the
all-reduce ops reduce to other devices than the value's with a plain
`ReductionToOneDevice`; MEAN is `jaxdist._base.reduce_op.finish`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdist._base import context as _context
from jaxdist._base.devices import Replicas, resolve_device
from jaxdist._base.layout import all_on_cpu, as_array, broadcast_rows, is_tracer, stacked_devices
from jaxdist._base.options import CommunicationOptions, check_communication_options
from jaxdist._base.reduce_op import ReduceOp, finish, parse_reduce_op
from jaxdist._base.validate import check_callable, describe
from jaxdist._values.layout import component_devices, num_components, stack, stacked
from jaxdist._values.values import (
    DistributedValues,
    Mirrored,
    from_parts,
    from_stacked,
    is_distributed,
)

# -- TF's rules --------------------------------------------------------------------------


def is_int32(value: Any) -> bool:
    leaves = value.values if is_distributed(value) else [value]
    return any(getattr(x, "dtype", None) == jnp.int32 for x in leaves)


def accumulation_for(cdo: Any, value: Any) -> Callable | None:
    """The ``accumulation_fn`` TF really uses for ``value`` inside a step, or None (a sum).

    A `ReductionToOneDevice` ``accumulation_fn`` combines the replicas' values,
    except for int32 values, which TF reduces with a plain `ReductionToOneDevice`.
    """
    fn = getattr(cdo, "accumulation_fn", None)
    return None if fn is None or is_int32(value) else checked_accumulation(fn)


def checked_accumulation(fn: Callable[[list], Any]) -> Callable[[list], Any]:
    """``fn`` (an ``accumulation_fn``) with its result checked: one array of the rows' shape."""

    def accumulate(rows: list) -> Any:
        out = fn(rows)
        ok = isinstance(out, (jax.Array, np.ndarray, np.generic, int, float, complex))
        if not ok or np.shape(out) != np.shape(rows[0]):
            got = f"{type(out).__name__} {out!r}" if not ok else f"shape {np.shape(out)}"
            raise TypeError(
                f"accumulation_fn must return one array combining the {len(rows)} values it is "
                f"given (shape {np.shape(rows[0])}, as tf.math.add_n does); {describe(fn)} "
                f"returned {got}."
            )
        return out

    return accumulate


def effective_ops(cdo: CrossDeviceOps, value: Any, devices: tuple | int) -> CrossDeviceOps:
    """The cross-device ops that TF's ``reduce_to`` really uses for ``value``.

    A `ReductionToOneDevice` ``accumulation_fn`` is not used for int32 values, nor
    towards CPU destinations: TF's mirrored strategy substitutes a plain
    `ReductionToOneDevice` there (keeping ``reduce_to_device``).
    """
    if not isinstance(cdo, ReductionToOneDevice) or cdo.accumulation_fn is None:
        return cdo
    on_cpu = isinstance(devices, int) or any(d.platform == "cpu" for d in devices)
    if on_cpu or is_int32(value):
        return ReductionToOneDevice(reduce_to_device=cdo.reduce_to_device)
    return cdo


def check_mirrored_sum(op: ReduceOp, value: Any) -> bool:
    """TF's rule for a `Mirrored` value: MEAN is the value itself (True), SUM raises."""
    if not isinstance(value, Mirrored) or num_components(value) == 1:
        return False
    if op is ReduceOp.MEAN:
        return True
    raise ValueError(
        "Cannot SUM a Mirrored value across replicas: it is already the same on every "
        "replica (the result of an all-reduce). Use MEAN to read it, or reduce the "
        "PerReplica value it was made from."
    )


def check_plain_sum(op: ReduceOp, num_replicas: int, shown: str = "") -> None:
    """TF's rule for a non-distributed value (``shown``: it, in words, for the message):
    SUM over several replicas is ambiguous."""
    if op is ReduceOp.SUM and num_replicas > 1:
        what = f" ({shown})" if shown else ""
        raise ValueError(
            f"A non-distributed value{what} cannot be reduced with SUM over {num_replicas} "
            "replicas (it is the same on every replica). Pass a PerReplica value, or MEAN."
        )


# -- destinations and placement ---------------------------------------------------------


def destination_devices(destinations: Any) -> tuple[jax.Device, ...] | int:
    """The devices named by ``destinations``; for a traced value, its number of components."""
    if isinstance(destinations, (str, jax.Device)) and destinations != "":
        return (resolve_device(destinations, "destinations"),)
    if is_distributed(destinations):
        devices = component_devices(destinations)
        return num_components(destinations) if None in devices else devices
    if is_tracer(destinations):
        return 1
    if isinstance(destinations, jax.Array):
        return stacked_devices(destinations) if destinations.ndim else tuple(destinations.devices())
    raise ValueError(
        "destinations must be a device string, a jax.Device, a DistributedValues or a "
        f"jax.Array; got {type(destinations).__name__} {destinations!r}."
    )


def place(value: Any, devices: tuple | int) -> Any:
    """``value`` on ``devices``: a plain array for one device, else a `Mirrored`.

    Traced values (or an int count of destinations) are broadcast with jax.numpy.
    """
    count = devices if isinstance(devices, int) else len(devices)
    if is_tracer(value) or isinstance(devices, int):
        value = as_array(value)
        if count == 1:
            return value
        return from_stacked(jnp.broadcast_to(value[None], (count, *value.shape)), Mirrored)
    if count == 1:
        return jax.device_put(value, devices[0])
    if len(set(devices)) < count:  # a destination whose components share a device
        return from_parts(jax.device_put([value] * count, list(devices)), Mirrored)
    return from_stacked(broadcast_rows(value, Replicas.of(devices)), Mirrored)


def as_distributed(value: Any) -> DistributedValues:
    """``value`` itself if distributed, else a one-component `PerReplica` (as TF)."""
    if is_distributed(value):
        return value
    if isinstance(value, (list, tuple, dict)) or value is None:
        raise ValueError(
            "per_replica_value must be a DistributedValues or an array; got "
            f"{type(value).__name__}. Reduce nested structures leaf by leaf."
        )
    return from_parts((as_array(value),))


def _gather_to(value: DistributedValues, target: jax.Device) -> list:
    """Every component of ``value`` on ``target``, with one batched `jax.device_put`.

    Rows are read straight from the shard buffers; between CPU devices the views
    are zero-copy (a read-only NumPy view of a CPU buffer is aliased by device_put).
    """
    x = stacked(value)
    if x is not None:
        if not x.is_fully_addressable:
            raise NotImplementedError(
                "ReductionToOneDevice cannot reduce a value whose replicas span several "
                "workers (it would see only this worker's replicas); use NcclAllReduce() "
                "or the default cross-device ops of MultiWorkerMirroredStrategy."
            )
        shards = sorted(x.addressable_shards, key=lambda s: s.index[0].start or 0)
        rows, shape = [s.data for s in shards], x.shape[1:]
    else:
        rows, shape = [as_array(p) for p in value.values], None
    if all(all_on_cpu(r, (target,)) for r in rows):
        views = [np.asarray(r) if shape is None else np.asarray(r).reshape(shape) for r in rows]
        return jax.device_put(views, [target] * len(views))
    moved = jax.device_put(rows, [target] * len(rows))
    return moved if shape is None else [m.reshape(shape) for m in moved]


@jax.jit
def _add_n(xs: Sequence[jax.Array]) -> jax.Array:
    total = xs[0]
    for x in xs[1:]:
        total = total + x
    return total


def _single_in_place(value: DistributedValues, devices: tuple | int) -> bool:
    """TF's shortcut: one component, already on the one destination, is its own reduction."""
    return num_components(value) == 1 and component_devices(value) == devices


def _same_shapes(rows: list) -> None:
    if len({tuple(np.shape(r)) for r in rows}) > 1:
        raise ValueError(
            "Cannot reduce values whose shapes differ across replicas "
            f"({[tuple(np.shape(r)) for r in rows]}) with axis=None; for a partial batch, "
            "reduce along the batch axis with axis=0."
        )


# -- the ops ---------------------------------------------------------------------------


class CrossDeviceOps:
    """Base class of the algorithms that reduce and broadcast across devices.

    Methods may only be called in cross-replica context (outside `Strategy.run`,
    or in a ``merge_fn``). ``reduce_op`` must be a `ReduceOp` here, as in TF.
    Subclasses implement ``_reduce`` (and may override ``_batch_reduce``).

    >>> import jax.numpy as jnp, jaxdist as jd
    >>> isinstance(jd.NcclAllReduce(), jd.CrossDeviceOps)
    True
    >>> jd.ReductionToOneDevice().reduce(jd.ReduceOp.SUM, jnp.float32(3.0), "/cpu:1").tolist()
    3.0
    """

    def reduce(
        self,
        reduce_op: ReduceOp,
        per_replica_value: Any,
        destinations: Any,
        options: CommunicationOptions | None = None,
    ) -> Any:
        """Reduces ``per_replica_value`` to ``destinations``.

        Args:
            reduce_op: `ReduceOp.SUM` or `ReduceOp.MEAN`.
            per_replica_value: a `DistributedValues`, or an array (one component).
            destinations: a device string, `jax.Device`, `DistributedValues` or array.
            options: an optional `experimental.CommunicationOptions`.

        Returns:
            A plain array on the one destination device, or a `Mirrored` over several.
        """
        _context.require_cross_replica(None, f"{type(self).__name__}.reduce")
        op = parse_reduce_op(reduce_op, allow_strings=False)
        devices = destination_devices(destinations)
        check_communication_options(options)
        value = as_distributed(per_replica_value)
        if _single_in_place(value, devices):  # TF: nothing to combine (no accumulation_fn)
            return finish(op, value.values[0], 1)
        return self._reduce(op, value, devices, options)

    def batch_reduce(
        self,
        reduce_op: ReduceOp,
        value_destination_pairs: Sequence[tuple[Any, Any]],
        options: CommunicationOptions | None = None,
    ) -> list:
        """Reduces each ``(value, destinations)`` pair; returns a list, one per pair."""
        _context.require_cross_replica(None, f"{type(self).__name__}.batch_reduce")
        op = parse_reduce_op(reduce_op, allow_strings=False)
        pairs = check_pairs(value_destination_pairs)
        check_communication_options(options)
        resolved = [(as_distributed(v), destination_devices(d)) for v, d in pairs]
        if all(_single_in_place(v, d) for v, d in resolved):  # TF: nothing to combine
            return [finish(op, v.values[0], 1) for v, _ in resolved]
        return self._batch_reduce(op, resolved, options)

    def broadcast(self, tensor: Any, destinations: Any) -> Any:
        """Copies ``tensor`` to ``destinations`` (a `Mirrored` for several devices)."""
        _context.require_cross_replica(None, f"{type(self).__name__}.broadcast")
        return jax.tree.map(lambda t: place(as_array(t), destination_devices(destinations)), tensor)

    def _reduce(self, op: ReduceOp, value: DistributedValues, devices: Any, options: Any) -> Any:
        return ReductionToOneDevice._reduce(ReductionToOneDevice(), op, value, devices, options)

    def _batch_reduce(self, op: ReduceOp, pairs: list, options: Any) -> list:
        return [self._reduce(op, v, d, options) for v, d in pairs]

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class ReductionToOneDevice(CrossDeviceOps):
    """Copies values to one device, reduces them there, then broadcasts.

    >>> import jaxdist as jd
    >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    >>> v = s.experimental_distribute_values_from_function(
    ...     lambda ctx: float(ctx.replica_id_in_sync_group + 1))
    >>> float(jd.ReductionToOneDevice().reduce(jd.ReduceOp.SUM, v, "/cpu:0"))
    3.0

    Args:
        reduce_to_device: the device to reduce on (a string or `jax.Device`);
            None: the first destination device.
        accumulation_fn: a function of a list of arrays (all on the reduce
            device) returning their combination; None: a sum, like `tf.math.add_n`.
            Inside `Strategy.run`, `ReplicaContext.all_reduce` honours it too: the
            values are all-gathered and combined by it on every replica.
    """

    def __init__(
        self,
        reduce_to_device: str | jax.Device | None = None,
        accumulation_fn: Callable[[list], Any] | None = None,
    ) -> None:
        if accumulation_fn is not None:
            check_callable(accumulation_fn, "accumulation_fn", "callable or None")
        if reduce_to_device is not None:
            resolve_device(reduce_to_device, "reduce_to_device")  # validate early
        self.reduce_to_device = reduce_to_device
        self.accumulation_fn = accumulation_fn

    def _accumulate(self, rows: list) -> Any:
        if self.accumulation_fn is not None:
            return checked_accumulation(self.accumulation_fn)(rows)
        if len(rows) == 1:
            return rows[0]
        return _add_n(rows) if not any(is_tracer(r) for r in rows) else sum(rows[1:], rows[0])

    def _reduce(self, op: ReduceOp, value: DistributedValues, devices: Any, options: Any) -> Any:
        if isinstance(devices, int) or any(is_tracer(p) for p in jax.tree.leaves(value)):
            x = stack(value)
            if x is not None and self.accumulation_fn is None:  # one reduction, not R slices
                return place(finish(op, jnp.sum(x, axis=0), x.shape[0]), devices)
            rows = [as_array(r) for r in value.values]
            _same_shapes(rows)
            return place(finish(op, self._accumulate(rows), len(rows)), devices)
        target = self.reduce_to_device
        target = resolve_device(target) if target is not None else devices[0]
        rows = _gather_to(value, target)
        _same_shapes(rows)
        return place(finish(op, self._accumulate(rows), len(rows)), devices)

    def __repr__(self) -> str:
        return (
            f"ReductionToOneDevice(reduce_to_device={self.reduce_to_device!r}, "
            f"accumulation_fn={self.accumulation_fn!r})"
        )


def check_pairs(pairs: Any) -> list:
    if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Sequence):
        raise ValueError(
            "value_destination_pairs must be a list of (value, destinations) tuples; "
            f"got {type(pairs).__name__}."
        )
    for i, pair in enumerate(pairs):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(
                f"value_destination_pairs[{i}] must be a (value, destinations) pair; got {pair!r}."
            )
    return list(pairs)
