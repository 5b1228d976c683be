"""Python numbers in a step's state as traced inputs, as Python numbers in ``args`` are.

A trace bakes in the Python numbers the step reads (``self.lr``, a ``global CALLS``).
When one of them changes between calls (a schedule the host sets, a counter the step
increments), tracing again for every value would compile without end. Instead, the
next trace of that step's code reads a tracer at that place: jaxdist puts a tracer
there for the length of the trace (`swapped`) and puts the number back after, so the
program takes the number as an input from then on: one more compile in total. A value
the step writes there (``self.calls += 1``) becomes an output, written back as a
Python number of the same type after each call (TF eager runs the step's Python on
every call; the count is the same).

Where the step needs the concrete value (``range(self.n)``, ``if self.lr > 0``), the
trace with a tracer fails; the number stays part of the trace (`make_static`), as a
static argument is. Only places the step's state owns outright are written: an
instance's own attribute, a dict or list item, a global, a closure cell, a function
attribute, a class attribute.
"""

from __future__ import annotations

import collections
import contextvars
import threading
import types
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from jaxdist._state import chains as _chains
from jaxdist._state import peek as _peek
from jaxdist._state import ran as _ran
from jaxdist._state.chains import Chain

_MAX_CODES = 256
# held while a call reads the numbers of a step's state and stores those it computes
# from them (`jaxdist._state.stage.Staged.inputs`): two threads counting lose no count
LOCK = threading.RLock()
_PROMOTED: collections.OrderedDict = collections.OrderedDict()  # code -> {chain}
_STATIC: collections.OrderedDict = collections.OrderedDict()  # code -> {chain}


# NumPy's float scalars (``np.cos(t)``, ``np.float32(lr)``) as well: JAX gives them the
# dtype it gives such an argument (float32, strongly typed), not a Python float's weak
# type. Not NumPy's integers: a device int32 would wrap an ``np.int64`` silently.
NUMBERS = frozenset((int, float, np.float16, np.float32, np.float64))
NUMPY_FLOATS = frozenset((np.float16, np.float32, np.float64))


def is_number(x: Any) -> bool:
    """A Python int or float, or a NumPy float scalar (not a bool: a bool decides Python
    control flow).

    >>> import numpy as np
    >>> is_number(1), is_number(0.5), is_number(np.float64(0.5)), is_number(True)
    (True, True, True, False)
    """
    return type(x) in NUMBERS


def like(old: Any, value: Any) -> Any:
    """``value`` (a Python number computed for the place ``old`` was read from) as a NumPy
    float of ``old``'s type where ``old`` is one: the type the state held stays.

    >>> import numpy as np
    >>> type(like(np.float32(1), 0.5)).__name__, type(like(1.0, 2)).__name__
    ('float32', 'int')
    """
    return type(old)(value) if type(old) in NUMPY_FLOATS else value


def _code(fn: Callable) -> Any:
    return _chains.code_of(fn)  # (a call's root with its argument objects: its step's code)


def _remembered(table: collections.OrderedDict, code: Any) -> set:
    chains = table.setdefault(code, set())
    table.move_to_end(code)
    while len(table) > _MAX_CODES:
        table.popitem(last=False)
    return chains


def remember(fn: Callable, chains: Sequence[Chain]) -> bool:
    """Records that ``fn``'s code reads changing numbers at ``chains``; False when none
    of them can become an input (not writable, or the step needs its value)."""
    code = _code(fn)
    static = _STATIC.get(code, set())
    new = [c for c in chains if c not in static and writable(fn, c)]
    if code is None or not new:
        return False
    _remembered(_PROMOTED, code).update(new)
    return True


def make_static(fn: Callable, chains: Sequence[Chain]) -> None:
    """The step needs these numbers' values: they stay part of its traces."""
    code = _code(fn)
    _remembered(_STATIC, code).update(chains)
    _PROMOTED.get(code, set()).difference_update(chains)


def promoted(fn: Callable) -> tuple[Chain, ...]:
    """The chains of ``fn``'s code that are traced inputs and hold a number now."""
    chains = _PROMOTED.get(_code(fn), ())
    out = []
    for chain in sorted(chains, key=repr):
        try:
            if is_number(_chains.fetch(fn, chain)):
                out.append(chain)
        except _chains.Gone:
            continue
    return tuple(out)


def spec(value: Any) -> jax.ShapeDtypeStruct:
    """The abstract value JAX gives a number of ``value``'s type passed as an argument
    (a Python number's is weakly typed, a NumPy float's is not; by type only: an int past
    int32 is traced as one, its written values computed on the host,
    `jaxdist._state.hostnum`).

    >>> import numpy as np
    >>> spec(3_000_000_000).dtype == spec(1).dtype, spec(0.5).weak_type
    (True, True)
    >>> spec(np.float64(0.5)).weak_type
    False
    """
    aval = jax.typeof(type(value)(0))
    return jax.ShapeDtypeStruct((), aval.dtype, weak_type=aval.weak_type)


def writable(fn: Callable, chain: Chain) -> bool:
    """Whether a number can be stored at the end of ``chain`` (`put`): a place the
    state owns outright, or an entry of a tuple or namedtuple held at such a place (the
    tuple is then replaced by one with that entry changed, as ``cfg._replace(lr=...)``)."""
    kind, key = chain[-1]
    if kind not in _SETTERS:
        return False
    try:
        parent = _chains.fetch(fn, chain[:-1])
    except _chains.Gone:
        return False
    if kind == "item":
        if _rebuildable(parent):
            return len(chain) > 1 and writable(fn, chain[:-1])
        return type(parent) in (dict, list) or _peek.is_a(parent, (dict, list, collections.deque))
    if kind == "attr":
        return _peek.instance_dict(parent) is not None
    if kind == "getattr":  # a class's data, or an object's slot
        return _peek.is_a(parent, type) or _slot(parent, key) is not None
    if kind in ("default", "kwdefault"):  # (a function's defaults: a tuple made again, a dict)
        return type(parent) is types.FunctionType
    if kind == "child":  # a registered pytree's field held in its object's own dict
        return bool(key[2]) and key[2] in (_peek.instance_dict(parent) or {})
    return True


def put(fn: Callable, chain: Chain, value: Any) -> None:
    """Stores ``value`` at the end of ``chain`` (a place `writable` accepts)."""
    kind, key = chain[-1]
    parent = _chains.fetch(fn, chain[:-1])
    if kind == "item" and _rebuildable(parent):
        if tuple.__getitem__(parent, key) is value:
            return  # the tuple holds it already: kept (the same object, as a trace saw it)
        items = list(tuple.__iter__(parent))
        items[key] = value
        put(fn, chain[:-1], tuple.__new__(type(parent), items))
        return
    _SETTERS[kind](parent, key, value)


def _rebuildable(x: Any) -> bool:
    """A tuple, or a namedtuple with no attributes of its own: made again with one entry
    changed without running its class's code (``tuple.__new__``, as ``_make`` does)."""
    kind = type(x)
    if kind is tuple:
        return True
    return (
        _peek.is_a(x, tuple)
        and _peek.type_lookup(kind, "_fields") is not None
        and not _peek.instance_dict(x)
    )


def _place(fn: Callable, chain: Chain) -> Chain:
    """The place a value at ``chain`` is stored through (`put`): the chain of the tuple
    holding it replaced, where it is an entry of one."""
    while len(chain) > 1 and chain[-1][0] == "item":
        try:
            if not _rebuildable(_chains.fetch(fn, chain[:-1])):
                break
        except _chains.Gone:
            break
        chain = chain[:-1]
    return chain


def _set_item(parent: Any, key: Any, value: Any) -> None:
    if _peek.is_a(parent, collections.deque):
        collections.deque.__setitem__(parent, key, value)
        return
    (dict.__setitem__ if _peek.is_a(parent, dict) else list.__setitem__)(parent, key, value)


def _slot(obj: Any, name: str) -> Any:
    """The slot ``name`` of ``obj``'s class (a ``__slots__`` entry), None if it has none."""
    found = _peek.type_lookup(type(obj), name)
    return found if type(found) is types.MemberDescriptorType else None


def _set_getattr(obj: Any, name: str, value: Any) -> None:
    if _peek.is_a(obj, type):
        type.__setattr__(obj, name, value)
    else:  # a slot: its descriptor stores it (no code of the class runs)
        _slot(obj, name).__set__(obj, value)


_SETTERS: dict[str, Callable[[Any, Any, Any], None]] = {
    "attr": lambda o, k, v: (_peek.instance_dict(o) or {}).__setitem__(k, v),
    "item": _set_item,
    "global": lambda o, k, v: o.__globals__.__setitem__(k, v),
    "cell": lambda o, k, v: setattr(o.__closure__[k], "cell_contents", v),
    "fattr": lambda o, k, v: o.__dict__.__setitem__(k, v),
    "getattr": _set_getattr,
    "default": lambda o, k, v: setattr(o, "__defaults__", _with(o.__defaults__, k, v)),
    "kwdefault": lambda o, k, v: o.__kwdefaults__.__setitem__(k, v),
    "child": lambda o, k, v: (_peek.instance_dict(o) or {}).__setitem__(k[2], v),
}


def _with(items: tuple, k: int, value: Any) -> tuple:
    return (*items[:k], value, *items[k + 1 :])


class Swapped:
    """Within ``with``: the tracers at ``chains``; after: the numbers back, and in
    ``written`` the values the step stored at them (index and value).

    A partial-batch step traces the step once per group of replicas, each in a trace
    of its own inside this one (`jaxdist._partial.replay`): each group starts from the
    tracers (`restart`), gives what it wrote as outputs of its own trace
    (`pending`), and the values replica 0 computed are what the step wrote (`settle`).
    """

    def __init__(self, fn: Callable, chains: Sequence[Chain], tracers: Sequence[Any]) -> None:
        self._fn, self._chains, self._tracers = fn, chains, tracers
        self._saved: list = []
        self._token: Any = None
        self._ran: Any = None
        self.written: list[tuple[int, Any]] = []

    def __enter__(self) -> Swapped:
        for chain, tracer in zip(self._chains, self._tracers):
            place = _place(self._fn, chain)  # a namedtuple's entry: the namedtuple itself
            self._saved.append((place, _chains.fetch(self._fn, place)))
            put(self._fn, chain, tracer)
        self._token = _ACTIVE.set(self)
        self._ran = _ran.begin(self._fn)  # the code the trace runs (`jaxdist._state.ran`)
        return self

    def restart(self) -> None:
        """The tracers back at their places (a group's trace begins)."""
        for chain, tracer in zip(self._chains, self._tracers):
            put(self._fn, chain, tracer)

    def pending(self) -> list[tuple[int, Any]]:
        """What the step stored at the places since `restart`: (index, value)."""
        out = []
        for i, (chain, tracer) in enumerate(zip(self._chains, self._tracers)):
            try:
                now = _chains.fetch(self._fn, chain)
            except _chains.Gone:
                continue
            if now is not tracer:
                out.append((i, now))
        return out

    def now(self) -> list[Any]:
        """The values at the places now (a tracer, or what the step stored there)."""
        return [_chains.fetch(self._fn, chain) for chain in self._chains]

    def put_back(self, values: Sequence[Any]) -> None:
        """Stores ``values`` at the places (as `now` gave them)."""
        for chain, value in zip(self._chains, values):
            put(self._fn, chain, value)

    def settle(self, written: Sequence[int], values: Sequence[Any]) -> None:
        """Stores at the places ``written`` the step's values there (of this trace)."""
        self.restart()
        for i, value in zip(written, values):
            put(self._fn, self._chains[i], value)

    def __exit__(self, *exc: Any) -> None:
        _ran.end(self._ran)
        _ACTIVE.reset(self._token)
        for i, (chain, tracer) in enumerate(zip(self._chains, self._tracers)):
            try:
                now = _chains.fetch(self._fn, chain)
            except _chains.Gone:
                now = tracer
            if now is not tracer:
                self.written.append((i, now))
        # last first: one place reached by two chains (a global and a cell holding the
        # same function; two entries of one namedtuple) gets back what was there before
        # the first swap (the very object)
        for place, old in reversed(self._saved):
            put(self._fn, place, old)


def swapped() -> Swapped | None:
    """The numbers swapped for tracers in the trace being made, if any."""
    return _ACTIVE.get()


_ACTIVE: contextvars.ContextVar[Swapped | None] = contextvars.ContextVar(
    "jaxdist_swapped_numbers", default=None
)


def put_number(fn: Callable, chain: Chain, kind: type) -> None:
    """The value at ``chain`` made a number of type ``kind`` where a program's array is
    there now (an entry of a namedtuple the step assigned whole)."""
    try:
        value = _chains.fetch(fn, chain)
    except _chains.Gone:
        return
    if type(value) is not kind and _peek.is_a(value, (jax.Array, np.ndarray)) and value.size:
        put(fn, chain, as_number(value.reshape(-1)[:1], kind))


def as_number(value: Any, kind: type) -> Any:
    """``value`` (a program's output: an array of one element) as a number of type
    ``kind``, as Python assigned it; anything else as it is."""
    if _peek.is_a(value, (jax.Array, np.ndarray)) and value.size == 1:
        return kind(np.asarray(value).reshape(-1)[0].item())
    return value


def write_back(fn: Callable, chains: Sequence[Chain], written: list, values: list) -> None:
    """Stores each written value (replica 0's, a Python number of the type there now)."""
    for (i, _), value in zip(written, values):
        try:
            old = _chains.fetch(fn, chains[i])
        except _chains.Gone:
            continue
        row = np.asarray(value)
        number = row.reshape(-1)[0].item() if row.size else row.item()
        put(fn, chains[i], type(old)(number) if is_number(old) else number)
