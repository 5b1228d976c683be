"""Argument checks written once: every public method raises the same clear errors.

Each check names the argument, what was expected and what was got, and is
called before any work starts.
"""

from __future__ import annotations

import enum
import functools
import types
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

E = TypeVar("E", bound=enum.Enum)


def is_int(x: Any) -> bool:
    """True for Python and NumPy integers (bools excluded)."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def is_number(x: Any) -> bool:
    """True for Python and NumPy numbers (bools excluded): what `Strategy.run` traces."""
    return isinstance(x, (int, float, complex, np.number)) and not isinstance(x, (bool, np.bool_))


def hashable_arg(value: Any, index: int) -> Any:
    """A static (non-array) argument of `Strategy.run`, which must be hashable."""
    try:
        hash(value)
    except TypeError:
        raise TypeError(
            f"strategy.run arguments must be arrays, numbers, distributed values or "
            f"hashable Python objects; leaf {index} is an unhashable "
            f"{type(value).__name__}. Convert it to an array or close over it in fn."
        ) from None
    return value


def check_callable(value: Any, name: str, expected: str = "callable") -> None:
    if not callable(value):
        raise TypeError(f"{name} must be {expected}; got {type(value).__name__}.")


def check_int(value: Any, name: str, minimum: int | None = None) -> int:
    """``value`` as an int; `TypeError` if it is not one, `ValueError` below ``minimum``."""
    if not is_int(value):
        raise TypeError(f"{name} must be an int; got {type(value).__name__} {value!r}.")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}; got {value!r}.")
    return int(value)


def check_axis(axis: Any, name: str = "axis", allow_none: bool = False) -> None:
    if axis is None and allow_none:
        return
    if not is_int(axis):
        expected = "an int or None" if allow_none else "an int"
        raise TypeError(f"{name} must be {expected}; got {type(axis).__name__} {axis!r}.")


def check_fn_args(fn: Any, args: Any, kwargs: Any, fn_name: str = "fn") -> None:
    """The checks of ``run(fn, args, kwargs)`` and ``merge_call(merge_fn, args, kwargs)``."""
    check_callable(fn, fn_name)
    if not isinstance(args, (tuple, list)):
        raise TypeError(
            f"args must be a tuple or list of positional arguments; got {type(args).__name__}. "
            "For one argument write args=(x,)."
        )
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"kwargs must be a dict or None; got {type(kwargs).__name__}.")
    for key in kwargs or {}:
        if not isinstance(key, str):
            raise TypeError(
                f"kwargs must map argument names (str) to values; got the key "
                f"{type(key).__name__} {key!r}."
            )


def check_instance(value: Any, types: type | tuple, name: str, expected: str) -> None:
    """`TypeError` unless ``value`` is an instance of ``types`` (None is not accepted)."""
    if not isinstance(value, types):
        raise TypeError(f"{name} must be {expected}; got {type(value).__name__} {value!r}.")


def check_optional(value: Any, types: type | tuple, name: str, expected: str) -> None:
    """Like `check_instance`, but None is accepted."""
    if value is not None:
        check_instance(value, types, name, f"{expected} or None")


def enum_member(value: Any, enum_cls: type[E], name: str) -> E:
    """The member of ``enum_cls`` named by ``value`` (a member, or its name in any case)."""
    if isinstance(value, enum_cls):
        return value
    if isinstance(value, str) and value.upper() in enum_cls.__members__:
        return enum_cls[value.upper()]
    names = ", ".join(enum_cls.__members__)
    raise ValueError(f"{name} must be a {enum_cls.__name__} ({names}); got {value!r}.")


def check_bool(value: Any, name: str) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool; got {type(value).__name__} {value!r}.")


_FUNCTIONS = (types.FunctionType, types.MethodType, types.BuiltinFunctionType)


def describe(fn: Callable) -> str:
    """A short name of a user function for messages (a callable object's own ``__qualname__``
    or ``__name__``, else its class's: its ``__getattr__`` and ``__repr__`` never run).

    >>> class Step:
    ...     def __getattr__(self, name):
    ...         raise RuntimeError("user code")
    ...     def __call__(self, x):
    ...         return x
    >>> import functools
    >>> describe(describe), describe(Step()), describe(functools.partial(describe))
    ('describe', 'Step object', 'functools.partial(describe)')
    """
    if type(fn) in _FUNCTIONS:
        return fn.__qualname__
    for name in ("__qualname__", "__name__"):
        try:  # (the generic lookup: no ``__getattr__`` fallback)
            found = object.__getattribute__(fn, name)
        except Exception:  # noqa: BLE001 - not there, or a descriptor that failed
            continue
        if isinstance(found, str) and found:
            return found
    if isinstance(fn, functools.partial):  # (its function: no code of the partial runs)
        return f"functools.partial({describe(fn.func)})"
    kind = type(fn)
    return f"{kind.__qualname__} object" if kind.__flags__ & _HEAP else repr(fn)


_HEAP = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement (not a built-in)
