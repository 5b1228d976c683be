"""What one object of a step's state reaches: the steps of a chain from it.

`jaxdist._state.capture` walks a step's state breadth first from the step function;
each object on the way is opened here (`children`): a bound method's object and
function, a partial's function and arguments, a function's closure cells, the globals
and modules its code names, its defaults and attributes, a class's data and the methods
of the program's own classes (as the functions they run), a container's items, a weak
reference's object, a pytree node's children, an object's own attributes, slots and the
data its class holds for it. Only the object protocol's own accessors are used
(`jaxdist._state.peek`): opening an object runs none of its code. How an object is
opened follows from its type, decided once per type (the walk opens thousands of
objects of a few dozen classes); apart from the walk because what an object reaches is
one concept and the order the walk takes is another.

>>> def step(x, k=2.0):
...     return x * k
>>> [link for link, _ in children(step)]
[('default', 0)]
"""

from __future__ import annotations

import collections
import functools
import sys
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from jaxdist._state import chains as _chains
from jaxdist._state import names as _names
from jaxdist._state import peek as _peek
from jaxdist._values.values import DistributedValues


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


def children(obj: Any) -> Iterator[tuple[tuple, Any]]:
    """``((kind, key), child)`` for what ``obj`` reaches: the steps of a chain.

    Only the object protocol's own C-level accessors are used (never a class's
    ``__getattr__``, ``__getattribute__``, properties, ``__len__``, ``__iter__`` or
    ``__getitem__``): looking for state runs no user code. What is read follows from
    ``obj``'s type (`_child_kind`), and for a NumPy array or a mapping proxy from what it
    holds.
    """
    how = _child_kinds(type(obj))
    if how == "ndarray":  # (an object array's elements; else as any object)
        how = "flat" if obj.dtype == object else _after_arrays(type(obj))
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
    return _after_arrays(kind)


def _after_arrays(kind: type) -> str:
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
    if not _has_users_of(cls):
        return
    for klass, name, k, target, fs in _names.definitions(cls):
        if (fs or _names.wrapped(target) is not None) and _users_class(klass):
            if not name.startswith("__") or _names.by_syntax(name):
                yield ("meth", (name, k)), target


# `jaxdist._state.names.users_class`, kept per class (the walk asks it per object)
_users_class = _peek.PerType(lambda c: not _names.builtin_class(c) and _names.users_class(c))


def _has_users(cls: type) -> bool:
    return any(map(_users_class, cls.__mro__[:-1]))


_has_users_of = _peek.PerType(_has_users)


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
    holder = _data_keys_of(cls)  # (the last answer for ``cls``, checked against it)
    kept = holder[0]
    if kept is not None and kept[0] == keys and kept[1] == ids:
        return kept[2]
    found = tuple(
        k
        for k, kind in zip(keys, kinds)
        if not (k.startswith("__") or hasattr(kind, "__get__"))
        and issubclass(kind, (*_DATA, DistributedValues, jax.core.Tracer))  # (`peek.is_a`'s)
    )
    holder[0] = (keys, ids, found)
    return found


_data_keys_of = _peek.PerType(lambda cls: [None])


WATCHED = (bool, int, float, complex, str, type(None), np.generic)  # compared by value
_DATA = (jax.Array, np.ndarray, *WATCHED, list, tuple, dict)  # what a class holds as data
