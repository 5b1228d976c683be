"""Placed copies of the state's arrays, shared by every trace that reads them.

An eager step reads its state's JAX arrays afresh on every call and puts them where
its program reads them (`jaxdist._state.stage.Staged.inputs`: replicated on the replicas).
JAX arrays are immutable, so a placed copy is current while the state holds the same
array: it is kept while a place of the state holds that array (``slot``: when the place
holds another array, the old one's copy goes, though the program kept the old array, as
a list of the last weights does) and never past the array (a weak reference to it drops
the copy with it), once per placement, whatever the argument signature of the trace that
reads it (six batch shapes over one state: one copy, not six).
"""

from __future__ import annotations

import functools
import types
import weakref
from collections.abc import Callable, Hashable
from typing import Any

import jax


def placed(v: jax.Array, place: Callable[[Any], Any], slot: Hashable = None) -> Any:
    """``place(v)``, kept while ``v`` lives and shared by every trace that reads it (one
    copy of the state per placement, not one per argument signature); JAX arrays are
    immutable, so a kept copy is current while the state holds ``v``. ``slot``: the place
    of the state ``v`` was read from; once every slot that held ``v`` holds another array,
    ``v``'s copies go (a list of old weights keeps the arrays, not a copy per device).

    >>> import jax.numpy as jnp
    >>> def put(v):
    ...     return v * 1
    >>> w, w2 = jnp.ones(3), jnp.zeros(3)
    >>> placed(w, put, "w") is placed(w, put, "w")
    True
    >>> first = placed(w, put, "w")
    >>> _ = placed(w2, put, "w")  # the place holds another array: w's copy goes
    >>> placed(w, put, "w") is first
    False
    """
    found = _copy(v, place)
    if slot is not None and found is not v:
        _hold(slot, v)
    elif slot is not None and slot in _HELD:  # (no copy kept for ``v``: none held for it)
        _unhold(slot, _HELD.pop(slot))
    return found


def _hold(slot: Hashable, v: jax.Array) -> None:
    """Records that ``slot`` holds ``v`` now (an array with kept copies, whose death forgets
    its holders: `_forget`); the array it held before loses its copies where no slot holds
    it any more."""
    before = _HELD.get(slot)
    if before == id(v):
        return
    _HELD[slot] = id(v)
    _HOLDERS.setdefault(id(v), set()).add(slot)
    if before is not None:
        _unhold(slot, before)


def _unhold(slot: Hashable, held: int) -> None:
    holders = _HOLDERS.get(held)
    if holders is not None:
        holders.discard(slot)
        if not holders:
            del _HOLDERS[held]
            _PLACED.pop(held, None)


def release(owner: int) -> None:
    """Forgets the slots ``(owner, ...)`` (a trace that is gone): the arrays they held lose
    their copies where no other slot holds them."""
    for slot in [s for s in _HELD if type(s) is tuple and s and s[0] == owner]:
        _unhold(slot, _HELD.pop(slot))


def _copy(v: jax.Array, place: Callable[[Any], Any]) -> Any:
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
_HELD: dict[Hashable, int] = {}  # slot -> id(the array it holds)
_HOLDERS: dict[int, set] = {}  # id(array) -> the slots holding it


def _forget(key: int, ref: weakref.ref) -> None:
    entry = _PLACED.get(key)
    if entry is not None and entry[0] is ref:  # not a newer array with the same id
        del _PLACED[key]
    for slot in _HOLDERS.pop(key, ()):
        if _HELD.get(slot) == key:
            del _HELD[slot]


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
