"""What an eager step reads besides its arguments: TF eager's meaning for captured state.

TF's eager ``strategy.run`` calls the step afresh each time, so whatever it reads
through its closure, the globals it names or its object's attributes is current.
A traced step turns every array it reads that way into a constant of its
program. To keep TF's meaning without a trace per call, jaxdist finds, once per
trace, *where* the step read each such constant (`locate`: a chain of closure
cells, globals, attributes, items and pytree children from the step function),
and reads it there again on every call (`fetch`), passing it to the program as
an argument. Python numbers, strings and functions the step reads directly are
compared on every call (`watch`); a changed one means a new trace, as a new
static argument does.

Only what can be reached from the step function is seen: arrays held by objects
that are reached through neither its closure, the globals its code names, its
bound object nor their attributes and items stay constants of the program (the
README's limits).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

Chain = tuple  # ((kind, key), ...) from the step function to a value
_MAX_NODES = 4000
_MAX_DEPTH = 8
_MAX_ITEMS = 2000
_OPAQUE = (types.ModuleType, type, types.BuiltinFunctionType, str, bytes, int, float, complex)


class Gone(Exception):
    """The value a chain led to is no longer there (the step's state changed shape)."""


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _code_names(c)
    return names


@functools.lru_cache(maxsize=1024)
def code_names(code: types.CodeType) -> frozenset[str]:
    """The global and attribute names a code object (and the code nested in it) uses."""
    return frozenset(_code_names(code))


def _pytree_children(obj: Any) -> tuple[list, Any] | None:
    """The children of a registered pytree node (None for a leaf)."""
    kids, treedef = jax.tree_util.tree_flatten(obj, is_leaf=lambda x: x is not obj)
    if len(kids) == 1 and kids[0] is obj:
        return None
    return kids, treedef


def _children(obj: Any) -> Iterator[tuple[tuple, Any]]:
    """``((kind, key), child)`` for what ``obj`` reaches: the steps of a chain."""
    if isinstance(obj, types.MethodType):
        yield ("self", None), obj.__self__
        yield ("func", None), obj.__func__
    elif isinstance(obj, functools.partial):
        yield ("pfunc", None), obj.func
        for i, a in enumerate(obj.args):
            yield ("parg", i), a
        for k, a in obj.keywords.items():
            yield ("pkw", k), a
    elif isinstance(obj, types.FunctionType):
        for i, cell in enumerate(obj.__closure__ or ()):
            try:
                yield ("cell", i), cell.cell_contents
            except ValueError:  # an empty cell
                continue
        glob = obj.__globals__
        for name in code_names(obj.__code__):
            if name in glob:
                yield ("global", name), glob[name]
    elif isinstance(obj, (list, tuple)):
        for i, a in enumerate(obj[:_MAX_ITEMS]):
            yield ("item", i), a
    elif isinstance(obj, dict):
        for k in list(obj)[:_MAX_ITEMS]:
            yield ("item", k), obj[k]
    else:
        if hasattr(type(obj), "__jaxdist_local__"):  # a Mirrored used as an array
            yield ("local", None), obj.__jaxdist_local__()
        node = _pytree_children(obj)
        if node is not None:
            for i, a in enumerate(node[0]):
                yield ("child", (node[1], i)), a
        elif hasattr(obj, "__dict__"):
            for k, a in list(vars(obj).items())[:_MAX_ITEMS]:
                yield ("attr", k), a


def _expandable(obj: Any) -> bool:
    return not isinstance(obj, _OPAQUE) and not isinstance(obj, (jax.Array, np.ndarray))


def _walk(fn: Callable, named: set[str], depth: int = _MAX_DEPTH) -> Iterator[tuple[Chain, Any]]:
    """``(chain, value)`` for what ``fn`` reaches, breadth first, bounded in nodes and
    depth; ``named`` collects the names that the code met on the way uses."""
    seen = {id(fn)}
    frontier: list[tuple[Any, Chain]] = [(fn, ())]
    nodes = 0
    for _ in range(depth):
        nxt = []
        for obj, chain in frontier:
            if isinstance(obj, types.FunctionType):
                named |= code_names(obj.__code__)
            for step, child in _safe_children(obj):
                nodes += 1
                here = (*chain, step)
                yield here, child
                if id(child) not in seen and _expandable(child):
                    seen.add(id(child))
                    nxt.append((child, here))
            if nodes > _MAX_NODES:
                return
        frontier = nxt


def locate(fn: Callable, targets: list) -> list[Chain | None]:
    """For each array of ``targets``, the chain from ``fn`` to where ``fn`` reads it, or
    None if it cannot be reached.

    An array reachable in several places is taken where the names of the chain
    (globals, attributes) are names that the code met on the way uses.
    """
    want: dict[int, list[int]] = {}
    for i, t in enumerate(targets):
        want.setdefault(id(t), []).append(i)
        base = getattr(t, "base", None) if isinstance(t, np.ndarray) else None
        if base is not None:  # JAX keeps a NumPy constant as a view of the user's array
            want.setdefault(id(base), []).append(i)
    candidates: list[list[Chain]] = [[] for _ in targets]
    named: set[str] = set()
    for chain, child in _walk(fn, named):
        for i in want.get(id(child), ()):
            if len(candidates[i]) < 4 and _same(child, targets[i]):
                candidates[i].append(chain)
    return [_best(c, named) for c in candidates]


def _named(chain: Chain, named: set[str]) -> bool:
    return all(k in named for kind, k in chain if kind in ("attr", "global"))


def _best(chains: list[Chain], named: set[str]) -> Chain | None:
    for chain in chains:
        if _named(chain, named):
            return chain
    return chains[0] if chains else None


def _same(child: Any, target: Any) -> bool:
    if child is target:
        return True
    return (
        isinstance(child, np.ndarray)
        and isinstance(target, np.ndarray)
        and child.shape == target.shape
        and child.dtype == target.dtype
    )


def _safe_children(obj: Any) -> list:
    try:
        return list(_children(obj))
    except Exception:  # an object whose attributes cannot be listed is not looked into
        return []


def fetch(fn: Callable, chain: Chain) -> Any:
    """The value at the end of ``chain`` now (raises `Gone` if it is not there)."""
    obj = fn
    try:
        for kind, key in chain:
            obj = _STEPS[kind](obj, key)
    except Gone:
        raise
    except Exception as e:
        raise Gone(str(e)) from None
    return obj


def _child(obj: Any, key: tuple) -> Any:
    node = _pytree_children(obj)
    if node is None or node[1] != key[0]:
        raise Gone("pytree structure changed")
    return node[0][key[1]]


_STEPS: dict[str, Callable[[Any, Any], Any]] = {
    "self": lambda o, k: o.__self__,
    "local": lambda o, k: o.__jaxdist_local__(),
    "func": lambda o, k: o.__func__,
    "pfunc": lambda o, k: o.func,
    "parg": lambda o, k: o.args[k],
    "pkw": lambda o, k: o.keywords[k],
    "cell": lambda o, k: o.__closure__[k].cell_contents,
    "global": lambda o, k: o.__globals__[k],
    "item": lambda o, k: o[k],
    "attr": lambda o, k: vars(o)[k],
    "child": _child,
}

_WATCHED = (bool, int, float, complex, str, type(None), np.generic)


def watch(fn: Callable) -> tuple[tuple[Chain, Any], ...]:
    """The Python numbers, strings and functions ``fn`` reads from its state (through
    names its code uses, a few levels deep), with their values now. A trace depends on
    them: `changed` tells when one moved."""
    out: list[tuple[Chain, Any]] = []
    named: set[str] = set()
    for chain, value in list(_walk(fn, named, depth=_WATCH_DEPTH)):
        function = isinstance(value, (types.FunctionType, types.MethodType))
        if isinstance(value, _WATCHED) or (function and len(chain) <= 2):
            out.append((chain, value))
    return tuple((c, v) for c, v in out if _named(c, named))[:_MAX_WATCHED]


_WATCH_DEPTH = 4
_MAX_WATCHED = 64


def changed(fn: Callable, watched: tuple[tuple[Chain, Any], ...]) -> bool:
    """Whether a value recorded by `watch` is no longer the same."""
    for chain, value in watched:
        try:
            now = fetch(fn, chain)
        except Gone:
            return True
        if now is not value and (type(now) is not type(value) or not _equal(now, value)):
            return True
    return False


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b) or (a != a and b != b)  # NaN is its own value here
    except Exception:  # noqa: BLE001 - a value that cannot be compared counts as changed
        return False
