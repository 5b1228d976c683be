"""Each call of a staged step: its state read now, and what it wrote stored back.

`jaxdist._state.stage.Staged` traces a step once; this is the half of it that runs on
every call, which `Staged` derives from (`Calls`): the captured arrays and numbers read
afresh and checked against the trace (`inputs`: a watched value that moved, an array of
another shape or dtype, or a value gone means the trace does not fit, and `reason` says
why), the numbers the step writes that the host computes stored at the read
(`jaxdist._state.hostnum`; `unread` puts them back when the call does not run), what the
step wrote stored back after it (`write_back`, and `overwritten` for the arrays a
``jd.function`` may donate), and an untraced output read where the state holds it now
(`output`). Apart from the trace because nothing here traces: it reads the record the
trace left (the attributes declared below, set by `Staged.__init__`).

>>> import jax.numpy as jnp, numpy as np
>>> is_concrete_array(jnp.zeros(2)), is_concrete_array(np.zeros(2)), is_concrete_array(2.0)
(True, True, False)
"""

from __future__ import annotations

import functools
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxdist._base.layout import is_tracer
from jaxdist._base.validate import describe
from jaxdist._state import aggregation as _aggregation
from jaxdist._state import assign as _assign
from jaxdist._state import chains as _chains
from jaxdist._state import checks as _checks
from jaxdist._state import hostnum as _hostnum
from jaxdist._state import placed as _placed
from jaxdist._state import promote as _promote
from jaxdist._state import replica as _replica
from jaxdist._state import typed as _typed
from jaxdist._state import watch as _watch
from jaxdist._state.keys import KeyWatch, captures_nothing


def is_concrete_array(x: Any) -> bool:
    """A JAX or NumPy array that is not a tracer (a value of the state now)."""
    return isinstance(x, (jax.Array, np.ndarray)) and not is_tracer(x)


def is_concrete_jax(x: Any) -> bool:
    """A JAX array that is not a tracer; its type is kept (`CONCRETE_JAX`, read in place
    by the generated checks): its shape, dtype and weak type are then its ``aval``'s."""
    if type(x) in CONCRETE_JAX:
        return True
    if not isinstance(x, jax.Array) or is_tracer(x):
        return False
    if len(CONCRETE_JAX) < 16:
        CONCRETE_JAX.add(type(x))
    return True


_CONCRETE: set = set()  # the types of concrete arrays the state held (never a tracer's)
_CAPTURES = ("cell", "default", "kwdefault")  # the links to a function's captures
CONCRETE_JAX: set = set()  # those that are JAX arrays: their shape, dtype, weak type their aval's
_READ = threading.local()  # this thread's last outputs read where `write_back` assigned
_MISFIT = (
    "type(v) not in K or v.shape != s{j} or v.dtype != d{j}"
    " or getattr(v, 'weak_type', False) is not w{j}"  # (a NumPy array is never weak)
)


# a JAX array whose aval is the one of an array that fitted here before fits (avals are
# immutable and shared by the arrays of one shape, dtype and weak type); another, checked
_FIT = (
    "if type(v) in J:",
    "    if v.aval is not A[{j}]:",
    "        if {misfit}: return False",
    "        A[{j}] = v.aval",
    "elif {misfit}: return False",
)


class Calls:
    """The per-call half of `jaxdist._state.stage.Staged`, over the record its trace left."""

    # the record of the trace (set by `jaxdist._state.stage.Staged`)
    _numbers: tuple  # the chains of the Python numbers that are inputs
    _swaps: list  # ``(chain, shape, dtype)`` of the arrays read inside nested jaxprs
    _lifted: list  # ``(const index, chain, shape, dtype)`` of the captured arrays
    _written: list  # the numbers the step wrote (`jaxdist._state.promote.Swapped`)
    _assigned: list  # ``(chain, treedef, leaves)`` of what it assigned (``writes``)
    _copied: list  # ``(output, number)``: the outputs that are a number input as it is
    _moved: list  # ``(chain, source chain)``: an array of the state it put elsewhere
    _jaxpr: Any
    _types: list  # the numbers' types
    _promote: bool
    _watched: tuple
    _checker: _typed.Guarded
    _fetcher: _chains.Fetcher
    _array_checks: list  # ``(chain, shape, dtype)`` of the arrays read
    _aliases: list  # ``(k, chain)``: another name of the k-th captured array
    _outs: dict  # ``id`` of an untraced output -> its chain
    _strict: bool
    _captured: tuple
    _fresh: bool
    _nothing: bool
    _rows: list  # which of ``_swaps`` are distributed values read per replica (first)
    _replica: Any  # `jaxdist._state.replica.Replica` of a replica step, or None

    def overwritten(self) -> list[int]:
        """The indices, among the inputs after the step's arguments, of the arrays read
        from places the function assigns (``self.params`` of ``self.params = new``)."""
        places = [chain for chain, _, _ in self._assigned]
        chains = [*self._numbers, *(c for c, *_ in self._swaps), *(c for _, c, *_ in self._lifted)]
        return [
            i
            for i, chain in enumerate(chains)
            if i >= len(self._numbers) and any(chain[: len(p)] == p for p in places)
        ]

    def write_back(self, fn: Callable, outs: list) -> None:
        """Stores what the step wrote in its state: (``writes``) the values it assigned,
        and the numbers it wrote that were computed on the device (the last outputs);
        those computed on the host (`jaxdist._state.hostnum`) were stored by `inputs`, and
        nothing waits for the device for them. Its assignments to typed objects (a Keras
        layer's) are its own, not a change to what it read (`jaxdist._state.typed`)."""
        if not self._written and not self._assigned and not self._moved:
            return
        before = self._checker.epochs()
        self._write_back(fn, outs)
        self._checker.absorb(fn, before)

    def _write_back(self, fn: Callable, outs: list) -> None:
        # (a step assigning its captures: its watched keys taken as written below only if
        # nothing else changed them meanwhile, a callback or another thread)
        fits = self._assigns_captures and not self._changed_since(fn)
        if self._outs_assigned:  # what it returns of places it assigns, as it read them
            _READ.values = (self, {i: _chains.fetch(fn, c) for i, c in self._outs_assigned})
        moved = [(c, _chains.fetch(fn, source)) for c, source in self._moved]  # (as read)
        end = len(outs) - len(self._written)
        pending, n = self._write_plan
        if pending:
            tail = outs[end:]
            written = [self._written[j] for j in pending]
            _promote.write_back(fn, self._numbers, written, [tail[j] for j in pending])
        it = iter(outs[end - n : end])
        if self._replica is not None:  # a replica step's: one value or a PerReplica each
            written, rules = self._replica.written, self._rules(fn)
            it = iter([written(x, v, r) for x, v, r in zip(it, self._written_varies, rules)])
        if self._copied:  # a number input assigned as it is: the number it was
            values = list(it)
            for k, j in self._copied:
                values[k] = _promote.as_number(values[k], self._types[j])
            it = iter(values)
        for chain, treedef, leaves in self._assigned:
            value = treedef.unflatten([next(it) if x is None else _fresh(x) for x in leaves])
            _assign.replace(fn, chain, value, undo=False)
        for i in self._numbers_assigned:  # a number as the number type it was, not an array
            _promote.put_number(fn, self._numbers[i], self._types[i])
        for chain, value in moved:  # (``self.prev = self.w``: what the source held)
            _assign.replace(fn, chain, value, undo=False)
        if fits:  # (``nonlocal log; log = [*log, x]``: a new object there)
            self._rewrite(fn)

    def _rewrite(self, fn: Callable) -> None:
        """The captures' and the watched functions' keys now fit as written (by the trace,
        or by the last call's write-back)."""
        self._captures.rewrite(fn)
        self._checker.rewrite(fn)

    def _changed_since(self, fn: Callable) -> bool:
        """Whether the state this trace watches no longer fits it (before its write-back:
        changed during the call, by a callback or another thread)."""
        return self._captures.differs(fn) or bool(self._watched and self._checker.changed(fn))

    @functools.cached_property
    def _assigns_captures(self) -> bool:
        """Whether the step assigns one of its captures (a closure cell, a default
        argument) or an object it rebuilds there (a tuple's entry): the objects it
        captures (`captured_ids`), and the keys of the functions it watches that capture
        them, may then be those it wrote, not those it was traced with: either fits."""
        chains = [chain for chain, _, _ in self._assigned] + [c for c, _ in self._moved]
        return any(kind in _CAPTURES for chain in chains for kind, _ in chain[:2])

    @functools.cached_property
    def _numbers_assigned(self) -> list[int]:
        """The numbers inside a value the step assigned (an entry of the namedtuple of
        ``self.cfg = self.cfg._replace(lr=...)``), by index: the program's value there is
        stored back as a number of the type read."""
        places = [chain for chain, _, _ in self._assigned]
        return [
            i
            for i, c in enumerate(self._numbers)
            if any(len(p) < len(c) and c[: len(p)] == p for p in places)
        ]

    @functools.cached_property
    def _outs_assigned(self) -> list:
        """The untraced outputs read from places the step assigns (``old = self.w;
        self.w = new; return old``): ``(id, chain)``, `output` gives them as read."""
        places = [chain for chain, _, _ in self._assigned]
        return [(i, c) for i, c in self._outs.items() if any(c[: len(p)] == p for p in places)]

    @functools.cached_property
    def _write_plan(self) -> tuple[list[int], int]:
        """The written numbers the device computes (indices), and how many outputs the
        assigned values take (the same on every call)."""
        pending = [j for j in range(len(self._written)) if j not in self._plan.host]
        n = sum(sum(1 for x in leaves if x is None) for _, _, leaves in self._assigned)
        return pending, n

    def _rules(self, fn: Callable) -> list:
        """For each output of an assigned value, its place's rule (`jaxdist._state.replica.
        rules`), found on the first call of this trace."""
        if self._place_rules is None:
            self._place_rules = _aggregation.rules(fn, self._assigned)
        return self._place_rules

    _place_rules: list | None = None

    @functools.cached_property
    def _written_varies(self) -> list[bool]:
        """For each output of an assigned value (a replica step's), whether it can
        differ across replicas (`jaxdist._state.replica.varies`)."""
        if self._replica is None:
            return []
        flags = _replica.varies(self._replica, self._jaxpr, self._rows, len(self._numbers))
        end = len(flags) - len(self._written)
        return flags[end - self._write_plan[1] : end]

    @functools.cached_property
    def _plan(self) -> _hostnum.HostPlan:
        first = len(self._jaxpr.invars) - len(self._numbers)
        return _hostnum.plan(self._jaxpr, first, range(len(self._written)))

    def inputs(
        self,
        fn: Callable,
        place: Callable[[Any], Any] | None = None,
        place_rows: Callable[[Any], Any] | None = None,
    ) -> list | None:
        """The captured arrays now, or None when ``fn``'s state no longer fits this trace
        (a watched number changed, an array changed shape or dtype, or moved); `reason`
        then says which check failed, naming the value.

        ``place`` puts a JAX array where the program reads it; the placed copy is kept
        while the state holds the same array (JAX arrays are immutable), so unchanged
        state is not copied again on every call. NumPy arrays are placed every call
        (they can change in place). The numbers the step writes that the host computes
        (`jaxdist._state.hostnum`) are stored here, in the same critical section as the read
        of the numbers they are computed from (two threads counting lose no count).
        """
        if self._nothing and not self._watched and not self._captured and captures_nothing(fn):
            return []  # a step that reads no state: nothing to check (a replayed call's case)
        fresh, self._fresh = self._fresh, False  # the call that traced it ran the step
        if fresh and self._assigns_captures:  # (the trace left its captures as it ends)
            self._rewrite(fn)
        with _promote.LOCK:
            out, self.reason = self._current(fn, fresh)
            if out is None:
                _checks.note_decline(self.reason)
                return None
            p = len(self._numbers)
            if place is not None:
                out[p:] = [self._place(k, v, place) for k, v in enumerate(out[p:])]
            if place_rows is not None and self._rows:
                for k, row in enumerate(self._rows):
                    if row:
                        out[p + k] = place_rows(out[p + k])
        return out

    def _current(self, fn: Callable, fresh: bool) -> tuple[list | None, str]:
        """The values read now, or None and why they do not fit this trace."""
        if (self._captured or not captures_nothing(fn)) and self._captures.differs(fn):
            return None, "it captures other objects (a closure cell or default argument)"
        if self._watched and not fresh and self._checker.changed(fn):
            if self._promote:
                _promote.remember(fn, _watch.moved_numbers(fn, self._watched))
            return None, _checks.what_changed(fn, self._watched)
        if self._nothing:
            return [], ""
        try:
            out = self._fetcher.values(fn)
        except _chains.Gone as e:
            return None, f"a value it read is no longer there ({e})"
        p = len(self._numbers)
        if self._rows and self._replica is not None:  # distributed values: their rows
            for k, row in enumerate(self._rows):
                if row:
                    chain = self._swaps[k][0]
                    out[p + k] = _replica.stacked_of(out[p + k], self._replica.num, fn, chain)
        for n, kind, chain in zip(out, self._types, self._numbers):
            if type(n) is not kind:
                where = _chains.describe(fn, chain)
                return None, f"{where} is now a {type(n).__name__}, not a {kind.__name__}"
        if not self._arrays_fit(out):
            misfit = self._misfit(fn, out[p:])
            if misfit:
                return None, misfit
        if self._aliases and not self._same_aliases(fn, out[p + len(self._swaps) :]):
            return None, "two names that held one array when it was traced now hold two"
        for chain in self._outs.values():
            try:
                _chains.fetch(fn, chain)
            except _chains.Gone:
                return None, f"{_chains.describe(fn, chain)}, which it returns, is gone"
        if self._numbers:
            wide = self._store_numbers(fn, out)
            if wide:
                return None, wide
        return out, ""

    @functools.cached_property
    def _captures(self) -> KeyWatch:
        """Whether the step captures other objects than traced (`captured_ids`)."""
        return KeyWatch(self._captured, self._strict, captures=True)

    @functools.cached_property
    def _arrays_fit(self) -> Callable[[list], bool]:
        """Whether the arrays read (``out`` after the numbers) have the shapes and dtypes
        traced, as one function made for this trace (a statement per array): each array's
        type is one known to be concrete (`_CONCRETE`), else `_misfit` tells."""
        p = len(self._numbers)
        names: dict[str, Any] = {"K": _CONCRETE, "J": CONCRETE_JAX, "A": [None] * len(self._weak)}
        lines = []
        for j, (_, shape, dtype) in enumerate(self._array_checks):
            names[f"s{j}"], names[f"d{j}"], names[f"w{j}"] = shape, dtype, self._weak[j]
            misfit = _MISFIT.format(j=j)
            lines += [f"v = out[{p + j}]", *(line.format(j=j, misfit=misfit) for line in _FIT)]
        source = "def fit(out):\n" + "".join(f"    {line}\n" for line in lines)
        exec(_chains.compiled(source + "    return True\n", "<jaxdist.state.calls>"), names)  # noqa: S102
        return names["fit"]

    @functools.cached_property
    def _weak(self) -> list[bool]:
        """Whether each array read (`_array_checks`) was weakly typed in the trace
        (``jnp.asarray(0.3)``: bfloat16 times it stays bfloat16, where a float32 array's
        product is float32), as the trace's inputs and constants say."""
        invars, constvars = self._jaxpr.invars, self._jaxpr.constvars
        first = len(invars) - len(self._numbers) - len(self._swaps)
        avals = [v.aval for v in invars[first : first + len(self._swaps)]]
        avals += [constvars[i].aval for i, *_ in self._lifted]
        return [bool(getattr(a, "weak_type", False)) for a in avals]

    def _misfit(self, fn: Callable, arrays: list) -> str:
        """Which array read is not a concrete array of its traced shape, dtype and weak
        type, in words; "" if none (its type is then known to be concrete: `_CONCRETE`)."""
        for v, (chain, shape, dtype), weak in zip(arrays, self._array_checks, self._weak):
            now_weak = getattr(v, "weak_type", False)
            if (
                not is_concrete_array(v)
                or v.shape != shape
                or v.dtype != dtype
                or now_weak is not weak
            ):
                now = f"{v.dtype}{list(v.shape)}" if is_concrete_array(v) else type(v).__name__
                now = f"weakly typed {now}" if now_weak and not weak else now
                was = f"{'weakly typed ' if weak else ''}{dtype}{list(shape)}"
                return f"{_chains.describe(fn, chain)} is now {now}, not {was}"
            if type(v) not in _CONCRETE and len(_CONCRETE) < 64:
                _CONCRETE.add(type(v))
                is_concrete_jax(v)  # (a JAX array's type kept for the aval's check)
        return ""

    def _store_numbers(self, fn: Callable, out: list) -> str:
        """Stores the written numbers the host computes (Python's arithmetic, from the
        numbers in ``out``); numbers only the host reads go to the device as zeros. An
        integer the device computes with that is past int32 (where it would wrap) makes
        the step's integers part of its trace instead, with a warning: why, or ""."""
        values, wide = self._plan.run(out[: len(self._numbers)])
        if wide:
            return self._too_wide(fn, out)
        stored = [self._numbers[self._written[j][0]] for j in self._plan.host]
        self._unread = [(c, out[self._numbers.index(c)]) for c in stored]
        for (chain, old), value in zip(self._unread, values):
            _promote.put(fn, chain, _promote.like(old, value))  # an np.float32 stays one
        for i in range(len(self._numbers)):
            if i not in self._plan.device:
                out[i] = type(out[i])(0)
        return ""

    _unread: list = []

    def unread(self, fn: Callable) -> None:
        """Puts back the numbers the last `inputs` stored (its call did not run: the
        caller takes another program), so that a counter counts that call once."""
        with _promote.LOCK:
            for chain, value in self._unread:
                _promote.put(fn, chain, value)
            self._unread = []

    def _too_wide(self, fn: Callable, out: list) -> str:
        if self._wide:  # warned once: this trace is not used again
            return self._wide
        ints = [i for i in sorted(self._plan.device) if type(out[i]) is int]
        chains = [self._numbers[i] for i in ints]
        _promote.make_static(fn, chains)
        what = ", ".join(f"{_chains.describe(fn, c)} = {out[i]}" for i, c in zip(ints, chains))
        warnings.warn(
            f"The step {describe(fn)} computes on the device with an integer past int32 "
            f"(JAX without x64), from {what}: the device would wrap it, so these are part "
            "of the trace from now on (each new value traces again; JAX refuses a Python "
            "int past int32 in an array operation). Pass it to strategy.run as an argument "
            "if it changes on every call, or compute with it in Python.",
            RuntimeWarning,
            stacklevel=6,
        )
        self._wide = f"{what} computes past int32 on the device"
        return self._wide

    _wide = ""
    _holds_slots = False

    def _same_aliases(self, fn: Callable, values: list) -> bool:
        for k, chain in self._aliases:
            try:
                if not _chains.same_array(_chains.fetch(fn, chain), values[k]):
                    return False
            except _chains.Gone:
                return False
        return True

    def _place(self, k: int, v: Any, place: Callable[[Any], Any]) -> Any:
        if not isinstance(v, jax.Array):
            return place(v)
        if not self._holds_slots:  # (its slots go with it: `jaxdist._state.placed.release`)
            self._holds_slots = True
            weakref.finalize(self, _placed.release, id(self))
        return _placed.placed(v, place, (id(self), k))  # (this trace's k-th array input)

    def output(self, fn: Callable, value: Any) -> Any:
        """An untraced output ``value`` of the trace, as ``fn``'s state holds it now."""
        chain = self._outs.get(id(value))
        if chain is None:
            return value
        held = getattr(_READ, "values", None)  # (read before `write_back` assigned there)
        if held is not None and held[0] is self and id(value) in held[1]:
            return held[1][id(value)]
        return _chains.fetch(fn, chain)


def _fresh(constant: Any) -> Any:
    """A Python value the trace assigned, as written back by one call: a set a new one
    each time (the host may change the one it holds in place; the trace's stays as
    traced)."""
    return set(constant) if type(constant) is set else constant
