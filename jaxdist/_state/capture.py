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

import collections
import functools
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
from jaxdist._state.chains import Chain
from jaxdist._values.values import DistributedValues

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


def _child_names(obj: Any, n: int) -> list:
    """The field names of a pytree node's children (a flax ``TrainState``'s ``params``,
    ``step``), None where its keys are not names, so that `is_named` can tell the fields
    the code reads from the others."""
    try:
        paths, _ = jax.tree_util.tree_flatten_with_path(obj, is_leaf=lambda x: x is not obj)
        names = [getattr(p[0], "name", None) if p else None for p, _ in paths]
    except Exception:  # noqa: BLE001 - a node without key paths: no names
        return [None] * n
    return names if len(names) == n else [None] * n


def _children(obj: Any) -> Iterator[tuple[tuple, Any]]:
    """``((kind, key), child)`` for what ``obj`` reaches: the steps of a chain.

    Only the object protocol's own C-level accessors are used (never a class's
    ``__getattr__``, ``__getattribute__``, properties, ``__len__``, ``__iter__`` or
    ``__getitem__``): looking for state runs no user code. What is read follows from
    ``obj``'s type (`_child_kind`), and for a NumPy array or a mapping proxy from what it
    holds.
    """
    how = _child_kinds(type(obj))
    if how == "ndarray":
        how = "flat" if obj.dtype == object else "object"
    elif how == "proxy":
        how = "container" if _peek.is_container(obj) else "object"
    return _CHILDREN[how](obj)


def _child_kind(kind: type) -> str:
    """How the walk reads the values of ``kind`` (a key of `_CHILDREN`; "ndarray" and
    "proxy" are decided per value). A JAX tracer is none of these kinds by JAX's
    instance check either: an object."""
    for name, bases in _KINDS:
        if issubclass(kind, bases):
            return name
    if kind is types.MappingProxyType:
        return "proxy"
    if kind is weakref.ref:
        return "deref"
    if issubclass(kind, np.ndarray):
        return "ndarray"
    return "distributed" if issubclass(kind, DistributedValues) else "object"


_KINDS = (
    ("method", types.MethodType),
    ("partial", functools.partial),
    ("function", types.FunctionType),
    ("class", type),  # ``Config.lr``, or a classmethod's class
    ("container", (list, tuple, collections.deque, dict)),
)
_child_kinds = _peek.PerType(_child_kind)


def _method_children(obj: Any) -> Iterator[tuple[tuple, Any]]:
    yield ("self", None), obj.__self__
    yield ("func", None), obj.__func__


def _partial_children(obj: Any) -> Iterator[tuple[tuple, Any]]:
    yield ("pfunc", None), obj.func
    yield from ((("parg", i), a) for i, a in enumerate(obj.args))
    yield from ((("pkw", k), a) for k, a in obj.keywords.items())


def _class_children(obj: type) -> Iterator[tuple[tuple, Any]]:
    for cls in obj.__mro__[:-1]:
        yield from _class_data(cls)
    yield from _method_links(obj)


def _container_children(obj: Any) -> Iterator[tuple[tuple, Any]]:
    return ((("item", k), a) for k, a in _peek.items(obj))


def _deref_children(obj: weakref.ref) -> Iterator[tuple[tuple, Any]]:
    yield ("deref", None), obj()


def _flat_children(obj: np.ndarray) -> Iterator[tuple[tuple, Any]]:
    return ((("flat", i), a) for i, a in enumerate(obj.ravel().tolist()))


def _function_children(fn: types.FunctionType) -> Iterator[tuple[tuple, Any]]:
    """Its closure cells, the globals its code loads, the modules it imports, its
    default arguments and its attributes (``step.lr``)."""
    for i, cell in enumerate(fn.__closure__ or ()):
        try:
            yield ("cell", i), cell.cell_contents
        except ValueError:  # an empty cell
            continue
    glob = fn.__globals__
    for name in sorted(_names.global_names(fn.__code__)):  # sorted: the same walk every run
        if name in glob:
            yield ("global", name), glob[name]
    for name in sorted(_names.imported_modules(fn.__code__)):
        if name in sys.modules:
            yield ("import", name), sys.modules[name]
    yield from ((("default", i), a) for i, a in enumerate(fn.__defaults__ or ()))
    yield from ((("kwdefault", k), a) for k, a in (fn.__kwdefaults__ or {}).items())
    yield from _own(fn.__dict__, "fattr")


def _distributed_children(value: Any) -> Iterator[tuple[tuple, Any]]:
    """A Mirrored's local component (what it stands for as an array), and the stacked
    array of any distributed value (what ``jax.tree`` gives: all replicas' components,
    which a step must not read as its own: `Staged` raises naming it)."""
    if _peek.type_lookup(type(value), "__jaxdist_local__") is not None:
        yield ("local", None), value.__jaxdist_local__()
    node = _chains.pytree_children(value)
    for i, a in enumerate(node[0] if node is not None else ()):
        yield ("stacked", (node[1], i, None)), a  # type: ignore[index]


def _object_children(obj: Any) -> Iterator[tuple[tuple, Any]]:
    """A pytree node's children, or an object's attributes."""
    node = _chains.pytree_children(obj)
    if node is not None:
        names = _child_names(obj, len(node[0]))
        for i, a in enumerate(node[0]):
            yield ("child", (node[1], i, names[i])), a
        yield from _method_links(type(obj))
    else:
        own = _peek.instance_dict(obj) or {}
        yield from _own(own, "attr")
        yield from _class_level(obj, own)
        yield from _method_links(type(obj))


_CHILDREN: dict[str, Callable[[Any], Iterator[tuple[tuple, Any]]]] = {
    "method": _method_children,
    "partial": _partial_children,
    "function": _function_children,
    "class": _class_children,
    "container": _container_children,
    "deref": _deref_children,
    "flat": _flat_children,
    "distributed": _distributed_children,
    "object": _object_children,
}


def _own(own: dict, kind: str) -> Iterator[tuple[tuple, Any]]:
    """An instance's (or a function's) own attributes; a function of the program's that a
    decorator wraps (``functools.wraps``' ``__wrapped__``: a ``jd.function``'s function,
    a ``jax.named_call``'s) as a link whose name every code uses: the wrapper runs it."""
    for k, a in list(own.items()):
        if k == "__wrapped__" and any(map(_names.users_function, _names.functions(a))):
            yield ("wrapped", None), a
        else:
            yield (kind, k), a


def _method_links(cls: type) -> Iterator[tuple[tuple, Any]]:
    """The methods of the program's own classes (`jaxdist._state.names.users_class`) in
    ``cls``'s MRO, as the functions they run (a property's getter, a static method's
    function, a decorated method's wrapper): a method the step calls through ``self``
    reads its own globals, closure and defaults. A base's definition that ``super()``
    reaches is a link of its own (`jaxdist._state.names.definitions`): ``("meth", (name,
    k))``, the ``k``-th definition along the MRO (`jaxdist._state.chains.method`).
    A library's class (none of the program's in its MRO: a Keras layer, a variable) has
    none, and its definitions are not looked at (the walk asks per object)."""
    if not _names.per_class(_HAS_USERS, cls, _has_users):
        return
    for klass, name, k, target, fs in _names.definitions(cls):
        if (fs or _names.wrapped(target) is not None) and _users_class(klass):
            if not name.startswith("__") or _names.by_syntax(name):
                yield ("meth", (name, k)), target


def _users_class(cls: type) -> bool:
    """`jaxdist._state.names.users_class`, kept per class (the walk asks it per object)."""
    return _names.per_class(
        _USERS, cls, lambda c: not _names.builtin_class(c) and _names.users_class(c)
    )


_USERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _has_users(cls: type) -> bool:
    return any(map(_users_class, cls.__mro__[:-1]))


_HAS_USERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _class_level(obj: Any, own: dict) -> Iterator[tuple[tuple, Any]]:
    """Slots, and data the class holds for its instances (``class T: w = jnp.zeros(())``,
    read as ``self.w`` until the instance sets its own): read as `safe_getattr` reads,
    so an instance attribute set later is what the chain finds then."""
    for cls in type(obj).__mro__[:-1]:
        slots = cls.__dict__.get("__slots__", ())
        for k in (slots,) if _peek.is_a(slots, str) else slots:
            if k not in own and k not in ("__dict__", "__weakref__"):
                try:
                    yield ("getattr", k), _peek.safe_getattr(obj, k)
                except AttributeError:  # an unset slot, or one a property shadows
                    continue
        yield from _class_data(cls, own)


def _class_data(cls: type, own: dict | None = None) -> Iterator[tuple[tuple, Any]]:
    """A class's data attributes (not methods, properties or other descriptors)."""
    if _names.builtin_class(cls):
        return
    space = cls.__dict__
    for k in _data_keys(cls, tuple(space), tuple(map(type, space.values()))):
        if not (own and k in own):
            yield ("getattr", k), space[k]


def _data_keys(cls: type, keys: tuple, kinds: tuple) -> tuple:
    """The keys of ``cls``'s data attributes (which its names and their values' types
    tell), kept per class while they are the same (the walk asks per object, and a Keras
    class has hundreds of attributes). Kept by the types' ids: a class attribute holding
    an instance of the class (``T.default = T()``) keeps no class alive."""
    ids = tuple(map(id, kinds))
    kept = _DATA_KEYS.get(cls)
    if kept is not None and kept[0] == keys and kept[1] == ids:
        return kept[2]
    found = tuple(
        k
        for k, kind in zip(keys, kinds)
        if not (k.startswith("__") or hasattr(kind, "__get__"))
        and issubclass(kind, (*_DATA, DistributedValues, jax.core.Tracer))  # (`peek.is_a`'s)
    )
    try:
        _DATA_KEYS[cls] = (keys, ids, found)
    except TypeError:  # not weakly referenceable
        pass
    return found


_DATA_KEYS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _distributed(obj: Any) -> bool:
    return issubclass(type(obj), DistributedValues)


def _expandable(obj: Any) -> bool:
    how = _expands(type(obj))
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
                    if type(child) in _ATOMS:  # (nothing inside: not looked into)
                        continue
                    if seen.get(id(child), 0) < 2 and _expandable(child):
                        named_here = is_named(here, named)
                        if id(child) in seen and not named_here:
                            continue
                        # a second path through the code's names finds an alias
                        # (``self.params = self.ema = tree``)
                        seen[id(child)] = seen.get(id(child), 0) + 1
                        if step[0] == "meth" and not is_named((step,), named):
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
        return list(_children(obj))
    except Exception:  # an object whose attributes cannot be listed is not looked into
        return []


# objects whose contents jaxdist cannot read without running code: what a step reads
# through them is a constant of its trace (`jaxdist._state.watch` warns naming them)
OPAQUE = (weakref.ProxyType, weakref.CallableProxyType, threading.local)
WATCHED = (bool, int, float, complex, str, type(None), np.generic)  # compared by value
_DATA = (jax.Array, np.ndarray, *WATCHED, list, tuple, dict)  # what a class holds as data
# values with nothing inside them to walk (exact types: a subclass may hold attributes)
_ATOMS = frozenset((bool, int, float, complex, str, bytes, type(None)))
