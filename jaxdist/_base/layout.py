"""Stacked arrays: the layout under every distributed value, and the functions on it.

A stacked array has shape ``(num_replicas, *shape)`` with its leading axis sharded one
row per replica device (`jaxdist._base.devices.Replicas.sharding`). These functions build
such arrays from per-replica values (zero-copy between CPU devices), read their rows
back, pad rows of different lengths (a partial batch), and inside a trace keep rows that
agree as replicated arrays (`rows_as_replicated`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, SingleDeviceSharding

from jaxdist._base.devices import AXIS, Replicas


def is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic))


def is_tracer(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def all_on_cpu(x: jax.Array, devices: Sequence[jax.Device]) -> bool:
    return all(d.platform == "cpu" for d in (*x.devices(), *devices))


def _row_on(part: Any, device: jax.Device) -> jax.Array:
    """``part`` as a ``(1, *shape)`` array on ``device`` (a zero-copy view between CPUs).

    ``np.asarray`` of a CPU array is a read-only view of its buffer, and
    `jax.device_put` of a read-only array aliases it (jax arrays are immutable).
    """
    if isinstance(part, jax.Array):
        viewable = not jax.dtypes.issubdtype(part.dtype, jax.dtypes.prng_key)  # typed keys
        if (
            viewable
            and device.platform == "cpu"
            and all(d.platform == "cpu" for d in part.devices())
        ):
            return jax.device_put(np.asarray(part)[None], device)
        return jax.device_put(part, device)[None]
    return jax.device_put(np.asarray(part)[None], device)


def stack_on_devices(parts: Sequence[Any], replicas: Replicas) -> jax.Array:
    """Stacks same-shaped per-replica values into one array sharded over the replicas.

    Each part moves to its own device only. With replicas in several processes,
    ``parts`` holds one value per replica or per local replica, and the result is
    the global array (this process gives its own rows).
    """
    local = replicas.local
    if len(parts) == replicas.num and replicas.multi_process:
        parts = [parts[i] for i in local]
    elif len(parts) != len(local):
        raise ValueError(
            f"Got {len(parts)} per-replica values for {replicas.num} replicas, "
            f"{len(local)} of them in this process; give one value per replica."
        )
    shards = [_row_on(p, d) for p, d in zip(parts, replicas.local_devices)]
    shape = (replicas.num, *shards[0].shape[1:])
    return jax.make_array_from_single_device_arrays(shape, replicas.sharding, shards)


def stack_placed(values: Sequence[Any]) -> jax.Array | None:
    """Same-shaped arrays committed each to its own device: one array sharded over those
    devices (each row stays where it is), so the value can enter `jax.jit` (one device
    set per argument). None for anything else, which keeps its parts."""
    if len(values) < 2 or jax.process_count() > 1:
        return None
    if not all(isinstance(v, jax.Array) and not is_tracer(v) for v in values):
        return None
    if len({(v.shape, v.dtype) for v in values}) != 1 or not all(v.committed for v in values):
        return None
    devices = [v.sharding.device_set for v in values]
    if any(len(d) != 1 for d in devices) or len(set().union(*devices)) != len(values):
        return None
    return stack_on_devices(list(values), Replicas.of([next(iter(d)) for d in devices]))


def broadcast_rows(value: jax.Array, replicas: Replicas) -> jax.Array:
    """``value`` stacked once per replica (a Mirrored layout); zero-copy between CPUs."""
    if not replicas.multi_process and all_on_cpu(value, replicas.devices):
        view = np.broadcast_to(host_view(value)[None], (replicas.num, *value.shape))
        return jax.device_put(view, replicas.sharding)
    return stack_on_devices([value] * replicas.num, replicas)


def globalize(local: jax.Array, sharding: NamedSharding) -> jax.Array:
    """A multi-process `jax.pmap` output (this process's rows) as the global stacked array."""
    rows = [s.data for s in local.addressable_shards]
    shape = (sharding.mesh.devices.size, *local.shape[1:])
    return jax.make_array_from_single_device_arrays(shape, sharding, rows)


def sorted_shards(stacked: jax.Array) -> list:
    return sorted(stacked.addressable_shards, key=lambda s: s.index[0].start or 0)


def host_view(x: Any) -> np.ndarray:
    """``np.asarray(x)``, also for a zero-size array sharded over several devices (which
    jax 0.10 cannot read that way: "could not broadcast (8,0,4) into (1,0,4)")."""
    if isinstance(x, jax.Array) and x.size == 0:
        return np.zeros(x.shape, x.dtype)
    return np.asarray(x)


def check_stacked(stacked: Any) -> None:
    """Raises `NotAnArrayError` unless ``stacked`` can be a stacked value (an array with
    a leading replica axis, or its shape description)."""
    if isinstance(stacked, jax.ShapeDtypeStruct) and stacked.ndim:
        return
    if not isinstance(stacked, (jax.Array, np.ndarray)) or not np.ndim(stacked):
        raise NotAnArrayError(
            f"This distributed value holds a {type(stacked).__name__} where its stacked array "
            "was (as jax.tree.map(f, value) gives when f returns something that is not an "
            "array), so it has no per-replica values. Map over "
            "strategy.experimental_local_results(value) instead to get one result per replica."
        )


class NotAnArrayError(AttributeError, TypeError):
    """A distributed value whose stacked leaf is not an array has no per-replica values.

    An `AttributeError` (so ``hasattr(value, "values")`` and other attribute probes
    answer False instead of raising) and a `TypeError` (what it is).
    """


def shard_rows(stacked: Any) -> tuple:
    """The local rows of a stacked value, each a committed array on its device.

    Tracers and arrays not split one row per device are sliced instead; shape
    descriptions (`jax.ShapeDtypeStruct`) give one description per row.
    """
    if isinstance(stacked, jax.ShapeDtypeStruct):
        row = jax.ShapeDtypeStruct(stacked.shape[1:], stacked.dtype)
        return (row,) * stacked.shape[0]
    check_stacked(stacked)
    if not isinstance(stacked, jax.Array) or is_tracer(stacked):
        return tuple(stacked[i] for i in range(np.shape(stacked)[0]))
    shards = sorted_shards(stacked)
    if any(s.data.shape[:1] != (1,) for s in shards):
        return tuple(stacked[i] for i in range(stacked.shape[0]))
    rows = tuple(s.data.reshape(s.data.shape[1:]) for s in shards)
    return (_single(rows[0]),) if len(rows) == 1 else rows


def _single(x: jax.Array) -> jax.Array:
    """``x`` (the one row of a one-device stacked array) on its device alone, no copy.

    The row of a one-device mesh keeps that mesh in its type; a step that captures it
    and differentiates with it bakes the mesh into its program, which JAX then rejects
    inside the replica map ("Mesh for all inputs should be equal").
    """
    if not isinstance(x.sharding, NamedSharding):
        return x
    device = next(iter(x.devices()))
    return jax.make_array_from_single_device_arrays(x.shape, SingleDeviceSharding(device), [x])


def stacked_devices(stacked: jax.Array) -> tuple[jax.Device, ...]:
    sharding = stacked.sharding
    if isinstance(sharding, NamedSharding) and sharding.mesh.axis_names == (AXIS,):
        return tuple(sharding.mesh.devices.flat)
    return tuple(s.device for s in sorted_shards(stacked))


def pad_rows(rows: Sequence[Any]) -> Any:
    """Same-trailing-shape arrays, zero-padded along axis 0 and stacked (jax.numpy)."""
    size = max(np.shape(r)[0] for r in rows)
    return jnp.stack(
        [jnp.pad(r, [(0, size - np.shape(r)[0])] + [(0, 0)] * (np.ndim(r) - 1)) for r in rows]
    )


def only_lengths_differ(rows: Sequence[Any]) -> bool:
    """Whether ``rows`` are arrays of one dtype whose shapes differ only in axis 0."""
    if not all(is_array(r) for r in rows) or any(np.ndim(r) == 0 for r in rows):
        return False
    return (
        len(
            {
                (np.shape(r)[1:], np.asarray(r).dtype if isinstance(r, np.ndarray) else r.dtype)
                for r in rows
            }
        )
        == 1
    )


def as_array(x: Any) -> Any:
    return x if isinstance(x, jax.Array) else jnp.asarray(x)


def rows_as_replicated(arrays: list, replicas: Replicas) -> list:
    """Inside a trace: stacked ``arrays`` whose rows are one value on every replica (a
    variable updated with all-reduced gradients) as replicated arrays, each replica
    device keeping its own row. Nothing moves between devices; replica 0's row made
    replicated would be copied to every device (a broadcast of the whole state on
    every step). TF's mirrored variables are kept the same way: each replica applies
    the same update to its own copy."""
    if not arrays:
        return []
    split, whole = replicas.sharding.spec, replicas.replicated.spec

    def rows(*xs: Any) -> list:
        return [x[0] for x in xs]

    local = jax.shard_map(
        rows,
        mesh=replicas.sharding.mesh,
        in_specs=tuple(split for _ in arrays),
        out_specs=whole,
        check_vma=False,
    )
    return local(*arrays)
