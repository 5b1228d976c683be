"""Distributed values: `PerReplica` and `Mirrored`, registered as pytrees.

A distributed value holds one value per replica in one of these layouts:

* stacked: one array of shape ``(num_replicas, *shape)`` whose leading axis is
  sharded over the replicas' devices (one row per device). This is what
  `Strategy.run` produces and consumes, so nothing is split or copied per step;
  inside `jax.jit` the stacked array is simply a tracer.
* padded: the same, for a partial batch (rows that differ in axis 0 only, a
  split ``[2, 2, 2, 0]``): each row padded to the longest, the lengths static;
* shaped: the same for rows of one rank and dtype whose shapes differ in other
  axes too (``(2, 2)`` and ``(2, 3)``): each row padded to the largest shape in
  every axis, the shapes static. Both are one `jax.jit` argument;
* parts: a tuple of per-replica values, used when nothing else fits (ranks or
  dtypes that differ, values that are not arrays, several processes).

The layout is pytree metadata, so every `jax.tree` idiom, `jax.eval_shape` and
checkpointing libraries see the stacked array (or the parts) as the leaves.
This module and `jaxdist._values.layout` are the only ones that read the layout:
others use the constructors below (`from_stacked`, `from_parts`, ...) and the
layout's functions there (`stacked`, `parts`, `stack`, ...). Structures of
distributed values (`regroup`, `select`, `check_components`, `combine_parts`) and
`ValueContext` are in `jaxdist._values.trees`: the three stay under the house's
length by concept (the classes; their fields; whole structures of them).

``AXIS`` names the replica axis inside compiled steps, for raw `jax.lax` collectives:

>>> import jax, jax.numpy as jnp, jaxdist as jd
>>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
>>> out = s.run(lambda: jax.lax.psum(jnp.float32(1.0), jd.AXIS))
>>> [float(x) for x in out.values]
[2.0, 2.0]
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdist._base import inflight as _inflight
from jaxdist._base.devices import AXIS, Replicas
from jaxdist._base.layout import (
    only_lengths_differ,
    shard_rows,
    stack_on_devices,
    stack_placed,
)
from jaxdist._values.layout import PADDED, PARTS, SHAPED, STACKED, make, padded_rows

__all__ = ["AXIS"]

# -- the classes --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False, repr=False, init=False)
class DistributedValues:
    """Base class of values that hold one component per replica.

    Construct with a tuple of per-replica values, as in TF; `Strategy.run`
    builds them without copies. ``values`` is TF's tuple view: one value per
    (local) replica, each committed to its replica's device.

    >>> import jax.numpy as jnp, jaxdist as jd
    >>> v = jd.PerReplica((jnp.asarray(1.0), jnp.asarray(2.0)))
    >>> [float(x) for x in v.values]
    [1.0, 2.0]
    """

    _layout: str  # "stacked", "padded" (a stacked array and each row's true length), "parts"
    # or "shaped" (a stacked array padded in every axis, and each row's true shape)
    _data: Any  # the stacked array, or the tuple of parts
    _lengths: tuple | None = None  # "padded": real leading rows per row; "shaped": row shapes

    def __init__(self, values: Sequence[Any]) -> None:
        if isinstance(values, DistributedValues):
            values = values.values
        if not isinstance(values, (tuple, list)):
            raise TypeError(
                f"{type(self).__name__}(values) takes a tuple with one value per replica; "
                f"got {type(values).__name__}."
            )
        if len(values) == 0:
            raise ValueError(f"{type(self).__name__}(values) needs at least one value; got ().")
        _check_components(type(self).__name__, values)
        stacked = stack_placed(values)
        object.__setattr__(self, "_layout", PARTS if stacked is None else STACKED)
        object.__setattr__(self, "_data", tuple(values) if stacked is None else stacked)
        object.__setattr__(self, "_lengths", None)

    @classmethod
    def from_stacked(cls, array: Any) -> Any:
        """(jaxdist) A value over an array whose leading axis is the replica axis.

        The layout `jax.pmap` produces: row ``i`` is replica ``i``'s value. No copy.

        >>> import jax.numpy as jnp, jaxdist as jd
        >>> [float(x) for x in jd.PerReplica.from_stacked(jnp.arange(2.0)).values]
        [0.0, 1.0]

        Raises:
            TypeError: ``array`` is not an array (a `jax.Array`, tracer or NumPy array).
            ValueError: ``array`` has no leading (replica) axis: it is a scalar.
        """
        if not isinstance(array, (jax.Array, np.ndarray)):
            raise TypeError(
                f"{cls.__name__}.from_stacked(array) takes an array whose leading axis is the "
                f"replica axis (row i is replica i's value); got {type(array).__name__}. "
                f"Convert it first (jnp.asarray), or build {cls.__name__}((v0, v1, ...)) from "
                "one value per replica."
            )
        if np.ndim(array) == 0:
            raise ValueError(
                f"{cls.__name__}.from_stacked(array) needs a leading replica axis (one row per "
                f"replica, as many rows as the strategy has replicas); got a scalar of shape ()."
            )
        return make(cls, STACKED, array)

    @property
    def values(self) -> tuple:
        """One value per (local) replica, in replica order."""
        if self._layout == PARTS:
            return self._data
        if self._layout in (PADDED, SHAPED):
            return padded_rows(self._data, self._lengths or ())
        return shard_rows(self._data)

    def __iter__(self) -> Iterator[Any]:
        """Not iterable, as TF's distributed values are not; the error names what a loop over
        one (or ``tf.nest`` over a structure of them) becomes."""
        name = type(self).__name__
        raise TypeError(
            f"'{name}' object is not iterable (nor is TF's). Each replica's value: "
            "strategy.experimental_local_results(v) (a tuple); all of them in one array: "
            "strategy.gather(v, axis=0). Mapping over a structure that holds distributed values "
            "(tf.nest.map_structure) treats them as leaves: jax.tree.map(f, tree, is_leaf="
            "lambda v: isinstance(v, jd.DistributedValues)); without is_leaf, jax.tree.map maps "
            f"inside each {name}."
        )

    def __repr__(self) -> str:
        try:
            values = self.values
        except TypeError:  # a leaf that is not an array (see `shard_rows`)
            return f"{type(self).__name__}({self._layout}={self._data!r})"
        body = ",\n".join(f"  {i}: {v!r}" for i, v in enumerate(values))
        return f"{type(self).__name__}:{{\n{body}\n}}"


def _check_components(cls: str, values: Sequence[Any]) -> None:
    """The components of a hand-built value: one array (or number) each, one dtype."""
    for i, v in enumerate(values):
        if isinstance(v, DistributedValues):
            raise TypeError(
                f"{cls}(values) takes one plain value per replica; component {i} is itself a "
                f"{type(v).__name__}. Pass its components (v.values) instead."
            )
        leaves = jax.tree.leaves(v)
        if v is None:
            raise TypeError(f"{cls}(values) takes one array per replica; component {i} is None.")
        if len(leaves) != 1 or leaves[0] is not v:
            raise TypeError(
                f"{cls}(values) takes one array per replica; component {i} is a "
                f"{type(v).__name__} (a nested structure). Build one {cls} per leaf, e.g. "
                f"jax.tree.map(lambda *xs: jaxdist.{cls}(xs), *values)."
            )
    kinds = [getattr(v, "dtype", type(v).__name__) for v in values]
    for i, k in enumerate(kinds):
        if k != kinds[0]:
            raise TypeError(
                f"{cls}(values) needs one dtype for every replica's value; component 0 is "
                f"{kinds[0]} and component {i} is {k}. Cast them to one dtype first."
            )


def _scalar_error(name: str) -> Callable:
    """``float(v)``, ``int(v)``, ``f"{v:.4f}"`` of a distributed value: TF's `TypeError` (a
    `Mirrored`'s too: tests/tf_oracle), naming the fix; ``f"{v}"`` is ``str(v)``, ``bool(v)``
    True (as in TF)."""

    def method(self: Any, *spec: str) -> Any:
        if spec == ("",):
            return str(self)
        pre, post = ("f'{", ":" + spec[0] + "}'") if spec else (f"{name}(", ")")
        head = f"format(value, {spec[0]!r})" if spec else f"{name}()"
        local = f"{pre}strategy.experimental_local_results(value)[0]{post}"
        if isinstance(self, Mirrored):
            raise TypeError(
                f"{head} of a Mirrored: a distributed value is not a Python number (as in TF), "
                "though every replica holds the same value. Read it as an array first: "
                f"{pre}jnp.asarray(value){post}, or {local}."
            )
        reduce = f'{pre}strategy.reduce("SUM", value, axis=None){post}'
        raise TypeError(
            f"{head} of a PerReplica: it holds one value per replica, not one number. Combine "
            f'the replicas first: {reduce} (or "MEAN"), or read one replica: {local}.'
        )

    return method


def _distributed_error(name: str) -> Callable:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"A PerReplica holds a different value on each replica, so it cannot be used as "
            f"one array ({name}). Combine it first with strategy.reduce(...) or "
            "strategy.gather(...), read one replica with experimental_local_results(v)[i], "
            "or pass it to strategy.run."
        )

    return method


@dataclasses.dataclass(frozen=True, eq=False, repr=False, init=False)
class PerReplica(DistributedValues):
    """A value that may differ from replica to replica (a `Strategy.run` output).

    It is not an array: arithmetic on it raises `TypeError` (combine it with
    `Strategy.reduce`, or pass it back to `Strategy.run`).

    >>> import jax.numpy as jnp, jaxdist as jd
    >>> jd.PerReplica((jnp.asarray(0), jnp.asarray(1)))
    PerReplica:{
      0: Array(0, dtype=int32, weak_type=True),
      1: Array(1, dtype=int32, weak_type=True)
    }
    """

    __array__ = _distributed_error("np.asarray")
    __jax_array__ = _distributed_error("jnp.asarray")
    __float__ = _scalar_error("float")
    __int__ = _scalar_error("int")
    __format__ = _scalar_error("format")


@dataclasses.dataclass(frozen=True, eq=False, repr=False, init=False)
class Mirrored(DistributedValues):
    """A value that is the same on every replica (the result of an all-reduce).

    Where an array is expected it stands for its local (first) replica's
    component, as TF's Mirrored values do: ``m + 1``, ``jnp.asarray(m)``,
    ``np.asarray(m)``, ``m.shape`` and `jax.numpy` functions read that component.
    As in TF, ``float(m)``, ``f"{m:.4f}"`` and ``len(m)`` are errors (``float(jnp.asarray(m))``).

    >>> import jax.numpy as jnp, jaxdist as jd
    >>> m = jd.Mirrored((jnp.asarray(2.0), jnp.asarray(2.0)))
    >>> isinstance(m, jd.DistributedValues), float(m + 1), float(jnp.sum(m)), m.shape
    (True, 3.0, 2.0, ())
    """

    def __jaxdist_local__(self) -> Any:
        """The local (first) replica's component, as one array (kept: it is read where
        the Mirrored is used as an array, and a step's captured state is found by it)."""
        try:
            return self.__dict__["local"]
        except KeyError:
            pass
        with jax.ensure_compile_time_eval():  # concrete components stay concrete in a trace
            local = jnp.asarray(self.values[0])
        if not isinstance(local, jax.core.Tracer):  # never keep a tracer
            self.__dict__["local"] = local
        return local

    __float__ = _scalar_error("float")
    __int__ = _scalar_error("int")
    __format__ = _scalar_error("format")

    def __jax_array__(self) -> Any:
        return self.__jaxdist_local__()

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """The local component as a NumPy array (numpy 2's ``dtype`` / ``copy`` protocol)."""
        local = self.__jaxdist_local__()
        if copy is None:
            return np.asarray(local, dtype=dtype)
        return np.array(local, dtype=dtype, copy=copy)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(np.shape(self.__jaxdist_local__()))

    @property
    def dtype(self) -> Any:
        return self.__jaxdist_local__().dtype

    def __neg__(self) -> Any:
        return -self.__jaxdist_local__()

    def __getitem__(self, index: Any) -> Any:
        return self.__jaxdist_local__()[index]


def _binary(op: Callable, reflected: bool) -> Callable:
    def method(self: Mirrored, other: Any) -> Any:
        a, b = self.__jaxdist_local__(), other
        if isinstance(b, Mirrored):
            b = b.__jaxdist_local__()
        return op(b, a) if reflected else op(a, b)

    return method


_OPS = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul,
    "truediv": operator.truediv, "floordiv": operator.floordiv, "mod": operator.mod,
    "pow": operator.pow, "matmul": operator.matmul,
}  # fmt: skip
for _name, _op in _OPS.items():
    setattr(Mirrored, f"__{_name}__", _binary(_op, False))
    setattr(Mirrored, f"__r{_name}__", _binary(_op, True))
    setattr(PerReplica, f"__{_name}__", _distributed_error(_name))
    setattr(PerReplica, f"__r{_name}__", _distributed_error(_name))
_COMPARE = {"lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge}
for _name, _op in _COMPARE.items():
    setattr(Mirrored, f"__{_name}__", _binary(_op, False))


# -- pytree registration --------------------------------------------------------------


def _flatten_with_keys(v: DistributedValues) -> tuple:
    if v._layout != PARTS:
        return ((jax.tree_util.GetAttrKey("stacked"), v._data),), (v._layout, v._lengths)
    keys = [jax.tree_util.SequenceKey(i) for i in range(len(v._data))]
    return tuple(zip(keys, v._data)), (PARTS, len(v._data))


def _flatten(v: DistributedValues) -> tuple:
    if v._layout != PARTS:
        return (v._data,), (v._layout, v._lengths)
    return v._data, (PARTS, len(v._data))


def _unflatten_for(cls: type) -> Callable:
    def unflatten(aux: tuple, children: Any) -> DistributedValues:
        layout, extra = aux
        if layout == PARTS:
            return make(cls, layout, tuple(children))
        _inflight.note_output(children[0])  # bounds jitted functions that return us
        return make(cls, layout, children[0], extra)

    return unflatten


def register(cls: type) -> type:
    """Registers a subclass of `DistributedValues` as a pytree, as its base classes are."""
    jax.tree_util.register_pytree_with_keys(
        cls, _flatten_with_keys, _unflatten_for(cls), flatten_func=_flatten
    )
    return cls


for _cls in (DistributedValues, PerReplica, Mirrored):
    register(_cls)


# -- the functions other modules use ---------------------------------------------------


def from_stacked(x: Any, cls: type | None = None) -> Any:
    """A `PerReplica` (or ``cls``) over the stacked array ``x``."""
    return make(cls or PerReplica, STACKED, x)


def from_parts(parts: Sequence[Any], cls: type | None = None) -> Any:
    """A `PerReplica` (or ``cls``) over per-replica ``parts``."""
    return make(cls or PerReplica, PARTS, tuple(parts))


def from_padded(x: Any, lengths: Sequence[int], cls: type | None = None) -> Any:
    """A `PerReplica` over a stacked array whose row ``i`` holds ``lengths[i]`` real rows.

    This is how a partial batch travels: one sharded array (a single transfer, and a
    leaf `jax.jit` accepts), with the split as static pytree metadata.
    """
    lengths = tuple(int(n) for n in lengths)
    if all(n == np.shape(x)[1] for n in lengths):
        return from_stacked(x, cls)
    return make(cls or PerReplica, PADDED, x, lengths)


def from_shaped(rows: Sequence[Any], replicas: Replicas) -> Any:
    """A `PerReplica` of arrays of one rank and dtype whose shapes differ (not only in
    axis 0): one array sharded over the replicas, each row padded to the largest shape
    in every axis, with each row's shape as static metadata, so that it is one
    `jax.jit` argument (parts on several devices are not). Parts where that cannot be
    (several processes, ranks or dtypes that differ)."""
    if (
        replicas.multi_process
        or len(
            {
                (np.ndim(r), np.asarray(r).dtype if isinstance(r, np.ndarray) else r.dtype)
                for r in rows
            }
        )
        != 1
    ):
        return from_parts(jax.device_put(list(rows), list(replicas.local_devices)))
    shapes = tuple(tuple(int(k) for k in np.shape(r)) for r in rows)
    big = tuple(max(column) for column in zip(*shapes))
    pads = [[(0, b - k) for b, k in zip(big, shape)] for shape in shapes]
    with_pads = [
        np.pad(r, p) if isinstance(r, np.ndarray) else jnp.pad(r, p) for r, p in zip(rows, pads)
    ]
    data = stack_on_devices(with_pads, replicas)
    if len(set(shapes)) == 1:
        return from_stacked(data)
    if only_lengths_differ(rows):
        return from_padded(data, [s[0] for s in shapes])
    return make(PerReplica, SHAPED, data, shapes)


def is_distributed(x: Any) -> bool:
    return isinstance(x, DistributedValues)
