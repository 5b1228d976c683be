"""Reading user objects without running their code: the object protocol's own accessors.

Looking for the state a step reads (`jaxdist._state.capture`) must not call a class's
``__getattr__``, ``__getattribute__``, properties, ``__len__``, ``__iter__``,
``__getitem__``, ``__eq__`` or ``__hash__`` (lazy containers, loggers, proxies and
database-backed mappings do work there). These functions read instance dictionaries
through the interpreter's own descriptor, slots through their member descriptors,
class data from the classes' namespaces, and built-in containers (and their
subclasses) through the built-in type's methods, as flax nnx's graph walk restricts
itself to types the library owns.
"""

from __future__ import annotations

import collections
import gc
import types
import weakref
from typing import Any

import jax


def is_a(obj: Any, kinds: Any) -> bool:
    """``isinstance(obj, kinds)`` by ``obj``'s type alone: ``isinstance`` reads
    ``obj.__class__`` where the type does not match, through a class's own
    ``__getattribute__`` (user code).

    >>> class Nosy:
    ...     def __getattribute__(self, name):
    ...         raise RuntimeError("user code")
    >>> is_a(Nosy(), dict), is_a({}, dict)
    (False, True)
    """
    kind = type(obj)
    if issubclass(kind, kinds):
        return True
    # a JAX tracer is a `jax.Array` by JAX's own instance check (not a subclass): JAX's
    # objects run no user code
    return issubclass(kind, _TRACER) and isinstance(obj, kinds)


_TRACER = jax.core.Tracer


class Gone(Exception):
    """The value a chain led to is no longer there (the step's state changed shape)."""


_SEQUENCES = (list, tuple, collections.deque)


def is_container(obj: Any) -> bool:
    """A built-in list, tuple, deque or dict (or a subclass), or a mapping proxy of a dict.

    >>> is_container(types.MappingProxyType({"w": 1})), is_container("text")
    (True, False)
    """
    if is_a(obj, (*_SEQUENCES, dict)):
        return True
    return type(obj) is types.MappingProxyType and is_a(_mapped(obj), dict)


def items(obj: Any) -> list[tuple[Any, Any]]:
    """``(key, value)`` of a container `is_container` accepts, read by the built-in type.

    >>> class Lazy(dict):
    ...     def __iter__(self):
    ...         raise RuntimeError("user code")
    >>> items(Lazy(w=1))
    [('w', 1)]
    """
    if is_a(obj, dict):
        return list(dict.items(obj))
    for base in _SEQUENCES:
        if is_a(obj, base):
            return list(enumerate(base.__iter__(obj)))  # type: ignore[arg-type]
    return list(dict.items(_mapped(obj)))


def item(obj: Any, key: Any) -> Any:
    """``obj[key]`` by the built-in container's own lookup (not a subclass's)."""
    kind = type(obj)
    if kind is dict or kind is list or kind is tuple:  # the built-in itself: its own lookup
        return obj[key]
    for base in (dict, *_SEQUENCES):
        if is_a(obj, base):
            return base.__getitem__(obj, key)  # type: ignore[operator,index]
    if type(obj) is types.MappingProxyType:
        return dict.__getitem__(_mapped(obj), key)
    raise Gone("not a container any more")


def _mapped(proxy: types.MappingProxyType) -> Any:
    """The mapping behind a ``MappingProxyType`` (it has no attribute for it)."""
    refs = gc.get_referents(proxy)
    return refs[0] if len(refs) == 1 else None


def type_lookup(cls: type, name: str) -> Any:
    """``name`` as the class (or a base) defines it, without running any of its code."""
    for klass in cls.__mro__:
        found = klass.__dict__.get(name, _MISSING)
        if found is not _MISSING:
            return found
    return None


_MISSING = object()


def _lookup(cls: type, name: str) -> Any:
    """`type_lookup`, `_MISSING` where no class defines ``name`` (not None)."""
    for klass in cls.__mro__:
        found = klass.__dict__.get(name, _MISSING)
        if found is not _MISSING:
            return found
    return _MISSING


def instance_dict(obj: Any) -> dict | None:
    """``obj.__dict__`` through the interpreter's own descriptor; None where the class
    has none or defines ``__dict__`` itself (a property of a proxy: user code).

    >>> class Proxy:
    ...     @property
    ...     def __dict__(self):
    ...         raise RuntimeError("user code")
    >>> instance_dict(Proxy()) is None
    True
    """
    cls = type(obj)
    # (the table read inline: this runs for every attribute of the state on every call)
    found = _DESCRIPTORS.table.get(id(cls))
    descr = found[1] if found is not None and found[0]() is cls else _DESCRIPTORS(cls)
    if descr is None:
        return None
    own = descr.__get__(obj, cls)
    return own if type(own) is dict else None


def _dict_descriptor(cls: type) -> Any:
    """The interpreter's own ``__dict__`` accessor of ``cls`` (a module's is a member),
    None where it has none or defines ``__dict__`` itself."""
    descr = type_lookup(cls, "__dict__")
    if type(descr) not in (types.GetSetDescriptorType, types.MemberDescriptorType):
        return None
    return descr


class PerType:
    """``compute(cls)`` per class, computed once and kept while the class lives: by the
    class's id with a weak reference to it (a lookup runs none of its code, and no class
    is kept alive by what was computed about it).

    >>> kinds = PerType(lambda cls: cls.__name__.upper())
    >>> kinds(dict), kinds(dict)
    ('DICT', 'DICT')
    """

    def __init__(self, compute: Any) -> None:
        self._compute = compute
        # id(class) -> (a weak reference to it, its value): read inline where a call
        # costs (`instance_dict`), as `__call__` reads it
        self.table: dict[int, tuple[weakref.ref, Any]] = {}

    def __call__(self, cls: type) -> Any:
        found = self.table.get(id(cls))
        if found is not None and found[0]() is cls:
            return found[1]
        value = self._compute(cls)
        key = id(cls)
        try:
            ref = weakref.ref(cls, lambda r: self._forget(key, r))
        except TypeError:  # a class that cannot be weakly referenced: computed each time
            return value
        self.table[key] = (ref, value)
        return value

    def _forget(self, key: int, ref: weakref.ref) -> None:
        found = self.table.get(key)
        if found is not None and found[0] is ref:  # not a newer class with the same id
            del self.table[key]


_DESCRIPTORS = PerType(_dict_descriptor)  # (each class's own ``__dict__`` accessor)


def safe_getattr(obj: Any, name: str) -> Any:
    """``obj.name`` where it is a plain value: the instance's own (or a slot's), else the
    class's data; AttributeError where reading it would run code (a property, a
    ``__getattr__``)."""
    if is_a(obj, type):
        found = _lookup(obj, name)
        if found is _MISSING or hasattr(type(found), "__get__"):
            raise AttributeError(name)
        return found
    own = instance_dict(obj)
    if own is not None and name in own:
        return own[name]
    found = _lookup(type(obj), name)
    if type(found) is types.MemberDescriptorType:  # a slot (raises if unset)
        return found.__get__(obj, type(obj))
    if found is _MISSING or hasattr(type(found), "__get__"):
        raise AttributeError(name)
    return found  # class data (``None`` included: a dataclass field's default)
