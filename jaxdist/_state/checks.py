"""The checks a cached trace makes of its step's state, told in words.

A trace of a step depends on the Python values `jaxdist._state.watch` recorded; when
one moved, the cached trace does not fit and the step is traced again. This module
tells that to a person: the first recorded value that moved (`what_changed`), each
recorded value as the check it stands for (`shown`, which ``jd.experimental.explain``
lists), and why this thread's last cached trace did not fit (`note_decline`,
`last_decline`: the retrace warning names it). Apart from the watch, which records and
compares, because these only word what the watch found.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from jaxdist._state import chains as _chains
from jaxdist._state import watch as _watch
from jaxdist._state.chains import Chain, describe


def what_changed(fn: Callable, watched: tuple[tuple[Chain, Any, str], ...]) -> str:
    """The first value recorded by `watch` that moved, as Python names it, and how.

    >>> box = {"mode": "a"}
    >>> step = lambda x: box["mode"]
    >>> seen = _watch.watch(step)
    >>> box["mode"] = "b"
    >>> what_changed(step, seen)
    "box['mode'] changed ('a' -> 'b')"
    """
    for chain, value, how in watched:
        try:
            now = _chains.fetch(fn, chain)
        except _chains.Gone:
            return f"{describe(fn, chain[:-1]) or 'a value it read'} no longer holds what it read"
        if now is value or not _watch.differs(now, value, how):
            continue
        where = describe(fn, chain)
        if how == "value":
            return f"{where} changed ({value!r} -> {now!r})"
        if how == "member":
            return f"{where} changed ({value} -> {now!r})"
        if how == "set":
            return f"{where} changed ({_set(value)} -> {now!r})"
        if how == "size":
            return f"{where} changed size ({value} -> {_watch.size(now)})"
        if how == "type":
            return f"{where} is now a {type(now).__name__}, not a {value.__name__}"
        if how == "absent":
            return f"{where}.{value} was set (it was absent when traced)"
        if how == "noglobal":
            return f"the global {value} was defined (it was absent when traced)"
        return f"{where} is another object"
    return "a value it read changed"


def shown(fn: Callable, watched: tuple[Chain, Any, str]) -> str:
    """One value recorded by `watch`, as the check it stands for.

    >>> box = {"mode": "a"}
    >>> step = lambda x: box["mode"]
    >>> [shown(step, w) for w in _watch.watch(step)]
    ["box['mode'] == 'a'", 'len(box) == 1']
    """
    chain, value, how = watched
    where = describe(fn, chain) or "the step's function"
    if how == "size":
        return f"len({where}) == {value}"
    if how == "type":
        return f"type({where}) is {value.__qualname__}"
    if how in ("ident", "weak"):
        held = value() if how == "weak" else value
        return f"{where} is {getattr(held, '__qualname__', type(held).__qualname__)}"
    if how == "code":
        name = getattr(value[0], "co_qualname", getattr(value[0], "co_name", "?"))
        return f"{where} is code {name} over the same captures"
    if how == "tree":
        return f"{where} has the structure it had"
    if how == "member":
        return f"{where} is {value}"
    if how == "set":
        return f"{where} == {_set(value)}"
    if how == "absent":
        return f"not hasattr({where}, {value!r})"
    if how == "noglobal":
        return f"{value!r} not in globals"
    return f"{where} == {value!r}"


def _set(recorded: tuple) -> str:
    """A set `watch` recorded (its type, a frozenset of its members), as Python shows it.

    >>> _set((set, frozenset({"a"}))), _set((frozenset, frozenset()))
    ("{'a'}", 'frozenset()')
    """
    kind, members = recorded
    if kind is set:
        return repr(set(members)) if members else "set()"
    return f"{kind.__name__}({set(members)!r})" if members else f"{kind.__name__}()"


_DECLINED = threading.local()


def note_decline(reason: str) -> None:
    """Records why this thread's last cached trace did not fit (for the retrace warning)."""
    _DECLINED.reason = reason


def last_decline() -> str:
    """Why this thread's last cached trace did not fit its step's state ("" if none)."""
    return getattr(_DECLINED, "reason", "")
