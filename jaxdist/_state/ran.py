"""The code a step's trace ran: which of the names its code uses the trace could read.

`jaxdist._state.watch` records, before a step's trace, the Python values the step
reaches through the names its code uses (its own code and the code nested in it), and
a change of one traces the step again. A function the step only makes, for the program
to call at run time (``jax.debug.callback(lambda v: self.log.append(v), loss)``), uses
names too, but its code does not run during the trace: what it reaches (``self.log``,
which it changes on every call) is no input of the trace, and its change must not make
the step trace again.

So, where the names of such nested code reach a watched value, the trace records the
code objects it runs (`begin` and `end` around each trace of the step, a profile
function that adds each frame's code to a set), and `unread` gives the names that only
nested code which did not run uses: code that ran (``len(self.log)`` in the step's
Python) reads by its names, so a name any of it uses is kept, as the names of all code
that did not run under a function that did not run either (a method whose trace is
cached elsewhere). Where the trace cannot be followed (another profiler is set: a
debugger's, cProfile's), nothing is dropped: the values stay watched as before.

>>> import types
>>> def step(self):
...     f = lambda v: self.log.append(v)  # made, never called
...     return self.w
>>> lam = next(c for c in step.__code__.co_consts if isinstance(c, types.CodeType))
>>> sorted(unread({step.__code__}))
['append', 'log']
>>> sorted(unread({step.__code__, lam}))
[]
"""

from __future__ import annotations

import dis
import functools
import os
import threading
import types
from collections.abc import Callable, Collection
from typing import Any

from jaxdist._state import chains as _chains
from jaxdist._state import frames as _frames
from jaxdist._state import names as _names
from jaxdist._state import peek as _peek


class Record:
    """What one trace of a step ran: the names the walk found (``named``), and the code
    objects its traces ran (``ran``; ``complete`` false where some trace ran unfollowed)."""

    __slots__ = ("complete", "named", "ran", "traces")

    def __init__(self, named: set[str]) -> None:
        self.named = frozenset(named)
        self.ran: set[types.CodeType] = set()
        self.traces = 0
        self.complete = True


_local = threading.local()
_MAX_RECORDS = 64  # records of watches no trace followed (a frozen step's check): bounded


def _records() -> dict[int, Record]:
    out = getattr(_local, "records", None)
    if out is None:
        out = _local.records = {}
    return out


def expect(fn: Callable, named: set[str]) -> None:
    """A trace of ``fn`` may follow (`jaxdist._state.watch.watch`): its code is recorded."""
    records = _records()
    records.pop(id(fn), None)
    while len(records) >= _MAX_RECORDS:
        records.pop(next(iter(records)))
    records[id(fn)] = Record(named)


def forget(fn: Callable) -> None:
    """No trace of ``fn`` is to be recorded (its watch has nothing `unread` could drop)."""
    _records().pop(id(fn), None)


def begin(fn: Callable) -> Any:
    """Starts recording the code a trace of ``fn`` runs, where `expect` asked for it;
    the token for `end`."""
    record = _records().get(id(fn))
    if record is None:
        return None
    record.traces += 1
    codes: set[types.CodeType] = set()
    add = codes.add
    token = _frames.listen(lambda frame: add(frame.f_code))
    if token is None:  # another profiler: the trace is not followed
        record.complete = False
        return None
    return record, codes, token


def end(token: Any) -> None:
    """Ends `begin`'s recording: the code run so far is the record's."""
    if token is None:
        return
    record, codes, listening = token
    if not _frames.stop(listening):  # another profiler set during the trace: not followed
        record.complete = False
    record.ran |= codes


def take(fn: Callable) -> Record | None:
    """The record of ``fn``'s traces since `expect`, if every one was followed."""
    record = _records().pop(id(fn), None)
    if record is None or not record.complete or not record.traces:
        return None
    return record


def unread(ran: Collection[types.CodeType]) -> set[str]:
    """The names that only code nested in the program's code that ran, and did not run
    itself, uses (a callback's lambda): no code that ran uses them. The closure variables
    such code reads come as ``CELL + name``."""
    used: set[str] = set()
    nested: set[str] = set()
    cells = False  # code that reads cells as objects (jaxdist's own walk aside)
    for code in ran:
        used |= _own_names(code)
        cells = cells or ("cell_contents" in code.co_names and not _ours(code))
        if not _names.users_code(code):
            continue
        for c in code.co_consts:
            if _peek.is_a(c, types.CodeType) and c not in ran:
                nested |= nested_names(c)
    gone = {n for n in nested - used if n.isidentifier() or n.startswith(CELL)}
    if cells:  # (a cell read by code, not by its variable's name)
        gone = {n for n in gone if not n.startswith(CELL)}
    return gone


def _ours(code: types.CodeType) -> bool:
    """jaxdist's own code (its walk of the state reads cells; no trace depends on that)."""
    return code.co_filename.startswith(_PACKAGE)


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

CELL = "<cell>"
"""Before a name: a closure variable's (read by ``LOAD_DEREF``), not an attribute's."""


def nested_names(code: types.CodeType) -> frozenset[str]:
    """The names a code object and the code nested in it use (`jaxdist._state.names.code_names`),
    and the closure variables they read (after `CELL`)."""
    return _names.code_names(code) | _derefs(code, True)


@functools.lru_cache(maxsize=1024)
def _derefs(code: types.CodeType, deep: bool) -> frozenset[str]:
    out = {CELL + i.argval for i in dis.get_instructions(code) if i.opname in _DEREF_OPS}
    for c in code.co_consts if deep else ():
        if _peek.is_a(c, types.CodeType):
            out |= _derefs(c, True)
    return frozenset(out)


_DEREF_OPS = ("LOAD_DEREF", "LOAD_CLASSDEREF", "LOAD_FROM_DICT_OR_DEREF")


def _own_names(code: types.CodeType) -> set[str]:
    """The global and attribute names a code object uses (not the code nested in it),
    the strings it holds that could be names (``getattr(t, "lr")``), and the closure
    variables it reads."""
    strings = {c for c in code.co_consts if type(c) is str and c.isidentifier()}
    return set(code.co_names) | strings | _derefs(code, False)


def cell_names(fn: Callable, chain: tuple) -> set[str]:
    """The closure variables (after `CELL`) that ``chain`` reads by: a function's cell
    is its code's free variable of that place."""
    out = set()
    for k, (kind, key) in enumerate(chain):
        if kind != "cell":
            continue
        try:
            parent = _chains.fetch(fn, chain[:k])
        except _chains.Gone:
            continue
        if type(parent) is types.FunctionType and key < len(parent.__code__.co_freevars):
            out.add(CELL + parent.__code__.co_freevars[key])
    return out
