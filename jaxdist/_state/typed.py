"""Library objects whose attributes change only through a write barrier: typed state.

A Keras model's step depends on thousands of Python values inside Keras' own objects
(a layer's ``built``, a variable's ``_autocast``, a metric's ``name``): a trace reads
them, so a change must trace again, but comparing them all on every call is most of a
call's cost over a Keras model. A library whose objects set their attributes through a
``__setattr__`` of their own registers those classes here (`register`), and its
integration makes each such assignment, by anyone, draw a new `epoch` (`bump`). Then a
watched value that is an attribute of such an object (held in its instance dictionary)
can only change after the epoch moved: a call compares one number, and only when it
moved compares those values again (`Guarded`), exactly as before. Values the barrier
cannot see change (an item of a list a layer holds, a set mutated in place, a
function's captures) are compared on every call as ever.

The classes count as typed only where their ``__setattr__`` and ``__delattr__`` are the
ones the integration wrapped (`register` takes them): a subclass with its own that
does not call the library's is compared on every call.

>>> class Box:
...     pass
>>> is_typed_class(Box)
False
>>> e = epoch(); bump(); epoch() > e
True
"""

from __future__ import annotations

import itertools
import types
from collections.abc import Callable
from typing import Any

from jaxdist._base import jax_internals as _jax_internals
from jaxdist._state import chains as _chains
from jaxdist._state import names as _names
from jaxdist._state import peek as _peek
from jaxdist._state.chains import Chain

_COUNT = itertools.count(1)
_EPOCH = [0, 0]  # the last number drawn: by any typed object, by one of the program's classes
_BARRIERS: set = set()  # the wrapped ``__setattr__`` / ``__delattr__`` functions
_UNWATCHED: set[str] = set()  # attributes the barriers assign without drawing an epoch
_ANSWERS: dict[int, tuple[Any, bool]] = {}  # id(class) -> (class, typed?)


def epoch() -> int:
    """The number drawn by the last assignment to a typed object's attribute."""
    return _EPOCH[0]


def programs_epoch() -> int:
    """The number drawn by the last assignment to an attribute of a typed object of a class
    of the program's (a Keras layer the program defines)."""
    return _EPOCH[1]


ANY_PROGRAMS = object()  # `bump`'s object where it may be one of the program's


def bump(obj: Any = None) -> None:
    """Draws a new `epoch`: an attribute of ``obj``, a typed object, was assigned or
    deleted (or something it holds changed: `ANY_PROGRAMS` where whose is not known).
    The program's epoch moves only outside a trace: what a trace assigns is the step's
    own doing (Keras building a layer it calls), which the values watched follow; a
    trace of one step must not make another's look changed."""
    n = _EPOCH[0] = next(_COUNT)
    if obj is ANY_PROGRAMS or (obj is not None and _programs_class(type(obj))):
        if not _jax_internals.tracing():  # (a trace's own: Keras building what it calls)
            _EPOCH[1] = n


def _programs_class(cls: type) -> bool:
    known = _PROGRAMS.get(id(cls))
    if known is None or known[0] is not cls:
        known = _PROGRAMS[id(cls)] = (cls, _names.users_class(cls))
    return known[1]


_PROGRAMS: dict[int, tuple[Any, bool]] = {}  # id(class) -> (class, the program's?)


def held(parent: Any, kind: str, key: Any) -> Any:
    """What ``parent`` holds at the step ``(kind, key)`` before jaxdist writes there (a
    value that stays the same object is no change: Keras' ``_called``, written back on
    every call as True); a fresh object where barriers are not installed or nothing is."""
    if not _BARRIERS or (kind == "attr" and key in _UNWATCHED):
        return _GONE  # (`written` draws nothing for a variable's array)
    try:
        return _chains.fetch(parent, ((kind, key),))
    except (_chains.Gone, LookupError, AttributeError, TypeError):
        return _GONE


def written(fn: Callable, chain: Chain) -> None:
    """Draws a new `epoch` where jaxdist itself wrote at ``chain`` inside a typed object
    (a step's write-back, `jaxdist._state.assign.replace`: it writes an instance's
    dictionary or a list's item directly, past any barrier), so that what is compared
    only after the epoch moved is compared again. Only the first number: the program's
    epoch is the program's own assignments, and a step's write-back is not one."""
    if not _BARRIERS or (chain and chain[-1][0] == "attr" and chain[-1][1] in _UNWATCHED):
        return  # (a variable's array: never compared as a watched value)
    obj: Any = fn
    for link in chain[:-1]:
        try:
            obj = _chains.fetch(obj, (link,))
        except _chains.Gone:
            break
        if _is_typed(obj):
            bump()
            return


def register(barrier: Callable, unwatched: frozenset = frozenset()) -> None:
    """Names a library's wrapped ``__setattr__`` or ``__delattr__``, which calls `bump` on
    every assignment but those of the attributes named in ``unwatched`` (never covered)."""
    _BARRIERS.add(barrier)
    _UNWATCHED.update(unwatched)
    _ANSWERS.clear()


def is_typed_class(cls: type) -> bool:
    """Whether every assignment to an attribute of a ``cls`` object goes through a barrier."""
    known = _ANSWERS.get(id(cls))
    if known is not None and known[0] is cls:
        return known[1]
    typed = bool(_BARRIERS) and _resolve(cls, "__setattr__") in _BARRIERS
    typed = typed and _resolve(cls, "__delattr__") in _BARRIERS
    _ANSWERS[id(cls)] = (cls, typed)
    return typed


def _resolve(cls: type, name: str) -> Any:
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name]
    return None


# the steps that leave a library object's own data: a module's global (a library's
# settings, ``keras.config.set_floatx``, change with no barrier) and the objects passed
# to the step; every other step from a typed object (an attribute, an item, a property
# of a library's object, a cell of a library's closure) stays inside it
_LEAVING_STEPS = frozenset({"global", "parg"})


def owned(fn: Callable, watched: tuple) -> tuple[list[bool], bool]:
    """For each watched value (`jaxdist._state.watch.watch`'s ``(chain, value, how)``),
    whether it is a typed object's own data: its chain reaches a typed object and then
    goes on only through objects and functions that are not the program's (a layer's
    ``built``, the shape of a variable in a layer's list, a cell of a library's closure),
    never through a module's global. The rest (the program's own objects and functions,
    even held by a layer) is not. And whether the chains pass a typed object of a class of
    the program's (a layer the program defines: what its code reads there is not known)."""
    objects: dict[Chain, Any] = {}

    def at(prefix: Chain) -> Any:
        if prefix not in objects:
            try:
                objects[prefix] = _chains.fetch(fn, prefix)
            except _chains.Gone:
                objects[prefix] = _GONE
        return objects[prefix]

    flags = [_owned(chain, how, at) for chain, _, how in watched]
    programs = any(_is_typed(o) and _programs_class(type(o)) for o in objects.values())
    return flags, programs


_GONE = object()


def _owned(chain: Chain, how: str, at: Callable[[Chain], Any]) -> bool:
    if not _BARRIERS:
        return False
    first = next((k for k in range(1, len(chain)) if _is_typed(at(chain[:k]))), None)
    if first is None:
        return False
    for k in range(first, len(chain)):
        kind, key = chain[k]
        if kind in _LEAVING_STEPS or (kind == "attr" and key in _UNWATCHED):
            return False
        if kind in _CLASS_STEPS and _class_data(at(chain[:k]), kind, key):
            return False  # (a class's attribute: ``Scale.factor = 3.0`` passes no barrier)
        obj = at(chain[: k + 1])
        if obj is _GONE or (k + 1 < len(chain) and _programs(obj)):
            return False
    return not _programs(at(chain)) or how != "type"


_CLASS_STEPS = frozenset({"getattr", "meth"})  # the steps that may read a class's data


def _class_data(obj: Any, kind: str, key: Any) -> bool:
    """Whether the step reads ``obj``'s class (a method, a class attribute), which an
    instance's barrier does not guard, rather than its own attribute (or slot)."""
    if kind == "meth" or obj is _GONE:
        return True
    own = _peek.instance_dict(obj)
    if own is not None and key in own:
        return False
    return type(_peek.type_lookup(type(obj), key)) is not types.MemberDescriptorType


def _is_typed(obj: Any) -> bool:
    return obj is not _GONE and _peek.instance_dict(obj) is not None and is_typed_class(type(obj))


def _programs(obj: Any) -> bool:
    """An object of a class of the program's that no barrier guards."""
    cls = type(obj)
    if is_typed_class(cls):
        return False
    if _peek.is_a(obj, types.FunctionType):
        return _names.users_function(obj)
    return _names.users_class(cls)


class Guarded:
    """A watch's check (`changed`) split in two: the values a barrier covers, compared
    only after the `epoch` moved since they last held, and the rest, on every call. Where
    the state holds a typed object of the program's class (a layer it defines), any
    assignment to one after the trace (`programs_epoch`) is a change: what the program's
    own code reads there is not all watched (a trace taken while a barrier is installed
    counts any such assignment, wherever: one trace more where it was elsewhere). The
    step's own write-back is not a change (`absorb`).

    ``make`` builds a checker (``changed(fn)``, ``rewrite(fn)``) for a set of watched values.
    """

    def __init__(self, fn: Callable, watched: tuple, make: Callable[[tuple], Any]) -> None:
        flags, programs = owned(fn, watched)
        self.covered = tuple(w for w, f in zip(watched, flags) if f)
        self.rest = tuple(w for w, f in zip(watched, flags) if not f)
        self._rest = make(self.rest)
        self._covered = make(self.covered) if self.covered else None
        self._held: int | None = None  # the epoch at which the covered values last held
        # (any trace while a barrier is installed: the walk does not find every layer its
        # code runs, ``model(x)`` calling a layer of the program's through Keras' __call__)
        self._programs: int | None = programs_epoch() if programs or _BARRIERS else None

    def changed(self, fn: Callable) -> bool:
        if self._programs is not None and programs_epoch() != self._programs:
            return True
        if self.rest and self._rest.changed(fn):
            return True
        if self._covered is None:
            return False
        now = epoch()
        if now == self._held:
            return False
        if self._covered.changed(fn):
            return True
        self._held = now  # (drawn before the comparison: a change during it draws anew)
        return False

    def epochs(self) -> tuple[int, int]:
        """The epochs now, taken before the step's write-back (for `absorb`)."""
        return _EPOCH[0], _EPOCH[1]

    def absorb(self, fn: Callable, before: tuple[int, int]) -> None:
        """Takes the assignments of the step's own write-back, made since ``before``
        (`epochs`), as no change: where nothing else had moved the epochs."""
        if self._programs is not None and self._programs == before[1]:
            self._programs = _EPOCH[1]
        if self._held is not None and self._held == before[0] and _EPOCH[0] != before[0]:
            # (what it wrote may be what it read, ``d.mode = "b"`` after reading "a": the
            # values compared once now, and taken as holding only if they still do)
            now = _EPOCH[0]
            if self._covered is not None and not self._covered.changed(fn):
                self._held = now

    def rewrite(self, fn: Callable) -> None:
        self._rest.rewrite(fn)
        if self._covered is not None:
            self._covered.rewrite(fn)
