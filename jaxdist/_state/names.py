"""The names a step's code uses: which globals it loads, and which attributes it reads.

`jaxdist._state.capture` walks from a step to its state along these names first and trusts
a path through them over another; `jaxdist._state.watch` compares only the Python values
found under them. The names come from the code objects (``co_names`` and the global
load instructions), those of nested code and those of the methods and properties
the code calls on the objects met.
"""

from __future__ import annotations

import dis
import functools
import operator
import os
import sys
import sysconfig
import types
from collections.abc import Iterator
from typing import Any

from jaxdist._state import peek as _peek


@functools.lru_cache(maxsize=1024)
def global_names(code: types.CodeType) -> frozenset[str]:
    """The globals a code object (and the code nested in it) reads: the names of its
    global loads, not its attribute names (``model.params`` does not read a global
    ``params``).

    >>> def step(x):
    ...     return model.params["w"] + x
    >>> sorted(global_names(step.__code__))
    ['model']
    """
    names = {i.argval for i in dis.get_instructions(code) if i.opname in _GLOBAL_OPS}
    for c in code.co_consts:
        if _peek.is_a(c, types.CodeType):
            names |= global_names(c)
    return frozenset(names)


_GLOBAL_OPS = ("LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL")


def _code_names(code: types.CodeType) -> set[str]:
    """Its names, and the strings it holds that could be names (``getattr(t, "lr")``,
    ``vars(t)["lr"]``, ``operator.attrgetter("lr")``)."""
    names = set(code.co_names)
    for c in code.co_consts:
        if _peek.is_a(c, types.CodeType):
            names |= _code_names(c)
        elif _peek.is_a(c, str) and c.isidentifier():
            names.add(c)
    return names


@functools.lru_cache(maxsize=1024)
def imported_modules(code: types.CodeType) -> frozenset[str]:
    """The modules a code object (and the code nested in it) imports when it runs
    (``import config`` inside the step; ``from pkg import config`` gives ``pkg`` and
    ``pkg.config``).

    >>> def step():
    ...     import json
    ...     from os import path
    ...     return json, path
    >>> sorted(imported_modules(step.__code__))
    ['json', 'os', 'os.path']
    """
    out: set[str] = set()
    module = None
    for i in dis.get_instructions(code):
        if i.opname == "IMPORT_NAME":
            module = i.argval
            out.add(module)
        elif i.opname == "IMPORT_FROM" and module is not None:
            out.add(f"{module}.{i.argval}")
    for c in code.co_consts:
        if _peek.is_a(c, types.CodeType):
            out |= imported_modules(c)
    return frozenset(out)


@functools.lru_cache(maxsize=1024)
def code_names(code: types.CodeType) -> frozenset[str]:
    """The global and attribute names a code object (and the code nested in it) uses;
    `BY_TREE` among them when it calls tree functions; where it is the program's own
    code (not the standard library, an installed package or jaxdist), `BY_NAME` when it
    reads attributes by a computed name, and the attributes it may find absent after
    `PROBE` (`probed`)."""
    names = _code_names(code)
    if _users(code.co_filename):  # (a library's probes are no state of the program's)
        names |= {PROBE + n for n in _probed(code)}
        if reads_by_name(code):
            names.add(BY_NAME)
    if names & _TREE_FUNCTIONS:
        names.add(BY_TREE)
    return frozenset(names)


BY_NAME = "<by name>"  # not an identifier: never an attribute's name
# before a name: an attribute the code may find absent (`probed`)
PROBE = "<probe>"


def _probed(code: types.CodeType) -> set[str]:
    """The attributes a code object (or the code nested in it) may find absent: the
    names it gives ``hasattr`` or ``getattr`` (``if not hasattr(self, "acc")``,
    ``getattr(self, "bias", None)``), and the attributes it reads where it catches
    ``AttributeError``. A trace that found one absent depends on its absence.

    >>> def step(self):
    ...     return getattr(self, "bias", None)
    >>> sorted(_probed(step.__code__))
    ['bias']
    """
    out: set[str] = set()
    if {"hasattr", "getattr"} & set(code.co_names):
        out |= {c for c in code.co_consts if _peek.is_a(c, str) and c.isidentifier()}
    if "AttributeError" in code.co_names:
        out |= set(code.co_names)
    for c in code.co_consts:
        if _peek.is_a(c, types.CodeType):
            out |= _probed(c)
    return out


def probed(named: set[str]) -> set[str]:
    """The attributes that the code whose names ``named`` gathered may find absent."""
    return {n[len(PROBE) :] for n in named if n.startswith(PROBE)}


# the code calls tree functions (``jax.tree.leaves(hp)``): every field of a pytree node
# it reaches by a name it uses may be read
BY_TREE = "<by tree>"
_TREE_FUNCTIONS = frozenset(
    ("tree", "tree_util", "tree_leaves", "tree_map", "tree_flatten", "tree_reduce", "leaves")
)


def _users(filename: str) -> bool:
    """A file of the user's program: not an installed package, the standard library
    or jaxdist itself."""
    if "site-packages" in filename or "dist-packages" in filename:
        return False
    if filename.startswith("<frozen "):  # the standard library's frozen modules (abc, os)
        return False
    return not filename.startswith((_PACKAGE, _STDLIB))


# jaxdist's folder, wherever in it this module is
_PACKAGE = os.path.dirname(os.path.abspath(sys.modules[__name__.partition(".")[0]].__file__ or ""))


_STDLIB = sysconfig.get_paths()["stdlib"]


def users_code(code: types.CodeType) -> bool:
    """Code of the user's program (`_users`)."""
    return _users(code.co_filename)


def users_function(fn: types.FunctionType) -> bool:
    """A function of the user's program (`_users`)."""
    return _users(fn.__code__.co_filename)


def users_class(cls: type) -> bool:
    """A class of the user's program (`_users`), a notebook's included."""
    module = sys.modules.get(cls.__module__)
    filename = getattr(module, "__file__", None) if module is not None else None
    if filename is not None:
        return _users(filename)
    if cls.__module__ == "__main__":  # a notebook's or an interactive session's
        return True
    if cls.__module__ == "builtins" and cls.__flags__ & _HEAPTYPE:  # a ``class`` statement
        return True  # run by ``exec`` in a namespace without ``__name__``
    function = _a_function(cls)  # made by ``exec``'d code: its module names no file
    return function is not None and users_function(function)


_HEAPTYPE = 1 << 9  # ``Py_TPFLAGS_HEAPTYPE``: a class made at run time, not one of C's own


def _a_function(cls: type) -> types.FunctionType | None:
    for value in list(vars(cls).values()):
        if isinstance(value, (classmethod, staticmethod)):
            value = value.__func__
        if isinstance(value, types.FunctionType):
            return value
    return None


def builtin_class(cls: type) -> bool:
    """A class of Python's own (``int``, ``dict``): not one the program defines. A class
    that code run by ``exec`` in a namespace without ``__name__`` made says its module is
    "builtins" too; it is a heap type, made at run time, where Python's own are not.

    >>> builtin_class(dict), builtin_class(type("T", (), {}))
    (True, False)
    """
    if cls.__module__ != "builtins":
        return False
    return not cls.__flags__ & _HEAPTYPE


def add_held_name(value: str, chain: tuple, named: set[str], is_named: Any) -> None:
    """Adds to ``named`` a string the code holds under names it uses (a global
    ``NAME = "lr"``, ``self.key``, a default argument): the code may read an
    attribute by it (``getattr(t, NAME)``)."""
    if value.isidentifier() and value not in named and is_named(chain, named):
        named.add(value)


@functools.lru_cache(maxsize=1024)
def reads_by_name(code: types.CodeType) -> bool:
    """Whether a code object (or the code nested in it) reads attributes by a name
    it computes: it calls ``getattr``, ``vars`` or ``operator.attrgetter``, or reads
    ``__dict__``. Then any attribute of an object it reaches may be one it reads.

    >>> def step(t, name):
    ...     return getattr(t, name)
    >>> reads_by_name(step.__code__)
    True
    """
    if set(code.co_names) & _BY_NAME:
        return True
    return any(_peek.is_a(c, types.CodeType) and reads_by_name(c) for c in code.co_consts)


_BY_NAME = frozenset(("getattr", "vars", "attrgetter", "__dict__"))


def add_names(obj: Any, named: set[str], closed: dict | None = None) -> None:
    """Adds to ``named`` the names a function's code uses, or those of ``obj``'s methods
    that ``named`` names. ``closed``: the classes whose methods' names were added, by the
    size ``named`` had then (one walk's; ``named`` only grows, so a class asked again
    while it has that size adds nothing: a Keras model's walk meets thousands of objects
    of a few dozen classes)."""
    if _peek.is_a(obj, types.FunctionType):
        named |= code_names(obj.__code__)
    elif type(obj) in (operator.attrgetter, operator.methodcaller):
        named |= _getter_names(obj)
    else:
        cls = obj if _peek.is_a(obj, type) else type(obj)
        if closed is not None and closed.get(cls) == len(named):
            return
        _add_method_names(cls, named)
        if closed is not None:
            closed[cls] = len(named)


def _getter_names(getter: Any) -> set[str]:
    """The attribute names an ``operator.attrgetter`` (``"lr"``, ``"opt.lr"``) or the
    method name an ``operator.methodcaller`` made anywhere reads (its C-level
    ``__reduce__``: no user code).

    >>> sorted(_getter_names(operator.attrgetter("lr", "opt.beta")))
    ['beta', 'lr', 'opt']
    """
    reduced = getter.__reduce__()
    args = reduced[1] if type(getter) is operator.attrgetter else (getter.__reduce__()[1][:1])
    if type(reduced[0]) is functools.partial:  # a methodcaller with keyword arguments
        args = reduced[0].args[:1]
    names = {part for a in args if type(a) is str for part in a.split(".")}
    return {n for n in names if n.isidentifier()}


def _add_method_names(cls: type, named: set[str]) -> None:
    """Adds to ``named`` the names used by the methods and properties of ``cls`` that
    ``named`` names (``self.scale()`` reading ``self.lr``), until none is new."""
    methods = _methods(cls)
    todo = [*(methods.keys() & named), *_syntax_methods_of(cls)]
    while todo:
        new = methods[todo.pop()] - named
        named |= new
        todo += [m for m in new if m in methods]


def _syntax_methods(cls: type) -> tuple[str, ...]:
    """The methods of ``cls`` (`_methods`) Python calls for syntax (`by_syntax`)."""
    return tuple(m for m in _methods(cls) if by_syntax(m))


_syntax_methods_of = _peek.PerType(_syntax_methods)


def by_syntax(name: str) -> bool:
    """A method Python calls for syntax on an object (``t.fn(x)``: ``__call__``; ``a +
    b``: ``__add__``; ``v[i]``: ``__getitem__``), not by a name the code uses.

    >>> by_syntax("__call__"), by_syntax("__radd__"), by_syntax("__init__")
    (True, True, False)
    """
    if name in _SYNTAX:
        return True
    return name[:3] in ("__r", "__i") and f"__{name[3:]}" in _SYNTAX


# (not the comparisons: a dataclass's generated ``__eq__`` names every field, and a step
# compares numbers, not its state's objects)
_SYNTAX = frozenset(
    f"__{n}__"
    for n in (
        "call getitem contains len iter next bool float int index array jax_array "
        "add sub mul truediv floordiv mod pow matmul lshift rshift and or xor "
        "neg pos abs invert enter exit"
    ).split()
)


def _methods(cls: type) -> dict[str, frozenset[str]]:
    """The names each Python method or property of ``cls`` uses, with those of the base's
    definition where it calls ``super()`` (``super().step(x)`` runs the base's ``step``),
    and of the program's functions a decorator wraps (``functools.wraps``: ``__wrapped__``;
    a library's wrapped methods are read by the wrapper's names, as before) (kept while
    ``cls`` lives)."""
    return _methods_of(cls)


def _method_names(cls: type) -> dict[str, frozenset[str]]:
    out: dict[str, frozenset[str]] = {}
    for _, name, _, _, fs in definitions(cls):
        for f in fs[:1] + [f for f in fs[1:] if users_function(f)]:
            out[name] = out.get(name, frozenset()) | code_names(f.__code__)
    return out


def definitions(cls: type) -> Iterator[tuple[type, str, int, Any, list[types.FunctionType]]]:
    """``(class, name, k, target, functions)`` for the definitions of each method or
    property along ``cls``'s MRO that a call of it runs: the first, and the next one each
    time the one before calls ``super()``; ``k`` counts every definition of ``name``
    before it (the key of `jaxdist._state.chains.method`), ``target`` is what it runs
    (`method_function`), ``functions`` its Python functions (`functions`)."""
    count: dict[str, int] = {}
    chained: dict[str, bool] = {}  # whether the last definition met calls super()
    for klass in cls.__mro__[:-1]:
        if builtin_class(klass):
            continue
        for name, attr in list(vars(klass).items()):
            k = count[name] = count.get(name, -1) + 1
            if k and not chained.get(name):
                continue
            target = method_function(attr)
            fs = functions(target)
            chained[name] = any("super" in f.__code__.co_names for f in fs)
            yield klass, name, k, target, fs


def method_function(attr: Any) -> Any:
    """What a class attribute runs when called or read: a property's getter, a static
    or class method's function; ``attr`` itself otherwise (a function, a decorated
    callable such as a ``jd.function``)."""
    if type(attr) is types.FunctionType:  # (the common case first: each call reads it)
        return attr
    if _peek.is_a(attr, property):
        return attr.fget
    if _peek.is_a(attr, (staticmethod, classmethod)):
        return attr.__func__
    return attr


def wrapped(obj: Any) -> Any:
    """The function a ``functools.wraps`` decorator wraps (``obj.__wrapped__``, from the
    instance dictionary: no user code), None if none."""
    own = _peek.instance_dict(obj)
    return None if own is None else own.get("__wrapped__")


def functions(obj: Any) -> list[types.FunctionType]:
    """The Python functions ``obj`` runs: itself, and what it wraps, at any depth.

    >>> inner = lambda x: x
    >>> outer = functools.wraps(inner)(lambda x: inner(x))
    >>> functions(outer) == [outer, inner]
    True
    """
    out: list[types.FunctionType] = []
    for _ in range(16):  # (a chain of wrappers; one that wraps itself ends here)
        if obj is None:
            break
        if _peek.is_a(obj, types.FunctionType):
            out.append(obj)
        obj = obj.__func__ if _peek.is_a(obj, types.MethodType) else wrapped(obj)
    return out


_methods_of = _peek.PerType(_method_names)
