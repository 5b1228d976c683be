"""What a trace reads, recorded while it runs: each read of the program's own code, with
the chain from the step to where it read it.

The walk before a trace (`jaxdist._state.capture`, `jaxdist._state.watch`) finds the
values a step reaches through the names its code uses; some routes it cannot see (a
class attribute holding a config, a descriptor's storage, an object behind a
delegating ``__getattr__``, a global read in a method of a ``NamedTuple`` or in a
``custom_vjp`` backward function). A `Recording` sees them as they happen, during the
trace: while it is active,

* each class of the program whose objects the step reaches reads attributes through a
  recording ``__getattribute__`` (installed on the class for the trace, taken away
  after; a read made by library code, or by another thread, is not recorded), and the
  object read gets the chain of its owner and the attribute: its own class is recorded
  in turn, and a container's entries get theirs;
* each function of the program that runs (`jaxdist._state.frames`) has its global
  loads recorded, at their module (``globals()["LR"]`` too, by the keys the code names).

The reads become guards beside the walk's (`jaxdist._state.watch.classify`, compared on
every call) and the numbers among them inputs when they change; an iterator or a random
generator the trace reads (``next(self.schedule)``, ``self.rng.normal()``) is named at
the trace: what the trace took from it is a constant of the program.

>>> class Config:
...     __module__ = "program"  # (a doctest's class, taken as a program's)
...     def __init__(self, lr):
...         self.lr = lr
>>> class Trainer:
...     __module__ = "program"
...     config = Config(0.1)  # a class attribute: the walk does not read it
...     def step(self, x):
...         return x * self.config.lr
>>> t = Trainer()
>>> with Recording(t.step, []) as seen:
...     _ = t.step(2.0)
>>> [(chain, value) for chain, value in seen.reads.items() if value == 0.1]
[((('self', None), ('getattr', 'config'), ('attr', 'lr')), 0.1)]
"""

from __future__ import annotations

import argparse
import contextvars
import dis
import enum
import functools
import inspect
import sys
import threading
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from jaxdist._state import frames as _frames
from jaxdist._state import names as _names
from jaxdist._state import peek as _peek
from jaxdist._state import typed as _typed

Chain = tuple

_ACTIVE: contextvars.ContextVar[tuple[Recording, ...]] = contextvars.ContextVar(
    "jaxdist_recordings", default=()
)
_ATOMS = (int, float, complex, str, bytes, bool, type(None))
_MAX_SOURCES = 20_000  # objects given a chain in one recording (a bound, at the trace only)


class Recording:
    """Records the reads of one step's traces; ``seen``: the ``(chain, value)`` pairs
    the walk already reached (their chains are the sources of what is read on them).

    ``reads``: ``{chain: value}``, the first value read at each chain; ``drawn``: the
    iterators and random generators read, ``[(chain, value)]``."""

    def __init__(self, fn: Callable, seen: Iterable[tuple[Chain, Any]]) -> None:
        self.fn = fn
        self.reads: dict[Chain, Any] = {}
        self.drawn: list[tuple[Chain, Any]] = []
        self._sources: dict[int, tuple[Chain, Any]] = {id(fn): ((), fn)}
        self._by_type: dict[int, Chain] = {}
        self._classes: list[type] = []
        self._token: Any = None
        self._frames: Any = None
        self._source((), fn)
        if type(fn) is types.MethodType:
            self._source((("self", None),), fn.__self__)
        for chain, value in seen:
            self._source(chain, value)

    def __enter__(self) -> Recording:
        for cls in self._classes:
            _patch(cls)
        self._token = _ACTIVE.set((*_ACTIVE.get(), self))
        self._frames = _frames.listen(self._frame)
        return self

    def __exit__(self, *exc: Any) -> None:
        _frames.stop(self._frames)
        _ACTIVE.reset(self._token)
        for cls in self._classes:
            _unpatch(cls)
        self._token = None

    def attribute(self, owner: Any, name: str, value: Any) -> None:
        """``owner.name`` read by the program's code, as ``value``."""
        found = self._sources.get(id(owner))
        if found is None or found[1] is not owner:
            chain = self._by_type.get(id(owner)) if _peek.is_a(owner, type) else None
            if chain is None:
                return
            base = (*chain, ("type", None))
        else:
            base = found[0]
        step = _step(owner, name, value)
        if step is not None:
            self._read((*base, step), value)

    def _frame(self, frame: types.FrameType) -> None:
        code = frame.f_code
        if not _users_code(code):  # (a profile function is this thread's alone)
            return
        module = sys.modules.get(frame.f_globals.get("__name__", ""))
        held = getattr(module, "__dict__", None)
        if held is not frame.f_globals:
            return
        root = (("import", module.__name__),)  # type: ignore[union-attr]
        for name in _loads(code):
            if name in held:
                self._read((*root, ("attr", name)), held[name])

    def _read(self, chain: Chain, value: Any) -> None:
        if chain not in self.reads:
            self.reads[chain] = value
            if _drawn(value):
                self.drawn.append((chain, value))
        self._source(chain, value, 0)

    def _source(self, chain: Chain, value: Any, depth: int = 0) -> None:
        """Gives ``value`` its chain (the first found), records its class's reads, and
        its entries' chains where it is a container."""
        if type(value) in _ATOMS or len(self._sources) > _MAX_SOURCES:
            return
        if id(value) in self._sources:
            return
        self._sources[id(value)] = (chain, value)
        cls = type(value)
        self._by_type.setdefault(id(cls), chain)
        for klass in (cls, type(cls)):  # (a metaclass of the program: its classes' reads)
            if _recordable(klass):
                self._record_class(klass)
        if depth < 3 and _peek.is_container(value):
            for key, item in _peek.items(value)[:256]:
                self._source((*chain, ("item", key)), item, depth + 1)
        elif _peek.is_a(value, _NAMESPACES):  # (C's attribute reads: taken as all read)
            for key, item in list((_peek.instance_dict(value) or {}).items())[:256]:
                self._read((*chain, ("attr", key)), item)

    def _record_class(self, cls: type) -> None:
        if cls not in self._classes:
            self._classes.append(cls)
            if self._token is not None:  # met during the trace: recorded from now on
                _patch(cls)


def _step(owner: Any, name: str, value: Any) -> tuple[str, str] | None:
    """How a chain reads ``owner.name`` without running code: its own dict, else a slot
    or its class's data; None where the read ran code (a property, a method: the reads
    that code made are recorded themselves)."""
    own = _peek.instance_dict(owner)
    if own is not None and name in own and own[name] is value:
        return ("attr", name)
    try:
        return ("getattr", name) if _peek.safe_getattr(owner, name) is value else None
    except AttributeError:
        return None


def _drawn(value: Any) -> bool:
    """An iterator or a random generator: what a trace takes from it is taken once."""
    if _peek.is_a(value, Iterator) and not _peek.is_container(value):
        return True
    module = type(value).__module__ or ""
    return module.startswith(("numpy.random", "random")) and type(value).__name__ in _RANDOM


_NAMESPACES = (types.SimpleNamespace, argparse.Namespace)  # plain records whose reads are C's
_RANDOM = frozenset(("Generator", "RandomState", "Random", "SystemRandom"))


def _recordable(cls: type) -> bool:
    """A class of the program whose reads can be recorded: not Keras' or another
    library's (typed state: `jaxdist._state.typed`), not an Enum (its members are fixed)."""
    if cls.__flags__ & _IMMUTABLE or not _names.users_class(cls):
        return False
    return not (_typed.is_typed_class(cls) or issubclass(cls, enum.Enum))


_IMMUTABLE = 1 << 8  # ``Py_TPFLAGS_IMMUTABLETYPE``: a C type (no attribute can be set on it)


@functools.lru_cache(maxsize=4096)
def _users_code(code: types.CodeType) -> bool:
    return _names.users_code(code)


@functools.lru_cache(maxsize=4096)
def _loads(code: types.CodeType) -> tuple[str, ...]:
    """The globals a code object loads (not its nested code's: that runs as its own frame),
    and, where it calls ``globals()``, the strings it holds (``globals()["LR"]``)."""
    names = {i.argval for i in dis.get_instructions(code) if i.opname in _LOAD_OPS}
    if "globals" in names:
        names |= {c for c in code.co_consts if type(c) is str and c.isidentifier()}
    return tuple(sorted(names))


_LOAD_OPS = ("LOAD_GLOBAL", "LOAD_NAME")


# the classes whose ``__getattribute__`` records: {class: [recordings, own before or None]}
_PATCHED: dict[type, list] = {}
_PATCH_LOCK = threading.Lock()  # (held for the bookkeeping only: no user code runs under it)


def _patch(cls: type) -> None:
    with _PATCH_LOCK:
        held = _PATCHED.get(cls)
        if held is not None:
            held[0] += 1
            return
        own = cls.__dict__.get("__getattribute__")
        original = own if own is not None else _inherited(cls)
        _PATCHED[cls] = [1, own]
    type.__setattr__(cls, "__getattribute__", _hook(original))


def _unpatch(cls: type) -> None:
    with _PATCH_LOCK:
        held = _PATCHED.get(cls)
        if held is None:
            return
        held[0] -= 1
        if held[0]:
            return
        del _PATCHED[cls]
    if held[1] is None:
        type.__delattr__(cls, "__getattribute__")
    else:
        type.__setattr__(cls, "__getattribute__", held[1])


def _inherited(cls: type) -> Any:
    for base in cls.__mro__[1:]:
        found = base.__dict__.get("__getattribute__")
        if found is not None:
            return found
    return object.__getattribute__


def _hook(original: Any) -> Callable[[Any, str], Any]:
    def __getattribute__(self: Any, name: str) -> Any:
        value = original(self, name)
        active = _ACTIVE.get()
        caller = inspect.currentframe() if active else None  # (this hook's frame)
        if caller is not None and caller.f_back and _users_code(caller.f_back.f_code):
            for recording in active:
                recording.attribute(self, name, value)
        return value

    __getattribute__.__jaxdist_recording__ = True  # type: ignore[attr-defined]
    return __getattribute__


def recording() -> bool:
    """Whether this thread is in a trace whose reads are recorded."""
    return bool(_ACTIVE.get())
