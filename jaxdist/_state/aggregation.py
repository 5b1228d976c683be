"""TF's variable settings at a place of a replica step's state: sync-on-read values, aggregation.

A TF variable says how replicas share it: ``synchronization`` (on write: one value every
replica reads; on read: each replica its own, aggregated when the host reads it) and
``aggregation`` (how replicas' values combine: ``SUM``, ``MEAN``, ``ONLY_FIRST_REPLICA``,
``NONE``). Keras variables carry both. `rule` reads them off the variable a place belongs
to; `kept` gives what the place keeps of a replica step's stacked output by that rule (a
`SyncOnRead` value for an on-read variable, a `MirroredPerReplica` for a mirrored one of
aggregation ``NONE`` whose replicas assigned different values); `host_read` is TF's read of
such a value outside the replicas (the one home of that rule: ``fit``'s per-replica copies
are read through it too); `on_read_rows` spreads a value the host assigned to an on-read
variable over the replicas as TF does.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdist._state import assign as _assign
from jaxdist._state import capture as _capture
from jaxdist._state import chains as _chains
from jaxdist._state import peek as _peek
from jaxdist._state.chains import Chain
from jaxdist._values.layout import stacked
from jaxdist._values.values import DistributedValues, PerReplica, register


def host_read(data: Any, aggregation: str) -> Any:
    """TF's read outside the replicas of a variable's values per replica (``data``: stacked,
    row ``i`` replica ``i``'s), by its ``aggregation``: the sum for ``"sum"``, the mean for
    ``"mean"`` (in the variable's dtype: a variable's value keeps its dtype), else replica
    0's: ``ONLY_FIRST_REPLICA``, and ``NONE``, TF's primary component of a mirrored
    variable whose replicas assigned their own values (a ``BatchNormalization``'s moving
    statistics).

    >>> import jax.numpy as jnp
    >>> [float(host_read(jnp.asarray([1.0, 2.0, 6.0]), a)) for a in ("sum", "mean", "none")]
    [9.0, 3.0, 1.0]
    """
    if aggregation == "sum":
        return jnp.sum(data, axis=0, dtype=data.dtype)
    if aggregation == "mean":
        return jnp.mean(data, axis=0, dtype=data.dtype)
    return data[0]


@register
@dataclasses.dataclass(frozen=True, eq=False, repr=False, init=False)
class HostReadable(PerReplica):
    """A variable's values per replica, read as one array on the host (``jnp.asarray``,
    ``np.asarray``, ``float``, a Keras variable's ``numpy()``, ``model.get_weights()``) by
    its ``aggregation`` (`host_read`); each replica reads its own in its step, and
    ``strategy.reduce`` and ``experimental_local_results`` see its components."""

    aggregation = "none"

    def _read(self) -> Any:
        data = stacked(self)
        if data is None:  # components of several shapes: not one value
            raise TypeError(f"A {type(self).__name__} of parts cannot be read as one array.")
        value = host_read(data, self.aggregation)
        if isinstance(value, jax.core.Tracer) or not isinstance(data, jax.Array):
            return value
        return jnp.asarray(np.asarray(value))  # one host value, on the default device

    def __jax_array__(self) -> Any:
        return self._read()

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        return np.asarray(self._read(), dtype=dtype)

    def __float__(self) -> float:
        return float(self._read())

    def __int__(self) -> int:
        return int(self._read())

    def __format__(self, spec: str) -> str:
        return format(float(self._read()), spec) if spec else repr(self)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(stacked(self).shape[1:])

    @property
    def dtype(self) -> Any:
        return stacked(self).dtype


@register
@dataclasses.dataclass(frozen=True, eq=False, repr=False, init=False)
class MirroredPerReplica(HostReadable):
    """A mirrored variable of aggregation ``NONE`` whose replicas assigned it different
    values (a Keras ``BatchNormalization``'s moving statistics in a custom loop): each
    replica keeps and reads its own, as TF's ``MirroredVariable`` updates each component on
    its own device; read on the host, it is replica 0's (TF's primary component).

    >>> import jax.numpy as jnp, numpy as np
    >>> v = MirroredPerReplica.from_stacked(jnp.asarray([[1.0, 2.0], [3.0, 4.0]]))
    >>> np.asarray(v).tolist(), [x.tolist() for x in v.values]
    ([1.0, 2.0], [[1.0, 2.0], [3.0, 4.0]])
    """

    aggregation = "none"


@register
@dataclasses.dataclass(frozen=True, eq=False, repr=False, init=False)
class SyncOnRead(HostReadable):
    """TF's sync-on-read variable's value (a Keras metric's total): each replica holds its
    own and reads it in its step; read as one array (``jnp.asarray``, ``np.asarray``,
    ``float``, Keras' ``metric.result()``), it is the replicas' aggregate: their sum.
    ``strategy.reduce`` and ``experimental_local_results`` see its components.

    >>> import jax.numpy as jnp
    >>> v = SyncOnRead.from_stacked(jnp.asarray([1.0, 2.0, 4.0]))
    >>> float(v), [float(x) for x in v.values], SyncOnReadMean.from_stacked(v.values[0][None]).shape
    (7.0, [1.0, 2.0, 4.0], ())
    """

    aggregation = "sum"


@register
@dataclasses.dataclass(frozen=True, eq=False, repr=False, init=False)
class SyncOnReadMean(SyncOnRead):
    """A `SyncOnRead` read as the replicas' mean (TF's ``aggregation=MEAN``)."""

    aggregation = "mean"


@register
@dataclasses.dataclass(frozen=True, eq=False, repr=False, init=False)
class SyncOnReadFirst(SyncOnRead):
    """A `SyncOnRead` read as the first replica's (TF's ``ONLY_FIRST_REPLICA``)."""

    aggregation = "only_first_replica"


_ON_READ = {"sum": SyncOnRead, "mean": SyncOnReadMean, "only_first_replica": SyncOnReadFirst}


def rule(fn: Callable, chain: Chain) -> str | None:
    """How a value assigned at ``chain`` is kept, by the variable that holds it (TF's and
    Keras' ``synchronization`` and ``aggregation``, read off the object the place belongs
    to: a Keras variable's ``_value``): ``"on_read:<aggregation>"``, an on-write
    aggregation (``"mean"``, ``"only_first_replica"``, ``"none"``), or None (a plain place,
    an on-write ``"sum"``)."""
    try:
        owner = _chains.fetch(fn, chain[:-1])
    except _chains.Gone:
        return None
    sync, agg = _setting(owner, "synchronization"), _setting(owner, "aggregation")
    if sync == "on_read":
        return f"on_read:{agg if agg in _ON_READ else 'sum'}"
    if sync is None:  # (not a variable)
        return None
    return agg if agg in ("mean", "only_first_replica", "none") else None


def rules(fn: Callable, records: list) -> list:
    """`rule` for each computed leaf of assigned ``records`` (`jaxdist._state.assign.
    take_assigned`'s), in order."""
    return [rule(fn, chain) for chain, _, leaves in records for x in leaves if x is None]


def _setting(owner: Any, name: str) -> str | None:
    """A variable's public ``synchronization`` / ``aggregation`` (TF's and Keras' names;
    the step assigned into this object, so reading it runs no code the step did not)."""
    if _peek.is_a(owner, (dict, list, tuple)) or not _peek.is_a(owner, object):
        return None
    try:
        return _name(getattr(owner, name, None))
    except Exception:  # noqa: BLE001 - not a variable
        return None


def _name(value: Any) -> str | None:
    """A Keras/TF enum or string setting as a lower-case name (``VariableAggregation.SUM``,
    ``"sum"``); None for anything else."""
    name = getattr(value, "name", value) if value is not None else None
    return name.lower() if isinstance(name, str) else None


def kept(value: Any, varies: bool, how: str | None, first: Callable) -> Any:
    """What a place keeps of a replica step's stacked output ``value`` by its rule (`rule`):
    a `SyncOnRead` for an on-read variable; for an on-write one that varies, the mean,
    ``first(value)`` (the first row) or, for aggregation ``"none"``, each replica's own (a
    `MirroredPerReplica`, read on the host as replica 0's); else None (the caller's
    default)."""
    if how is None:
        return None
    if how.startswith("on_read:"):
        return _ON_READ[how.split(":", 1)[1]].from_stacked(value)
    if not varies:
        return None
    if how == "none":
        return MirroredPerReplica.from_stacked(value)
    return jnp.mean(value, axis=0) if how == "mean" else first(value)


def on_read_rows(fn: Callable, chain: Chain, value: Any, num: int) -> Any:
    """``value``, a plain array at ``chain``, as the `SyncOnRead` its replicas read where the
    place is a sync-on-read variable's (`rule`): a value the host assigned there (a
    metric's ``reset_state``, a restored total), which TF spreads over the replicas as
    ``value / num`` each for ``SUM`` (so that the sum read back is the value) and ``value``
    each for ``MEAN`` and ``ONLY_FIRST_REPLICA``. Anything else: ``value`` itself."""
    try:
        owner = _chains.fetch(fn, chain[:-1]) if chain else None
    except _chains.Gone:
        return value
    if owner is None or _peek.type_lookup(type(owner), "synchronization") is None:
        return value  # (not a variable: its settings are not read)
    how = rule(fn, chain)
    if how is None or not how.startswith("on_read:"):
        return value
    agg = how.split(":", 1)[1]
    seen = _SPREAD.get()
    if seen is not None:  # (a jd.function's trace: it reads the place in this form too)
        seen.append((owner, chain[-1], num))
    row = value / num if agg == "sum" and num > 1 else value
    row = row.astype(value.dtype) if row.dtype != value.dtype else row  # (TF casts back)
    return _ON_READ[agg].from_stacked(jnp.broadcast_to(row, (num, *jnp.shape(value))))


# the on-read places a replica step traced inside a jd.function read a plain value from:
# ``[(owner, last link, replicas)]`` (`spreading`)
_SPREAD: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "jaxdist_spread", default=None
)


@contextlib.contextmanager
def spreading() -> Iterator[list]:
    """Within: the on-read places whose plain value a replica step's trace spread over the
    replicas (`on_read_rows`) are collected in the list given (a `jd.function` then holds
    them in that per-replica form, `spread`, so that the host's value and the step's rows
    are one form of input: one trace)."""
    found: list = []
    token = _SPREAD.set(found)
    try:
        yield found
    finally:
        _SPREAD.reset(token)


def spread(fn: Callable, found: list) -> list[tuple[Chain, int]]:
    """Puts at the places `spreading` collected (found in ``fn``'s state) their values in
    the per-replica form the replica step reads (`on_read_rows`); returns ``[(chain,
    replicas)]`` of those places, for `respread` on later calls."""
    links: dict[int, dict] = {}  # id(owner) -> {last link: replicas}
    for owner, link, num in found:
        links.setdefault(id(owner), {})[link] = num
    places: dict[Chain, int] = {}
    for chain, value in _capture.walk(fn, set()):
        for link, num in links.get(id(value), {}).items():
            places.setdefault((*chain, link), num)
    respread(fn, list(places.items()))
    return list(places.items())


def respread(fn: Callable, places: list[tuple[Chain, int]]) -> None:
    """Puts a plain value the host assigned at an on-read place of ``places`` (`spread`) in
    the per-replica form (``metric.reset_state()`` between calls)."""
    for chain, num in places:
        try:
            value = _chains.fetch(fn, chain)
        except _chains.Gone:
            continue
        if _peek.is_a(value, jax.Array) and not _peek.is_a(value, DistributedValues):
            _assign.replace(fn, chain, on_read_rows(fn, chain, value, num))
