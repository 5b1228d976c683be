"""Placed copies of the state's arrays, shared by every trace that reads them.

An eager step reads its state's JAX arrays afresh on every call and puts them where
its program reads them (`jaxdist._state.stage.Staged.inputs`: replicated on the replicas).
JAX arrays are immutable, so a placed copy is current while the state holds the same
array: it is kept as long as that array lives (a weak reference to it drops the copy
with it), once per placement, whatever the argument signature of the trace that
reads it (six batch shapes over one state: one copy, not six).
"""

from __future__ import annotations

import functools
import types
import weakref
from collections.abc import Callable, Hashable
from typing import Any

import jax


def placed(v: jax.Array, place: Callable[[Any], Any]) -> Any:
    """``place(v)``, kept while ``v`` lives and shared by every trace that reads it (one
    copy of the state per placement, not one per argument signature); JAX arrays are
    immutable, so a kept copy is current while the state holds ``v``.

    >>> import jax.numpy as jnp
    >>> def put(v):
    ...     return v * 1
    >>> w = jnp.ones(3)
    >>> placed(w, put) is placed(w, put)
    True
    """
    entry = _PLACED.get(id(v))
    key = None
    if entry is not None and entry[0]() is v:
        key = _place_key(place)
        found = entry[1].get(key)
        if found is not None:
            return found
    found = place(v)
    if found is v:  # already where ``place`` puts it (kept, it would keep ``v`` alive)
        return v
    if key is None:
        key = _place_key(place)
    if entry is None or entry[0]() is not v:
        try:
            ref = weakref.ref(v, functools.partial(_forget, id(v)))
        except TypeError:
            return found
        entry = _PLACED[id(v)] = (ref, {})
    entry[1][key] = found
    return found


_PLACED: dict[int, tuple[weakref.ref, dict]] = {}  # id(array) -> (its reference, copies)


def _forget(key: int, ref: weakref.ref) -> None:
    entry = _PLACED.get(key)
    if entry is not None and entry[0] is ref:  # not a newer array with the same id
        del _PLACED[key]


def _place_key(place: Callable) -> Hashable:
    """What decides where ``place`` puts an array (a bound method: its object and
    function; a partial: its function and arguments)."""
    key: Hashable = place
    if isinstance(place, types.MethodType):
        key = (place.__self__, place.__func__)
    elif isinstance(place, functools.partial):
        key = (place.func, place.args, tuple(sorted(place.keywords.items())))
    try:
        hash(key)
    except TypeError:
        return place
    return key
