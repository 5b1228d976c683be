"""What an eager step reads besides its arguments: TF eager's meaning for captured state.

TF's eager ``strategy.run`` calls the step afresh each time, so whatever it reads
through its closure, the globals it names or its object's attributes is current.
A traced step turns every array it reads that way into a constant of its
program. To keep TF's meaning without a trace per call, jaxdist finds, once per
trace, *where* the step read each such constant (`locate`: a chain of closure
cells, globals, imported modules, function attributes, attributes, items and
pytree children from the step function), and reads it there again on every call
(`jaxdist._state.chains.fetch`), passing it to the program as an argument. The
Python values a trace depends on are `jaxdist._state.watch`'s, which walks the same
way (`walk`).

The walk has no depth bound (an optax state over a flax model is 20 levels deep)
and reads every item of a container; it stops after `MAX_NODES` objects, and then
says how many arrays it did not find (a warning, never a silent constant). It runs
no user code: every read goes through `jaxdist._state.peek` (the object protocol's own
accessors), so lazy containers, proxies and loggers on the object are not woken.

Only what can be reached from the step function is seen: arrays that the step
reaches otherwise (an installed package's globals, an object held only by a C
extension) stay constants of the program, and `jaxdist._state.stage` warns at the trace
when a constant is an array that existed before it (the table in
docs/guides/state.md). Python numbers read by a name the code computes
(``getattr(t, name)``) are `jaxdist._state.watch`'s.
"""

from __future__ import annotations

import logging
import sys
import threading
import types
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from jaxdist._state import chains as _chains
from jaxdist._state import names as _names
from jaxdist._state import peek as _peek
from jaxdist._state import reach as _reach
from jaxdist._state.chains import Chain

MAX_NODES = 200_000  # objects looked at per trace; past it, a warning (`locate_all`)
# not looked into: the standard library's logging objects as well (a logger's caches and
# handlers change when the host logs; they are never a step's state)
_OPAQUE = (
    types.ModuleType,
    types.BuiltinFunctionType,
    str,
    bytes,
    int,
    float,
    complex,
    logging.Filterer,
    logging.LoggerAdapter,
    logging.Manager,
)


# chain steps whose string value may be an attribute name the code reads by
# (``NAME = "lr"`` then ``getattr(t, NAME)``; ``self.key``; a default argument)
_HOLDERS = frozenset(
    ("cell", "global", "default", "kwdefault", "parg", "pkw", "attr", "getattr", "fattr")
)


def _expandable(obj: Any, how: Any) -> bool:
    """Whether the walk looks into ``obj``, ``how`` being its type's answer (`_expands`)."""
    if how is True or how is False:
        return how
    if how == "module":
        return user_module(obj)
    if how == "array":
        return obj.dtype == object  # an object array's elements (arrays, objects)
    return not _peek.is_a(obj, (_OPAQUE, jax.Array))  # a tracer: JAX's check, per value


def _expands_kind(kind: type) -> Any:
    """Whether the walk looks into the values of ``kind``, or what about the value
    decides it ("module", "array"; "value" for a JAX tracer)."""
    if issubclass(kind, jax.core.Tracer):
        return "value"
    if issubclass(kind, types.ModuleType):
        return "module"
    if issubclass(kind, np.ndarray):
        return "array"
    return not issubclass(kind, (*_OPAQUE, jax.Array))


_expands = _peek.PerType(_expands_kind)  # (asked for each of the thousands of values walked)


def user_module(module: types.ModuleType) -> bool:
    """A module of the user's program (``config.W``), not the standard library or an
    installed package (whose globals are no step's state)."""
    top = module.__name__.partition(".")[0]
    if top in sys.stdlib_module_names or top in ("jaxdist", "builtins"):
        return False
    origin = module.__dict__.get("__file__") or ""
    return "site-packages" not in origin and "dist-packages" not in origin


def walk(fn: Callable, named: set[str], limits: dict | None = None) -> Iterator[tuple[Chain, Any]]:
    """``(chain, value)`` for what ``fn`` reaches, at any depth, up to `MAX_NODES`
    objects (``limits["truncated"]`` tells when it stopped there); ``named`` collects
    the names that the code met on the way uses.

    Breadth first along chains whose names the code uses (``self.model.params``), then
    along the others (``self.dataset``), so that big unrelated containers on an object
    do not come before the state the step reads.
    """
    seen = {id(fn): 2}
    frontier: list[tuple[Any, Chain]] = [(fn, ())]
    deferred: list[tuple[Any, Chain]] = []
    # methods of a class reached under names the code does not use (yet): walked only
    # when a name met later names them (a method the code does not call is not state)
    methods: list[tuple[Any, Chain]] = []
    globals_seen: set[tuple[int, str]] = set()
    closed: dict[type, int] = {}  # (`jaxdist._state.names.add_names`)
    expands: dict[type, Any] = {}  # `_expands` of the types met (this walk's)
    nodes = 0
    for later in (False, True):
        while frontier or (not later and methods):
            if not frontier:
                frontier = [m for m in methods if is_named(m[1], named)]
                if not frontier:
                    break
                methods = [m for m in methods if not is_named(m[1], named)]
            nxt: list[tuple[Any, Chain]] = []
            # functions first: the names their code uses decide what else comes first
            frontier.sort(key=lambda entry: not _peek.is_a(entry[0], types.FunctionType))
            for obj, chain in frontier:
                if not later:  # a callback reached through other names is not the step's
                    _names.add_names(obj, named, closed)
                at = -1  # the size ``named`` had when ``chain_named`` was found
                for step, child in _safe_children(obj):
                    if step[0] == "global":  # one module's global, read by several of
                        place = (id(obj.__globals__), step[1])  # its functions: one place
                        if place in globals_seen:
                            continue
                        globals_seen.add(place)
                    nodes += 1
                    here = (*chain, step)
                    yield here, child
                    if not later and type(child) is str and step[0] in _HOLDERS:
                        _names.add_held_name(child, here, named, is_named)
                    kind = type(child)
                    if kind in _ATOMS:  # (nothing inside: not looked into)
                        continue
                    how = expands.get(kind)
                    if how is None:
                        how = expands[kind] = _expands(kind)
                    if seen.get(id(child), 0) < 2 and _expandable(child, how):
                        if at != len(named):  # (names only grow: found again if they did)
                            chain_named, at = is_named(chain, named), len(named)
                        step_named = is_named((step,), named)
                        named_here = chain_named and step_named  # (`is_named(here)`)
                        if id(child) in seen and not named_here:
                            continue
                        # a second path through the code's names finds an alias
                        # (``self.params = self.ema = tree``)
                        seen[id(child)] = seen.get(id(child), 0) + 1
                        if step[0] == "meth" and not step_named:
                            methods.append((child, here))  # (walked once named)
                        elif named_here and not later:
                            nxt.append((child, here))
                        else:
                            (nxt if later else deferred).append((child, here))
                if nodes > MAX_NODES:
                    if limits is not None:
                        limits["truncated"] = True
                    return
            frontier = nxt
        frontier = sorted(deferred, key=lambda entry: len(entry[1]))


def locate(fn: Callable, targets: list) -> list[Chain | None]:
    """For each array of ``targets``, the chain from ``fn`` to where ``fn`` reads it, or
    None if it cannot be reached.

    An array reachable in several places is taken where the names of the chain
    (globals, attributes) are names that the code met on the way uses.
    """
    return [c[0] if c else None for c in locate_all(fn, targets)]


def locate_all(fn: Callable, targets: list, limits: dict | None = None) -> list[list[Chain]]:
    """For each array of ``targets``, the chains from ``fn`` to it whose names the code
    uses, the best first (`locate`'s); one chain reaching it under names the code does
    not use when there is no other. Two chains mean one array read under two names
    (``self.w = self.ema = w``): the trace read it once, so it is valid only while both
    names still hold one array. ``limits`` gets ``"numpy"`` when the step's state holds
    NumPy arrays under names its code uses, ``"truncated"`` when the walk stopped."""
    want: dict[int, list[int]] = {}
    for i, t in enumerate(targets):
        want.setdefault(id(t), []).append(i)
        if _peek.is_a(t, np.ndarray) and t.base is not None:
            # JAX keeps a NumPy constant as a view of the user's array, or of a view of
            # it taken in the step (``table[0]``): found through the memory's owner
            want.setdefault(id(_chains.owner(t)), []).append(i)
    candidates: list[list[Chain]] = [[] for _ in targets]
    named: set[str] = set()
    limits = {} if limits is None else limits
    for chain, child in walk(fn, named, limits):
        if _peek.is_a(child, np.ndarray) and child.dtype != object and is_named(chain, named):
            limits["numpy"] = True
            if not child.flags.c_contiguous:  # a view of it is copied, not found
                limits.setdefault("strided", []).append(chain)
        keys = (
            {id(child), id(_chains.owner(child))} if _peek.is_a(child, np.ndarray) else {id(child)}
        )
        for i in {i for k in keys for i in want.get(k, ())}:
            if len(candidates[i]) >= 4:
                continue
            if _chains.same_array(child, targets[i]):
                candidates[i].append(chain)
            elif _chains.inside(targets[i], child):
                candidates[i].append((*chain, ("view", _chains.view_spec(child, targets[i]))))
    out = []
    for chains in candidates:
        chains.sort(key=lambda c: c[-1][0] == "view")  # the array itself before a view
        good = [c for c in chains if is_named(c, named)]
        out.append(good or chains[:1])
    missing = sum(1 for chains in out if not chains)
    if limits.get("truncated") and missing:
        warnings.warn(
            f"jaxdist looked at {MAX_NODES:,} objects reachable from the step "
            f"{getattr(fn, '__qualname__', fn)!r} and stopped: {missing} array(s) it read "
            "were not found there and stay constants of its program (later changes are not "
            "seen). Pass that state to strategy.run as arguments.",
            RuntimeWarning,
            stacklevel=6,
        )
    return out


def is_named(chain: Chain, named: set[str]) -> bool:
    """Whether every name ``chain`` reads by is one the code uses (a pytree node's
    fields all are, where the code uses tree functions: `jaxdist._state.names.BY_TREE`)."""
    by_tree = _names.BY_TREE in named
    for kind, k in chain:
        name = _name(kind, k)
        if name is not None and name not in named and not (by_tree and kind == "child"):
            return False
    return True


def chain_names(chain: Chain) -> set[str]:
    """The names ``chain`` reads by (`is_named`'s)."""
    return {n for kind, k in chain if (n := _name(kind, k)) is not None}


def _name(kind: str, key: Any) -> str | None:
    """The name a chain step reads by (attributes, globals, a pytree node's fields, a
    method not called by syntax)."""
    if kind in ("attr", "getattr", "global", "fattr"):
        return key
    if kind == "meth":
        return None if _names.by_syntax(key[0]) else key[0]
    return key[2] if kind == "child" else None


def _safe_children(obj: Any) -> list:
    try:
        return list(_reach.children(obj))
    except Exception:  # an object whose attributes cannot be listed is not looked into
        return []


# objects whose contents jaxdist cannot read without running code: what a step reads
# through them is a constant of its trace (`jaxdist._state.watch` warns naming them)
OPAQUE = (weakref.ProxyType, weakref.CallableProxyType, threading.local)
# values with nothing inside them to walk (exact types: a subclass may hold attributes)
_ATOMS = frozenset((bool, int, float, complex, str, bytes, type(None)))
