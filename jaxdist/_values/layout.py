"""The layout of a distributed value: its fields, made and read.

A `PerReplica` or `Mirrored` (`jaxdist._values.values`) is three fields: the layout's name
(``STACKED``, ``PADDED``, ``SHAPED`` or ``PARTS``), its data (the stacked array, or the
tuple of parts) and, when padded or shaped, each row's true length or shape. This module
makes a value from its fields (`make`) and holds the functions that read them (`stacked`,
`parts`, `padded`, `num_components`, `stack`, ...); the classes, their pytree registration
and their constructors are in `jaxdist._values.values`. The two are the only modules that read
the layout, so a new layout touches these two files and no other.

It does not import the classes (they import it): the functions take any value with the
fields (`HasLayout`), which is how `jaxdist._values.values` can use `make` and `padded_rows` in
the classes themselves.

>>> import jax.numpy as jnp, jaxdist as jd
>>> v = jd.PerReplica.from_stacked(jnp.zeros((2, 3)))
>>> stacked(v).shape, parts(v), num_components(v)
((2, 3), None, 2)
"""

from __future__ import annotations

from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from jaxdist._base.devices import Replicas
from jaxdist._base.layout import (
    check_stacked,
    is_array,
    is_tracer,
    shard_rows,
    sorted_shards,
    stack_on_devices,
    stacked_devices,
)

STACKED, PADDED, PARTS, SHAPED = "stacked", "padded", "parts", "shaped"


class HasLayout(Protocol):
    """The fields of a distributed value (see `jaxdist._values.values.DistributedValues`)."""

    @property
    def _layout(self) -> str: ...

    @property
    def _data(self) -> Any: ...

    @property
    def _lengths(self) -> tuple | None: ...

    @property
    def values(self) -> tuple: ...


def make(cls: type, layout: str, data: Any, lengths: tuple | None = None) -> Any:
    """A ``cls`` with these fields (no check, no copy)."""
    self: Any = object.__new__(cls)
    object.__setattr__(self, "_layout", layout)
    object.__setattr__(self, "_data", data)
    object.__setattr__(self, "_lengths", lengths)
    return self


def padded_rows(data: Any, lengths: tuple) -> tuple:
    """The true rows of a padded value: this process's rows, each cut to its length."""
    rows = shard_rows(data)
    if isinstance(data, jax.Array) and not is_tracer(data) and len(rows) != len(lengths):
        starts = [s.index[0].start or 0 for s in sorted_shards(data)]
        return tuple(_head(r, lengths[i]) for r, i in zip(rows, starts))
    return tuple(_head(r, n) for r, n in zip(rows, lengths))


def _head(row: Any, n: int | tuple) -> Any:
    """The first ``n`` rows of ``row``, or its corner of shape ``n`` (a tuple)."""
    shape = n if isinstance(n, tuple) else (n, *row.shape[1:])
    if isinstance(row, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(shape, row.dtype)
    return row[:n] if not isinstance(n, tuple) else row[tuple(slice(0, k) for k in n)]


def padded(v: HasLayout) -> tuple | None:
    """``(stacked array, lengths)`` of a padded value, else None."""
    return (v._data, v._lengths) if v._layout == PADDED else None


def stacked(v: HasLayout) -> Any:
    """The stacked array of ``v``, or None when it holds parts."""
    return v._data if v._layout == STACKED else None


def parts(v: HasLayout) -> tuple | None:
    """The per-replica parts of ``v``, or None when it is stacked."""
    return v._data if v._layout == PARTS else None


def num_components(v: HasLayout) -> int:
    if v._layout == PARTS:
        return len(v._data)
    check_stacked(v._data)
    shape = getattr(v._data, "shape", None)
    return int(shape[0]) if shape is not None else int(np.shape(v._data)[0])


def is_traced(v: HasLayout) -> bool:
    """Whether ``v`` holds tracers (inside `jax.jit`, a `lax` loop or `Strategy.run`)."""
    leaves = v._data if v._layout == PARTS else (v._data,)
    return any(is_tracer(x) for x in leaves)


def component_devices(v: HasLayout) -> tuple:
    """The devices of ``v``'s components in replica order (None for a non-array part)."""
    if v._layout != PARTS and isinstance(v._data, jax.Array) and not is_tracer(v._data):
        return stacked_devices(v._data)
    devices: list = []
    for part in v.values:
        concrete = isinstance(part, jax.Array) and not is_tracer(part)
        devices.extend(part.devices() if concrete else [None])
    return tuple(devices)


def stack(v: HasLayout, replicas: Replicas | None = None) -> Any:
    """``v``'s stacked layout (built from parts when their shapes agree), else None.

    Parts are stacked onto ``replicas`` (default: their own devices); traced
    parts are stacked with `jnp.stack`.
    """
    if v._layout != PARTS:
        return v._data if v._layout == STACKED else None
    data = v._data
    if len({np.shape(p) for p in data}) != 1:
        return None
    if not all(is_array(p) or np.isscalar(p) for p in data):
        return None
    if any(is_tracer(p) for p in data):
        return jnp.stack([jnp.asarray(p) for p in data])
    if replicas is None:
        devices = component_devices(v)
        if None in devices or len(set(devices)) != len(devices):
            return None
        replicas = Replicas(devices, tuple(range(len(devices))))
    cached = v.__dict__.get("_stack_cache")  # the value is immutable: stack it once
    if cached is None or cached[0] != replicas.devices:
        cached = (replicas.devices, stack_on_devices(data, replicas))
        object.__setattr__(v, "_stack_cache", cached)
    return cached[1]
