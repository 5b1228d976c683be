"""Places in a step's state: a value put at a chain and taken back, and what a trace assigned.

A chain (`jaxdist._state.capture`) leads from a step function to a value it reads. Two
things need to *write* there:

* a trace that reads an array where JAX keeps it as a constant of a nested jaxpr (a
  jitted helper, a ``strategy.run`` traced inside ``jd.function``) reads a tracer put
  at its place instead (`Swapped`), so the array is an input of the program, fetched
  afresh on every call, as flax's ``nnx.jit`` swaps a module's state for tracers;
* ``jd.function`` writes back what the function assigned into its state
  (``self.params = new``), as TF writes a ``tf.Variable``'s ``assign``.

`replace` puts a value at a chain: in place where the parent is mutable (an
instance's attribute, a dict or list item, a global, a closure cell), and through
immutable parents (a tuple, a namedtuple, a registered pytree node such as an optax
state) by rebuilding each one up to the nearest mutable place. Every write is
recorded so that `restore` puts back the very objects that were there: after a
trace, no tracer is left in the user's objects.
"""

from __future__ import annotations

import collections
import enum
import functools
import types
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from jaxdist._base import jax_internals as _jax_internals
from jaxdist._state import capture as _capture
from jaxdist._state import chains as _chains
from jaxdist._state import opened as _opened
from jaxdist._state import peek as _peek
from jaxdist._state import typed as _typed
from jaxdist._state.chains import Chain

MISSING = object()  # a place that did not exist (an attribute the trace created)


class NotAPlace(Exception):
    """The chain ends somewhere jaxdist cannot write (a weak reference, a view, ...)."""


def _set_slot(obj: Any, name: str, value: Any) -> None:
    descriptor = _peek.type_lookup(type(obj), name)
    if not isinstance(descriptor, types.MemberDescriptorType):
        raise NotAPlace(f"{type(obj).__name__}.{name} is not a slot")
    descriptor.__set__(obj, value)


def _set_attr(obj: Any, name: str, value: Any) -> None:
    own = _peek.instance_dict(obj)
    if own is None:
        raise NotAPlace(f"{type(obj).__name__} has no instance dictionary")
    dict.__setitem__(own, name, value)


def _set_item(obj: Any, key: Any, value: Any) -> None:
    if isinstance(obj, dict):
        dict.__setitem__(obj, key, value)
    elif isinstance(obj, list):
        list.__setitem__(obj, key, value)
    elif isinstance(obj, collections.deque):
        collections.deque.__setitem__(obj, key, value)
    else:
        raise NotAPlace(f"a {type(obj).__name__} item")


def _set_defaults(fn: Any, index: int, value: Any) -> None:
    defaults = list(fn.__defaults__)
    defaults[index] = value
    fn.__defaults__ = tuple(defaults)


def _set_getattr(obj: Any, name: str, value: Any) -> None:
    if isinstance(obj, type):
        type.__setattr__(obj, name, value)
    else:
        _set_slot(obj, name, value)


_SETTERS: dict[str, Callable[[Any, Any, Any], None]] = {
    "attr": _set_attr,
    "item": _set_item,
    "global": lambda o, k, v: o.__globals__.__setitem__(k, v),
    "cell": lambda o, k, v: setattr(o.__closure__[k], "cell_contents", v),
    "fattr": lambda o, k, v: o.__dict__.__setitem__(k, v),
    "getattr": _set_getattr,
    "default": _set_defaults,
    "flat": lambda o, k, v: o.flat.__setitem__(k, v),
    "kwdefault": lambda o, k, v: o.__kwdefaults__.__setitem__(k, v),
}


def _rebuilt(parent: Any, kind: str, key: Any, value: Any) -> Any:
    """``parent`` (immutable) with the child at ``(kind, key)`` replaced by ``value``."""
    if kind == "item" and isinstance(parent, tuple):
        items = list(tuple.__iter__(parent))
        items[key] = value
        return type(parent)(*items) if hasattr(parent, "_fields") else type(parent)(items)
    if kind == "item" and isinstance(parent, types.MappingProxyType):
        return types.MappingProxyType({**dict(parent.items()), key: value})
    if kind in ("child", "stacked"):
        treedef, index, _ = key
        leaves, now = jax.tree_util.tree_flatten(parent, is_leaf=lambda x: x is not parent)
        if now != treedef:
            raise NotAPlace("the pytree's structure changed")
        leaves[index] = value
        return treedef.unflatten(leaves)
    if isinstance(parent, functools.partial) and kind in ("parg", "pkw", "pfunc"):
        args, keywords = list(parent.args), dict(parent.keywords)
        func = value if kind == "pfunc" else parent.func
        if kind == "parg":
            args[key] = value
        elif kind == "pkw":
            keywords[key] = value
        return functools.partial(func, *args, **keywords)
    raise NotAPlace(f"a {kind} link of a {type(parent).__name__}")


def _old(parent: Any, kind: str, key: Any) -> Any:
    try:
        return _chains.fetch(parent, ((kind, key),))
    except _chains.Gone:
        return MISSING


def replace(fn: Callable, chain: Chain, value: Any, undo: bool = True) -> list[tuple[Chain, Any]]:
    """Puts ``value`` at the end of ``chain`` from ``fn``; returns what `restore` needs to
    put back the objects that were there (raises `NotAPlace` where nothing can be written;
    ``undo`` False: not read, ``[]``, for a value stored for good).

    >>> state = {"opt": (1.0, 2.0)}                     # a tuple: rebuilt, not mutated
    >>> step = lambda: state["opt"][1]
    >>> chain = (("global", "state"), ("item", "opt"), ("item", 1))
    >>> undo = replace(step, chain, 5.0)
    >>> state["opt"]
    (1.0, 5.0)
    >>> restore(step, undo); state["opt"]
    (1.0, 2.0)
    """
    while chain:
        kind, key = chain[-1]
        try:
            parent = _chains.fetch(fn, chain[:-1])
        except _chains.Gone as e:
            raise NotAPlace(str(e)) from None
        setter = _SETTERS.get(kind)
        if setter is not None and _mutable(parent, kind):
            old = _old(parent, kind, key) if undo else MISSING
            was = _typed.held(parent, kind, key)
            try:
                setter(parent, key, value)
            except (AttributeError, TypeError, IndexError, KeyError) as e:
                raise NotAPlace(str(e)) from None
            if was is not value:  # (past a Keras object's barrier: an epoch drawn)
                _typed.written(fn, chain)
            return [(chain, old)] if undo else []
        value, chain = _rebuilt(parent, kind, key, value), chain[:-1]
    raise NotAPlace("the step function itself")


def _mutable(parent: Any, kind: str) -> bool:
    if kind == "item":
        return isinstance(parent, (dict, list, collections.deque))
    if kind == "flat":
        return isinstance(parent, np.ndarray) and parent.dtype == object
    return True


def restore(fn: Callable, undo: list[tuple[Chain, Any]]) -> None:
    """Puts back what `replace` (or several of them, in order) found there."""
    for chain, old in reversed(undo):
        parent = _chains.fetch(fn, chain[:-1])
        kind, key = chain[-1]
        if old is not MISSING:
            _SETTERS[kind](parent, key, old)
        elif kind == "attr":
            dict.pop(_peek.instance_dict(parent) or {}, key, None)
        elif kind == "item" and isinstance(parent, dict):
            dict.pop(parent, key, None)
        elif kind == "item" and isinstance(parent, list):
            del parent[key:]
        elif kind == "item" and isinstance(parent, collections.deque):
            while len(parent) > key:  # (a deque takes no slice)
                parent.pop()
        elif kind == "global":
            parent.__globals__.pop(key, None)


def can_replace(fn: Callable, chain: Chain) -> bool:
    """Whether `replace` can write at ``chain`` (checked by writing the value back)."""
    try:
        value = _chains.fetch(fn, chain)
        restore(fn, replace(fn, chain, value))
    except (NotAPlace, _chains.Gone):
        return False
    return True


class Swapped:
    """Within ``with``: ``values`` (tracers) at ``chains``; after it, the objects that
    were there. ``written`` then lists the chains the body assigned (index, value)."""

    def __init__(self, fn: Callable, chains: list[Chain], values: list[Any]) -> None:
        self._fn, self._chains, self._values = fn, chains, values
        self._undo: list[tuple[Chain, Any]] = []
        self.written: list[tuple[int, Any]] = []

    def __enter__(self) -> Swapped:
        for chain, value in zip(self._chains, self._values):
            self._undo += replace(self._fn, chain, value)
        return self

    def check_written(self) -> None:
        """Records what the body stored at the swapped places (call before leaving)."""
        for i, (chain, value) in enumerate(zip(self._chains, self._values)):
            try:
                now = _chains.fetch(self._fn, chain)
            except _chains.Gone:
                continue
            if now is not value:
                self.written.append((i, now))

    def __exit__(self, *exc: Any) -> None:
        restore(self._fn, self._undo)


# -- what a trace assigned --------------------------------------------------------------------


def snapshot(fn: Callable) -> dict[Chain, Any]:
    """What ``fn``'s state holds at every chain now (`assigned` compares with it)."""
    return dict(_capture.walk(fn, set()))


def assigned(
    fn: Callable,
    before: dict[Chain, Any],
    ours: Callable[[Any], bool],
    skip: set,
    now: dict[Chain, Any] | None = None,
):
    """The places where ``fn``'s state now holds a value the trace computed (``ours``)
    that it did not hold in ``before``: ``[(chain, old, new)]``, each the shortest chain
    whose object changed (``self.params`` for ``self.params = {...}``), ``old`` the
    object there before (`MISSING` for a new place). Chains in ``skip`` are left out;
    ``now``: the state now, where it was walked already."""
    now = dict(_capture.walk(fn, set())) if now is None else now
    places: dict[Chain, tuple[Any, Any]] = {}
    for chain, value in now.items():
        if not ours(value):
            continue
        place = _first_changed(chain, before, now)
        if place is None or place in skip or any(place[: len(p)] == p for p in places):
            continue
        for p in [p for p in places if p[: len(place)] == place]:
            del places[p]  # a longer chain under this one
        places[place] = (before.get(place, MISSING), now[place])
    return [(chain, old, new) for chain, (old, new) in places.items()]


def take_assigned(
    fn: Callable,
    before: dict[Chain, Any],
    skip: set,
    check: Callable[[Callable, list], None],
    constants: bool = False,
    moved: list | None = None,
) -> tuple[list, list]:
    """What the running trace assigned into ``fn``'s state since ``before`` (`snapshot`),
    taken out: the state is put back as it was, and the values become outputs. Returns the
    records ``[(chain, treedef, leaves)]`` (a leaf the trace computed is None there) and the
    computed leaves, in order. ``check(fn, places)`` may refuse what was assigned (it puts
    the state back before it raises). With ``constants``, the Python values it assigned
    that are no traced numbers (`constant_places`) are taken too, as records whose
    leaves are those values. With a ``moved`` list, the places where it put an array the
    state held elsewhere (``self.prev = self.w``: `moved_places`) are put back and added
    there as ``(chain, source chain)``."""
    trace = _jax_internals.current_trace()

    def ours(x: Any) -> bool:  # (by type first: no user code of the objects walked)
        return _peek.is_a(x, jax.core.Tracer) and _jax_internals.is_inner_tracer(x, trace)

    now = dict(_capture.walk(fn, set()))
    places = assigned(fn, before, ours, skip, now)
    check(fn, places)
    holds = functools.partial(_holds, ours=ours, depth=3)
    _refuse_hidden(fn, places, ours, holds)
    if constants:
        places += constant_places(before, now, skip, places)
    if moved is not None:  # arrays of the state the trace put at another place
        found = moved_places(before, now, skip, places)
        moved += [(chain, source) for chain, _, source in found]
        restore(fn, [(chain, old) for chain, old, _ in found])
    records: list = []
    out: list = []
    for chain, _, new in places:
        leaves, treedef = _opened.flatten(new, holds)
        traced = [ours(x) for x in leaves]
        records.append((chain, treedef, [None if t else x for x, t in zip(leaves, traced)]))
        out += [x for x, t in zip(leaves, traced) if t]
    restore(fn, [(chain, old) for chain, old, _ in places])
    return records, out


def constant_places(before: dict[Chain, Any], now: dict[Chain, Any], skip: set, places: list):
    """The places where the running trace put a Python value that is no traced number
    (``self.train_disc = not self.train_disc``, ``self.mode = "eval"``: a bool, a string,
    None, an Enum member, a set), as `assigned` gives them: a constant of the trace, written back
    after each call as Python would assign it (the trace is keyed on the value it read:
    `jaxdist._state.watch`). Numbers are `jaxdist._state.promote`'s (inputs, or a new
    trace); a list's new items are not places to write."""
    out = []
    for chain, value in now.items():
        if not (type(value) in _CONSTANTS or _peek.is_a(value, enum.Enum)):
            continue
        old = before.get(chain, MISSING)
        kind = chain[-1][0]
        if old is value or chain in skip or kind not in _CONSTANT_PLACES:
            continue
        if old is MISSING and kind == "getattr" and not _a_slot(now.get(chain[:-1]), chain):
            continue  # a class's data the walk did not reach before (an object is walked once)
        if _first_changed(chain, before, now) != chain or any(
            chain[: len(p)] == p for p, _, _ in places
        ):
            continue  # (inside a new object, or one the trace computed)
        if kind == "item" and not _peek.is_a(now.get(chain[:-1]), dict):
            continue
        out.append((chain, old, value))
    return out


def moved_places(before: dict[Chain, Any], now: dict[Chain, Any], skip: set, places: list):
    """The places where the running trace put a concrete array the state held at another
    place before it (``self.prev = self.w``): ``[(chain, old, source chain)]``. The trace
    reads that array as a constant, so the assignment is no output of it: after each call
    the place gets what the source held when the call began (`jaxdist._state.calls`)."""
    where = {id(v): c for c, v in before.items() if _peek.is_a(v, jax.Array)}
    out = []
    for chain, value in now.items():
        if not _peek.is_a(value, jax.Array) or _peek.is_a(value, jax.core.Tracer):
            continue
        source = where.get(id(value))
        old = before.get(chain, MISSING)
        if source is None or old is value or source == chain or chain in skip:
            continue
        if old is MISSING and chain[-1][0] == "item" and type(chain[-1][1]) is int:
            continue  # (a new list entry: an append, run at the trace as tf.function runs it)
        if _first_changed(chain, before, now) != chain or any(
            chain[: len(p)] == p for p, _, _ in places
        ):
            continue  # (inside a new object, or one the trace computed)
        out.append((chain, old, source))
    return out


_CONSTANTS = frozenset((bool, str, type(None), bytes, np.bool_, set, frozenset))


def _a_slot(obj: Any, chain: Chain) -> bool:
    descriptor = _peek.type_lookup(type(obj), chain[-1][1])
    return isinstance(descriptor, types.MemberDescriptorType)


_CONSTANT_PLACES = frozenset(("attr", "getattr", "global", "cell", "fattr", "item"))


def _refuse_hidden(fn: Callable, places: list, ours: Callable, holds: Callable) -> None:
    """Raises (the state put back first) where an assigned value holds a value the trace
    computed inside an object JAX does not see into (a plain class; a plain dataclass is
    opened, `jaxdist._state.opened`): it cannot be written back, and would leave a dead
    tracer in the user's object."""
    for chain, _, new in places:
        for leaf in _opened.flatten(new, holds)[0]:
            if not ours(leaf) and holds(leaf):
                where, kind = _chains.describe(fn, chain), type(leaf).__name__
                restore(fn, [(c, old) for c, old, _ in places])
                raise RuntimeError(
                    f"The function {getattr(fn, '__qualname__', fn)} assigned {where} a "
                    f"{kind} holding values it computed, but {kind} is not a pytree, so "
                    "jaxdist cannot write those values back after the call (they would be "
                    f"dead tracers). Register {kind} as a pytree (@jax.tree_util."
                    "register_dataclass, flax.struct.dataclass), or assign its arrays to "
                    "places of their own (a dict, a list, attributes)."
                )


def _holds(obj: Any, *, ours: Callable[[Any], bool], depth: int) -> bool:
    """Whether ``obj``'s own attributes (or a container's items) reach a value ``ours``
    accepts, within ``depth`` links (no user code runs)."""
    if depth == 0 or _peek.is_a(obj, (str, bytes, int, float, complex, np.ndarray, jax.Array)):
        return False
    own = _peek.instance_dict(obj)
    kids = list(own.values()) if own is not None else []
    if _peek.is_a(obj, (list, tuple, set, frozenset)):
        kids = list(obj)
    elif _peek.is_a(obj, dict):
        kids = list(dict.values(obj))
    return any(ours(k) or _holds(k, ours=ours, depth=depth - 1) for k in kids)


def number_places(before: dict[Chain, Any], swapped: Any) -> set:
    """The chains of ``before`` (`snapshot`) that hold the tracers of the Python numbers
    ``swapped`` (`jaxdist._state.promote.Swapped`, or None) put there: not assignments."""
    if swapped is None:
        return set()
    tracers = {id(t) for t in swapped.now()}
    return {chain for chain, value in before.items() if id(value) in tracers}


def _first_changed(chain: Chain, before: dict, now: dict) -> Chain | None:
    for i in range(1, len(chain) + 1):
        place = chain[:i]
        if place not in before or before[place] is not now.get(place):
            return place
    return None


def tracers(value: Any) -> Iterator[Any]:
    """The JAX tracers among ``value``'s pytree leaves."""
    for leaf in jax.tree.leaves(value):
        if isinstance(leaf, jax.core.Tracer):
            yield leaf
