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
import weakref
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxdist._state import chains as _chains
from jaxdist._state import peek as _peek
from jaxdist._state.chains import StepArguments, step_of


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
    fn = step_of(fn)  # (a call's root with its argument objects: its step)
    fn = fn.__func__ if type(fn) is types.MethodType else fn
    if type(fn) is not types.FunctionType:  # (a callable object: no user attribute is read)
        return (None, id(None), ())
    cells = []
    for cell in fn.__closure__ or ():
        try:
            cells.append(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    held = cells + list(fn.__defaults__ or ())
    return (fn.__code__, id(fn.__globals__), tuple(_captured_key(v, strict, depth) for v in held))


def captures_nothing(fn: Callable) -> bool:
    """Whether ``fn`` has no closure cells and no defaults: its `captured_ids` is then
    ``()`` without computing it (the check of a replayed call; a bound method's object is
    not a capture, as in `function_key`).

    >>> captures_nothing(lambda x: x), captures_nothing(lambda x, k=2: x * k)
    (True, False)
    """
    f = step_of(fn)  # (a call's root with its argument objects: its step)
    f = f.__func__ if type(f) is types.MethodType else f
    if type(f) is not types.FunctionType:  # (a callable object: none, no user code run)
        return True
    return f.__closure__ is None and not f.__defaults__


def _captured_key(value: Any, strict: bool, depth: int) -> Any:
    kind = type(value)
    if kind is types.FunctionType:  # (the common captures first: each call compares them)
        return function_key(value, strict, depth + 1) if depth < _MAX_DEPTH else id(value)
    how = _by_kind(kind)
    if how is not _LOOK:  # (what the checks below give for any value of its type)
        return kind if how is _TYPE and not strict else id(value)
    if not strict and _peek.is_a(value, _FRESH):
        return kind
    if depth >= _MAX_DEPTH:
        return id(value)
    if kind is types.MethodType:  # ``t.step`` is a new object at every access
        return (function_key(value.__func__, strict, depth + 1), id(value.__self__))
    if not strict:  # a small tuple, dict, set or dataclass of fresh values: by its structure
        if kind in (set, frozenset) and len(value) <= _SMALL:  # (its members: watched)
            if all(_peek.is_a(v, _FRESH) for v in value):
                return kind
        items = _small_items(value)
        if items is not None:
            keys = tuple((k, _captured_key(v, strict, depth + 1)) for k, v in items)
            if all(type(key) is not int for _, key in keys):  # (an object in it: identity)
                return (kind, keys)
    return id(value)


_FRESH = (jax.Array, np.ndarray, np.generic, int, float, complex, bool, str, type(None))
# what `_captured_key` gives a value of a type, where the type alone decides it: its type
# (`_FRESH`: an array or number, read afresh), its identity (an object), or _LOOK (a
# function, a method, a set, a tuple, a dict or a dataclass object is looked into; a JAX
# tracer is a `jax.Array` by JAX's instance check, per value); looked up once per type
_TYPE, _IDENTITY, _LOOK = "type", "identity", "look"


def _kind_key(kind: type) -> str:
    """`_TYPE`, `_IDENTITY` or `_LOOK` for the values of ``kind``."""
    if (
        issubclass(kind, (jax.core.Tracer, set, frozenset, tuple))
        or kind in (types.FunctionType, types.MethodType, dict)
        or _dataclass_fields(kind) is not None
    ):
        return _LOOK
    return _TYPE if issubclass(kind, _FRESH) else _IDENTITY


_by_kind = _peek.PerType(_kind_key)


_SMALL = 16  # entries of a tuple, dict or dataclass compared by structure; a larger: identity


def _small_items(value: Any) -> list | None:
    """``[(key, entry)]`` of a tuple (a namedtuple's too), a dict or a dataclass object of
    at most `_SMALL` entries, read without running its code; None for anything else.

    Such a value in a closure cell or a default argument, made anew between calls
    (``cfg = cfg._replace(lr=...)``, ``state = {"w": w, "lr": lr}``), is the same capture
    when its structure is: the arrays and numbers in it are read afresh, the Python values
    the trace depends on watched (`jaxdist._state.watch`)."""
    kind = type(value)
    if kind is tuple or (_peek.is_a(value, tuple) and _peek.type_lookup(kind, "_fields")):
        return list(enumerate(tuple.__iter__(value))) if len(value) <= _SMALL else None
    if kind is dict:
        return list(dict.items(value)) if len(value) <= _SMALL else None
    fields = _dataclass_fields(kind)
    if fields is not None and len(fields) <= _SMALL:  # its fields (not what it caches)
        own = _peek.instance_dict(value) or {}
        if all(name in own for name in fields):
            return [(name, own[name]) for name in fields]
    return None


_MAX_DEPTH = 8  # functions inside functions compared by code; deeper ones by identity


def _fields_of(kind: type) -> dict | None:
    fields = _peek.type_lookup(kind, "__dataclass_fields__")
    return fields if type(fields) is dict else None


# a class's dataclass fields (None: not a dataclass), looked up once per class
_dataclass_fields = _peek.PerType(_fields_of)


def captured_ids(fn: Callable, strict: bool = False) -> tuple:
    """What a function captures (closure cells, default arguments): functions by their
    code and captures, other objects by identity; arrays and Python scalars by type
    only unless ``strict`` (they are read afresh). See `function_key`."""
    return function_key(fn, strict)[2]


class KeyWatch:
    """Whether a function's `function_key` (its `captured_ids` with ``captures``) is no
    longer ``key``, on every call of a step: the answer for the function objects it was
    last found for, while they hold the same code and the same captures (by identity;
    arrays and numbers by type unless ``strict``), is kept, so that the key is not built
    again on each call. Functions are held weakly, objects among the captures too (a
    capture that cannot be: the key is built each time).

    >>> def make(k):
    ...     return lambda x: x * k
    >>> f = make(2.0)
    >>> watch = KeyWatch(function_key(f))
    >>> watch.differs(f), watch.differs(make(3.0)), watch.differs(lambda x: x)
    (False, False, True)
    """

    __slots__ = ("key", "strict", "captures", "written", "held", "_stamped")

    def __init__(self, key: Any, strict: bool = False, captures: bool = False) -> None:
        self.key, self.strict, self.captures = key, strict, captures
        self.written: Any = None  # the key as the step's last call left it (`rewrite`)
        # whether a function is the one last found with the same captures (generated)
        self.held: Callable[[Any], bool] | None = None
        self._stamped = 0

    def rewrite(self, fn: Callable) -> None:
        """Takes ``fn``'s key now as the one its step's last call wrote (a capture it
        assigned: ``nonlocal log; log = [*log, x]``): that key fits too."""
        key = function_key(fn, self.strict)  # (a root's or a method's function's)
        self.written = key[2] if self.captures else key

    def differs(self, fn: Callable) -> bool:
        """Whether ``fn``'s key (its captures' with ``captures``) differs from `key`."""
        f = fn.func if type(fn) is StepArguments else fn  # (`step_of`, inline: every call)
        f = f.__func__ if type(f) is types.MethodType else f
        held = self.held
        if held is not None and held(f):
            return False
        return self.built_differs(f)

    def built_differs(self, f: Any) -> bool:
        """`differs` for the function ``f`` itself, its key built (the kept answer did
        not hold: another function, or other captures)."""
        stamp = None
        if self._stamped < _RESTAMPS:  # (a function made anew on each call: not kept)
            self._stamped += 1
            stamp = _stamp(f, self.strict)  # (before the key: what the key was built from)
        key = function_key(f, self.strict)
        now = key[2] if self.captures else key
        if now != self.key and (self.written is None or now != self.written):
            return True
        if stamp is not None and stamp(f):  # (nothing changed while the key was built)
            self.held = stamp
        return False


_RESTAMPS = 4
_HELD_KINDS = (int, float, complex, bool, str, type(None))  # (no user object in them)


def _stamp(f: Any, strict: bool) -> Callable[[Any], bool] | None:
    """A function telling whether its argument is ``f`` still made of what `function_key`
    read of it now (its code; its captures: the same objects, held weakly, or arrays and
    numbers of the same types unless ``strict``; functions among them the same way),
    generated as one statement per capture; None where that cannot be told by identity
    (a tuple, dict, set or dataclass captured, a method, an empty cell)."""
    names: dict[str, Any] = {}
    lines: list[str] = []
    if not _stamp_lines(f, "f0", strict, 0, names, lines):
        return None
    body = "".join(f"        {line}\n" for line in lines)
    source = f"def held(f0):\n    try:\n{body}    except Exception:\n        return False\n"
    exec(_chains.compiled(source + "    return True\n", "<jaxdist.state.keys>"), names)  # noqa: S102
    return names["held"]


def _stamp_lines(f: Any, here: str, strict: bool, depth: int, names: dict, lines: list) -> bool:
    """`_stamp`'s statements for the function ``f`` at the local ``here``; False if none."""
    if type(f) is not types.FunctionType:
        return False
    n = len(names)
    try:
        held = [cell.cell_contents for cell in f.__closure__ or ()]
    except ValueError:  # an empty cell
        return False
    names[f"R{n}"], names[f"C{n}"] = weakref.ref(f), f.__code__
    # (a dead reference gives None, which a place may hold now: never the same)
    lines.append(f"if {here} is None or R{n}() is not {here}: return False")
    lines.append(f"if {here}.__code__ is not C{n}: return False")
    places = [f"{here}.__closure__[{k}].cell_contents" for k in range(len(held))]
    defaults = f.__defaults__ or ()
    lines.append(f"d{n} = {here}.__defaults__ or ()")  # (the closure is the function's own)
    lines.append(f"if len(d{n}) != {len(defaults)}: return False")
    places += [f"d{n}[{k}]" for k in range(len(defaults))]
    for v, place in zip([*held, *defaults], places):
        if not _capture_line(v, place, strict, depth, names, lines):
            return False
    return True


def _capture_line(v: Any, place: str, strict: bool, depth: int, names: dict, lines: list) -> bool:
    """The statements checking the capture ``v`` at ``place`` as `function_key` keys it."""
    kind, n = type(v), len(names)
    if kind is types.FunctionType and depth < _MAX_DEPTH:
        lines.append(f"v{n} = {place}")
        names[f"v{n}"] = None  # (the name taken)
        return _stamp_lines(v, f"v{n}", strict, depth + 1, names, lines)
    how = _by_kind(kind) if kind is not types.FunctionType else _IDENTITY
    if how is _TYPE and not strict:
        names[f"T{n}"] = kind
        lines.append(f"if type({place}) is not T{n}: return False")
    elif how is _LOOK:
        return False
    elif kind in _HELD_KINDS:
        names[f"H{n}"] = v
        lines.append(f"if {place} is not H{n}: return False")
    else:
        try:
            names[f"R{n}"], names[f"T{n}"] = weakref.ref(v), kind
        except TypeError:
            return False
        lines.append(f"v{n} = {place}")  # (its class too: ``__class__`` can be assigned)
        lines.append(
            f"if v{n} is None or R{n}() is not v{n} or type(v{n}) is not T{n}: return False"
        )
    return True
