"""What makes two Python functions the same step, for the caches keyed on a step.

A step function defined inside each call of a method (orbit's ``def train_fn(state,
inputs)``) is a new function object every call; jaxdist's caches (the compiled steps,
the traces of `jaxdist._state.stage`) must still find it. `function_key` says when two
functions are the same step: the same code over the same captures, arrays and Python
scalars among them by type only (they are state, read afresh); `captured_ids` is the
captures' part, which a trace checks on every call. `jaxdist._state.watch` compares a
function it watches the same way. Apart from the watch because it is about the
identity of a function, not about the values its state holds.

>>> def make(k):
...     return lambda x: x * k
>>> captured_ids(make(2.0)) == captured_ids(make(3.0))
True
>>> captured_ids(make(2.0), strict=True) == captured_ids(make(3.0), strict=True)
False
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxdist._state import peek as _peek


def function_key(fn: Callable, strict: bool = False, depth: int = 0) -> tuple:
    """What makes two Python functions the same step: their code, their globals and
    what they capture (closure cells, defaults), functions among them compared the same
    way, other objects by identity; arrays and Python scalars by type only unless
    ``strict`` (they are state, read afresh). A function defined inside each call of a
    method (orbit's ``def train_fn(state, inputs)``) is then the same step every call.

    >>> def make(k):
    ...     def inner(x):
    ...         return x * k
    ...     return lambda x: inner(x) + 1
    >>> function_key(make(2.0)) == function_key(make(3.0))
    True
    >>> function_key(make(2.0), strict=True) == function_key(make(3.0), strict=True)
    False
    """
    fn = getattr(fn, "__func__", fn)
    cells = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            cells.append(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    held = cells + list(getattr(fn, "__defaults__", None) or ())
    code = getattr(fn, "__code__", None)
    globs = getattr(fn, "__globals__", None)
    return (code, id(globs), tuple(_captured_key(v, strict, depth) for v in held))


def captures_nothing(fn: Callable) -> bool:
    """Whether ``fn`` has no closure cells and no defaults: its `captured_ids` is then
    ``()`` without computing it (the check of a replayed call; a bound method's object is
    not a capture, as in `function_key`).

    >>> captures_nothing(lambda x: x), captures_nothing(lambda x, k=2: x * k)
    (True, False)
    """
    f = fn.__func__ if type(fn) is types.MethodType else fn
    return getattr(f, "__closure__", None) is None and not getattr(f, "__defaults__", None)


def _captured_key(value: Any, strict: bool, depth: int) -> Any:
    if not strict and _peek.is_a(value, _FRESH):
        return type(value)
    if depth >= _MAX_DEPTH:
        return id(value)
    if type(value) is types.FunctionType:
        return function_key(value, strict, depth + 1)
    if type(value) is types.MethodType:  # ``t.step`` is a new object at every access
        return (function_key(value.__func__, strict, depth + 1), id(value.__self__))
    return id(value)


_FRESH = (jax.Array, np.ndarray, np.generic, int, float, complex, bool, str, type(None))
_MAX_DEPTH = 8  # functions inside functions compared by code; deeper ones by identity


def captured_ids(fn: Callable, strict: bool = False) -> tuple:
    """What a function captures (closure cells, default arguments): functions by their
    code and captures, other objects by identity; arrays and Python scalars by type
    only unless ``strict`` (they are read afresh). See `function_key`."""
    return function_key(fn, strict)[2]
