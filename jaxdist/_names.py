"""The names a step's code uses: which globals it loads, and which attributes it reads.

`jaxdist._capture` walks from a step to its state along these names first and trusts
a path through them over another; `jaxdist._watch` compares only the Python values
found under them. The names come from the code objects (``co_names`` and the global
load instructions), those of nested code and those of the methods and properties
the code calls on the objects met.
"""

from __future__ import annotations

import dis
import functools
import types
import weakref
from typing import Any


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
        if isinstance(c, types.CodeType):
            names |= global_names(c)
    return frozenset(names)


_GLOBAL_OPS = ("LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL")


def _code_names(code: types.CodeType) -> set[str]:
    """Its names, and the strings it holds that could be names (``getattr(t, "lr")``,
    ``vars(t)["lr"]``, ``operator.attrgetter("lr")``)."""
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _code_names(c)
        elif isinstance(c, str) and c.isidentifier():
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
        if isinstance(c, types.CodeType):
            out |= imported_modules(c)
    return frozenset(out)


@functools.lru_cache(maxsize=1024)
def code_names(code: types.CodeType) -> frozenset[str]:
    """The global and attribute names a code object (and the code nested in it) uses."""
    return frozenset(_code_names(code))


def add_names(obj: Any, named: set[str]) -> None:
    """Adds to ``named`` the names a function's code uses, or those of ``obj``'s methods
    that ``named`` names."""
    if isinstance(obj, types.FunctionType):
        named |= code_names(obj.__code__)
    else:
        _add_method_names(obj, named)


def _add_method_names(obj: Any, named: set[str]) -> None:
    """Adds to ``named`` the names used by the methods and properties of ``obj``'s class
    that ``named`` names (``self.scale()`` reading ``self.lr``), until none is new."""
    methods = _methods(obj if isinstance(obj, type) else type(obj))
    todo = [m for m in methods if m in named]
    while todo:
        new = methods[todo.pop()] - named
        named |= new
        todo += [m for m in new if m in methods]


def _methods(cls: type) -> dict[str, frozenset[str]]:
    """The names each Python method or property of ``cls`` uses (kept while ``cls`` lives)."""
    try:
        return _METHODS[cls]
    except (KeyError, TypeError):
        pass
    out: dict[str, frozenset[str]] = {}
    for klass in reversed(cls.__mro__[:-1]):
        if klass.__module__ == "builtins":
            continue
        for name, attr in list(vars(klass).items()):
            if isinstance(attr, property):
                attr = attr.fget
            elif isinstance(attr, (staticmethod, classmethod)):
                attr = attr.__func__
            if isinstance(attr, types.FunctionType):
                out[name] = code_names(attr.__code__)
    try:
        _METHODS[cls] = out
    except TypeError:  # not weakly referenceable
        pass
    return out


_METHODS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
