"""A step traced once, whose captured state is read again on every eager call.

`Staged` traces a step body to a jaxpr (`jax.make_jaxpr`, with the replica axis
bound when the body uses collectives). The arrays the body read from outside
its arguments are the jaxpr's constants; those that `jaxdist._state.capture.locate`
finds in the step's state become inputs of the program, fetched afresh on every
call (`Staged.inputs`), so an eager step never computes with a stale array and
is not traced again when only their values change. Python numbers of the state
that change between calls become inputs as well (`jaxdist._state.promote`). The program
itself is `Staged.evaluate`, which jaxdist then maps over the replicas (`jax.pmap`)
or compiles (`jax.jit`). What runs on each call (`Staged.inputs`, `Staged.write_back`)
is `jaxdist._state.calls`'s, which `Staged` derives from; the words a trace says of the
state it read are `jaxdist._state.reads`'s.

Why locate state once per trace rather than run the step's Python on every call
(TF eager's way, complete by construction): a fresh trace of an MLP training step
costs about a third of the step itself on CPU, so a step that reads no state could
not stay near raw `jax.pmap`. Where locating cannot know that a value is current,
the trace says so: a distributed value read as its stacked array is an error, a
NumPy array computed from NumPy state a warning.
"""

from __future__ import annotations

import collections
import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend.core import ClosedJaxpr, jaxpr_as_fun

from jaxdist._base import jax_internals as _jax_internals
from jaxdist._base.jax_internals import nested_consts
from jaxdist._base.layout import is_tracer
from jaxdist._base.validate import describe
from jaxdist._state import assign as _assign
from jaxdist._state import capture as _capture
from jaxdist._state import chains as _chains
from jaxdist._state import checks as _checks
from jaxdist._state import promote as _promote
from jaxdist._state import reads as _reads
from jaxdist._state import recheck as _recheck
from jaxdist._state import record as _record
from jaxdist._state import replica as _replica
from jaxdist._state import typed as _typed
from jaxdist._state import watch as _watch
from jaxdist._state.calls import Calls, is_concrete_array
from jaxdist._state.frozen import check_not_stacked
from jaxdist._state.keys import captured_ids
from jaxdist._values import layout as _value_layout


def _spec(x: Any) -> Any:
    aval = jax.typeof(x)
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=getattr(aval, "weak_type", False))


def released(fn: Callable) -> tuple[Callable, Callable[[], None]]:
    """``fn`` to give a JAX transformation for one trace, and a function that lets it go.

    JAX keeps what it traced in caches weak on the function given to it, whose entries can
    hold that function strongly (a cycle the weak reference never breaks, until the cache
    drops it); a step's trace closes over the step, its object and the objects passed to
    it. The function returned forwards to ``fn`` until released, then holds nothing.

    >>> forward, release = released(lambda x: x + 1)
    >>> forward(1)
    2
    >>> release(); forward.__closure__[0].cell_contents
    []
    """
    box = [fn]

    def forward(*args: Any, **kwargs: Any) -> Any:
        return box[0](*args, **kwargs)

    return forward, box.clear


def example(x: Any, mapped: bool) -> Any:
    """The abstract value of one replica's part of ``x`` (a row when ``mapped``)."""
    spec = _spec(x)
    if mapped:
        return jax.ShapeDtypeStruct(spec.shape[1:], spec.dtype, weak_type=spec.weak_type)
    return spec


_NOWHERE = object()  # what `locate_all` looks for in place of a fed array: never found


class Staged(Calls):
    """``body`` traced once on ``examples``; what it read from ``fn``'s state is an input.

    Args:
        fn: the user's step function (where captured state is looked for).
        body: the function to trace; takes the flat arguments, returns a list of arrays.
        examples: abstract values of the arguments.
        axis_env: ``[(axis_name, size)]`` when ``body`` uses collectives.
        outputs: a function giving, after the trace, the arrays ``body`` returned
            that are not traced (read again on every call too, when found).
        numbers: whether Python numbers of the state that change between calls become
            inputs (`jaxdist._state.promote`; the caller then calls `write_back` after each
            call, for the numbers the step itself changes).
    """

    def __init__(
        self,
        fn: Callable,
        body: Callable[..., list],
        examples: Sequence[Any],
        axis_env: list | None = None,
        outputs: Callable[[], list] = list,
        numbers: bool = False,
        writes: bool = False,
        fed: Callable[[], list] | None = None,
        replica: _replica.Replica | None = None,
    ) -> None:
        # the Python values read before the trace: a step that changes one (``self.n +=
        # 1``) makes the number an input of the program (`jaxdist._state.promote`)
        seen: list = []
        watched = _watch.watch(fn, seen)
        self._recording: Any = _record.Recording(fn, seen)  # what the traces read, as they run
        del seen
        _retrace_jitted_helpers(watched)
        first = _promote.promoted(fn) if numbers else ()
        before = {id(a): a for a in jax.live_arrays()}  # kept: no id is reused meanwhile
        self._whole = writes  # (a jd.function reads distributed values whole, as TF does)
        # a replica step's assignments are variable updates (none where its state is arguments)
        self._writes = writes or (replica is not None and not _replica.is_explicit(fn))
        self._replica = replica
        self._fed_arrays = fed or list
        # the distributed values of its state, read per replica (`jaxdist._state.replica`)
        dist = [] if replica is None else _replica.places(fn, replica.num)
        rows = [(c, _replica.row_spec(v)) for c, v in dist]
        closed, numbers_used = self._trace(fn, body, examples, axis_env, first, rows)
        own = watched  # (the walk's; then what the trace was seen to read)
        watched += _watch.recorded(fn, self._recording.reads, own)
        counters = _watch.moved_numbers(fn, watched) if numbers else []
        if counters and _promote.remember(fn, counters):  # numbers the step changed
            for chain, value, _ in watched:
                if chain in counters:  # as before the trace: the program counts this call
                    _promote.put(fn, chain, value)
            closed, numbers_used = self._trace(
                fn, body, examples, axis_env, _promote.promoted(fn), rows
            )
        fed_ids = {id(a) for a in self._fed_arrays()}
        if fed_ids & {id(c) for c in nested_consts(closed.jaxpr)}:
            raise RuntimeError(
                f"The jd.function {describe(fn)} read a batch from a distributed iterator and "
                "a jitted function it calls closed over it (a constant of that function): "
                "pass the batch to that function as an argument."
            )
        meshed = _meshed(closed.consts) if replica is not None else []
        swaps, unfound_nested = self._nested(fn, closed, before, meshed)
        if swaps:  # arrays read inside nested jaxprs: traced again with tracers there
            _retrace_jitted_helpers(watched)  # (a helper's cached jaxpr holds them as constants)
            try:
                closed, numbers_used = self._trace(
                    fn, body, examples, axis_env, numbers_used, rows + swaps
                )
            except Exception:  # noqa: BLE001 - NumPy code on a NumPy array of the state
                unfound_nested += [a for _, a in swaps if isinstance(a, np.ndarray)]
                swaps = [(c, a) for c, a in swaps if not isinstance(a, np.ndarray)]
                closed, numbers_used = self._trace(
                    fn, body, examples, axis_env, numbers_used, rows + swaps
                )
        self._numbers = numbers_used
        self._rows = [True] * len(rows) + [False] * len(swaps)
        self._swaps = [(c, stacked_shape(v), r.dtype) for (c, r), (_, v) in zip(rows, dist)]
        self._swaps += [(c, a.shape, a.dtype) for c, a in swaps]
        self._types = [type(_chains.fetch(fn, c)) for c in numbers_used]
        self._promote = numbers
        recorded = _watch.unchanged_sizes(fn, _watch.recorded(fn, self._recording.reads, own))
        settled = _watch.settle(fn, own) + recorded
        self._watched = tuple(w for w in settled if w[0] not in numbers_used)
        _reads.warn_drawn(fn, [c for c, _ in self._recording.drawn])
        self._recording = None
        self._checker = _typed.Guarded(fn, self._watched, _watch.Checker)
        where = _watch.leaked(fn)
        if where is not None:
            raise _reads.stored_tracer(fn, where)
        self._lift(fn, closed, outputs, before, unfound_nested)
        # (without the values it read: JAX 0.12's jaxpr carries them, and would keep them alive)
        self._outputs, self._jaxpr = outputs, _jax_internals.detached(closed)
        chains = [*self._numbers, *(c for c, *_ in self._swaps), *(c for _, c, *_ in self._lifted)]
        self._read_chains = chains
        self._fetcher = _chains.Fetcher(chains)
        self._array_checks = [*self._swaps, *((c, s, d) for _, c, s, d in self._lifted)]
        self._fresh = True
        self.num_inputs = len(chains)
        # nothing to fetch, compare or place on a call: `inputs` ends after its checks
        self._nothing = not (chains or self._aliases or self._outs)
        self._fed_arrays = list  # (what read the fed elements held the call: not kept)

    def _lift(self, fn: Callable, closed: Any, outputs: Callable, before: dict, nested: list):
        """The arrays read from state that are constants of the trace become inputs (and
        those of ``fed`` elements: inputs given after the state's)."""
        fed = {id(a): j for j, a in enumerate(self._fed_arrays())}
        self._n_fed = len(fed)
        self._fed = [(i, fed[id(c)]) for i, c in enumerate(closed.consts) if id(c) in fed]
        consts: list[Any] = [None if id(c) in fed else c for c in closed.consts]
        out_consts = [x for x in outputs() if is_concrete_array(x)]
        limits: dict = {}
        probe = [_NOWHERE if c is None else c for c in consts] + out_consts
        found = _capture.locate_all(fn, probe, limits) if len(fed) < len(probe) else []
        chains = [c[0] if c else None for c in found] or [None] * len(probe)
        if not self._whole:  # (jd.function reads distributed values whole, as TF does)
            check_not_stacked(fn, chains[: len(consts)], consts)
        unfound = [c for c, ch in zip(consts, chains) if ch is None and c is not None]
        if limits.get("numpy") or any(isinstance(c, np.ndarray) for c in nested):
            strided = [_chains.describe(fn, c) for c in limits.get("strided", [])]
            _reads.warn_numpy_copies(fn, unfound + nested, strided)
        if not limits.get("truncated"):  # (`locate_all` has warned then)
            _reads.warn_unfound_arrays(fn, [c for c in unfound if id(c) in before] + nested)
        lifted = [(i, c) for i, c in enumerate(chains[: len(consts)]) if c is not None]
        self._lifted = [(i, c, np.shape(consts[i]), consts[i].dtype) for i, c in lifted]
        # one array read under two names was traced as one: valid while they hold one array
        self._aliases = [(k, c) for k, (i, _) in enumerate(lifted) for c in found[i][1:]]
        for i, _ in lifted:
            consts[i] = None  # not kept: read again on every call
        # valid for another function of the same code only if it captures the same
        # objects (its arrays and numbers are read afresh, unless some were baked in)
        self._strict = any(c is not None for c in consts)
        self._captured = captured_ids(fn, self._strict)
        self._consts = consts
        self._outs = {id(x): c for x, c in zip(out_consts, chains[len(consts) :]) if c is not None}

    @staticmethod
    def _nested(fn: Callable, closed: Any, before: dict, meshed: list) -> tuple[list, list]:
        """The arrays of the state read inside nested jaxprs (a jitted helper; a
        ``strategy.run`` traced inside ``jd.function``), and ``meshed`` (arrays placed on
        a mesh, whose sharding a replica step's jaxpr must not hold as a constant's):
        ``[(chain, array)]`` where a tracer can be put in their place (a NumPy view: in
        its array's place), and the arrays that stay constants."""
        nested = meshed + [
            c
            for c in nested_consts(closed.jaxpr)
            if (isinstance(c, jax.Array) and not is_tracer(c) and id(c) in before)
            or (isinstance(c, np.ndarray) and c.dtype != object)
        ]
        if not nested:
            return [], []
        found = _capture.locate_all(fn, nested)
        swaps, kept, seen = [], [], set()
        for array, chains in zip(nested, found):
            bases = [c[:-1] if c[-1][0] == "view" else c for c in chains]
            chain = next((c for c in bases if _assign.can_replace(fn, c)), None)
            if chain is None:
                kept.append(array)
            elif chain not in seen:
                seen.add(chain)
                swaps.append((chain, _chains.fetch(fn, chain)))
        return swaps, kept

    def _trace(
        self,
        fn: Callable,
        body: Callable,
        examples: Sequence,
        axis_env: Any,
        numbers,
        swaps=(),
        fallback: bool = True,
    ):
        """``body`` traced with the arrays at ``swaps`` and the numbers at ``numbers`` as
        inputs after ``examples`` (numbers whose values the step needs static, unless not
        ``fallback``: then it raises); the trace and the numbers used. The numbers are the
        last inputs and the numbers the step wrote the last outputs (`jaxdist._state.hostnum`)."""
        self._written: list = []
        self._assigned: list = []
        self._copied: list = []  # ``(output, number)``: a number input assigned as it is
        self._moved: list = []  # ``(chain, source chain)``: `jaxdist._state.assign.moved_places`
        chains = [c for c, _ in swaps]

        def traced(*args: Any) -> list:
            k = len(args) - len(numbers) - len(swaps)
            mine, nums = args[k : k + len(swaps)], args[k + len(swaps) :]
            with _promote.Swapped(fn, numbers, nums) as swap:
                with _assign.Swapped(fn, chains, list(mine)) as arrays:
                    before = _assign.snapshot(fn) if self._writes else {}
                    try:
                        with self._recording:
                            outs = list(body(*args[:k]))
                    except BaseException:
                        if self._writes:  # what it assigned before failing is put back
                            with contextlib.suppress(RuntimeError):  # (its own error is the one)
                                self._take_assigned(fn, before, set(numbers))
                        raise
                    arrays.check_written()
                    if not self._writes and arrays.written:
                        where = _chains.describe(fn, chains[arrays.written[0][0]])
                        raise _reads.stored_tracer(fn, where)
                    extra = (
                        self._take_assigned(fn, before, set(numbers), nums) if self._writes else []
                    )
            self._written = swap.written
            return outs + extra + [jax.numpy.asarray(v) for _, v in swap.written]

        specs = [a if isinstance(a, jax.ShapeDtypeStruct) else _spec(a) for _, a in swaps]
        specs += [_promote.spec(_chains.fetch(fn, c)) for c in numbers]
        forward, release = released(traced)
        make = jax.make_jaxpr(forward, axis_env=axis_env or [])
        try:
            if not numbers or not fallback:
                return make(*examples, *specs), tuple(numbers)
            try:
                return make(*examples, *specs), tuple(numbers)
            except Exception:  # noqa: BLE001 - the step needs a number's value: keep it static
                return self._trace_static(fn, body, examples, axis_env, numbers, swaps)
        finally:
            release()

    def _take_assigned(self, fn: Callable, before: dict, skip: set, numbers=()) -> list:
        """What the traced function assigned into its state (``self.params = new``): the
        places recorded for `write_back`, the objects put back, the new arrays returned;
        where one is a number input itself (``self.last_lr = self.lr``), it is noted, to be
        written back as the number it was (`jaxdist._state.calls`)."""
        records, out = _assign.take_assigned(
            fn, before, skip, _refuse_appends, constants=True, moved=self._moved
        )
        base = sum(sum(1 for x in leaves if x is None) for _, _, leaves in self._assigned)
        self._assigned += records
        index = {id(t): j for j, t in enumerate(numbers)}
        self._copied += [(base + k, index[id(x)]) for k, x in enumerate(out) if id(x) in index]
        return out

    def _trace_static(
        self, fn: Callable, body: Callable, examples: Sequence, axis_env, numbers, swaps
    ):
        """The trace where the step needs some numbers' values (``range(self.n)``): the
        first number whose value alone makes the trace work stays static, the others
        inputs; all static where no single one does (or the step fails anyway)."""
        for chain in numbers if len(numbers) > 1 else ():
            rest = tuple(c for c in numbers if c != chain)
            try:
                found = self._trace(fn, body, examples, axis_env, rest, swaps, fallback=False)
            except Exception:  # noqa: BLE001 - not this one alone
                continue
            _promote.make_static(fn, [chain])
            return found
        _promote.make_static(fn, numbers)
        return self._trace(fn, body, examples, axis_env, (), swaps)

    def evaluate(self, *args: Any) -> list:
        """The program: the traced body on ``args``, then the state's inputs in the order
        `inputs` gives them (numbers, arrays put in place, captured arrays) and the fed
        arrays (the jaxpr takes the numbers last)."""
        k = len(args) - len(self._lifted) - self._n_fed
        consts = list(self._consts)
        for (i, *_), v in zip(self._lifted, args[k:]):
            consts[i] = v
        fed = args[len(args) - self._n_fed :]
        for i, j in self._fed:
            consts[i] = fed[j]
        n, s = len(self._numbers), len(self._swaps)
        head, nums, swaps = args[: k - n - s], args[k - n - s : k - s], args[k - s : k]
        return jaxpr_as_fun(ClosedJaxpr(self._jaxpr, consts))(*head, *swaps, *nums)

    @property
    def input_rows(self) -> list[bool]:
        """For each input after the body's arguments (`inputs`' order), whether it is a
        distributed value's stacked array, mapped over the replicas (one row each)."""
        return [False] * len(self._numbers) + self._rows + [False] * len(self._lifted)

    def state(self, fn: Callable) -> dict[str, list[str]]:
        """What this trace reads of ``fn``'s state, as Python names it (`explain`)."""
        name = functools.partial(_chains.describe, fn)
        host = {self._written[j][0] for j in self._plan.host}
        return {
            "arrays": [name(c) for c, *_ in self._array_checks],
            "numbers": [name(c) for c in self._numbers],
            "written": [
                name(self._numbers[i]) + (" (Python's arithmetic)" if i in host else "")
                for i, _ in self._written
            ],
            "checked": [_checks.shown(fn, w) for w in self._watched],
        }

    def record(self, fn: Callable) -> dict:
        """What this trace computes with, for the check mode (`jaxdist._state.recheck`):
        the places of the state it reads and writes, its constants, its untraced outputs
        (those not read from the state again) and its program's text."""
        name = functools.partial(_chains.describe_safely, fn)
        program, constants = _recheck.program_form(self._jaxpr, self._consts)
        return {
            "reads": [name(c) for c in self._read_chains],
            "writes": [name(c) for c, *_ in self._assigned],
            "constants": constants,
            "returned": [x for x in self._outputs() if id(x) not in self._outs],
            "program": program,
        }


def _retrace_jitted_helpers(watched: Sequence) -> None:
    """The jitted functions the step reaches (``@jax.jit`` helpers) forget their traces: JAX
    keeps a helper's jaxpr per argument types, with the arrays it read from globals then as
    constants, so a helper traced before a global was rebound would bring the old array into
    this trace (where no place of the state holds it: a stale constant). Traced again here,
    it reads the state as it is, and the arrays it reads become the step's inputs."""
    for _, value, how in watched:
        if how == "weak":  # (functions and callables are watched by a weak reference)
            value = value()
        kind = type(value)
        if kind.__module__.startswith("jaxlib") and callable(getattr(kind, "clear_cache", None)):
            value.clear_cache()


def _meshed(consts: list) -> list:
    """The arrays among a replica step's constants placed with a sharding over a mesh
    (written back by a ``jd.function``, placed by the user or Keras): traced as inputs,
    their mesh (an Auto axis) is not replayed inside the replicas' map (a Manual one)."""
    return [c for c in consts if isinstance(c, jax.Array) and not is_tracer(c) and _on_a_mesh(c)]


def _on_a_mesh(x: jax.Array) -> bool:
    """Whether ``x``'s sharding, or its type's (an array a program made under a mesh), names
    a mesh's axes."""
    if isinstance(x.sharding, jax.sharding.NamedSharding):
        return True
    mesh = getattr(getattr(jax.typeof(x), "sharding", None), "mesh", None)
    return bool(getattr(mesh, "axis_names", ()))


def stacked_shape(value: Any) -> tuple:
    """The shape of a distributed value's stacked array (its replicas first)."""
    return tuple(_replica.stacked_of(value, _value_layout.num_components(value)).shape)


def _refuse_appends(fn: Callable, places: list) -> None:
    """Raises (the state put back first) where the trace appended a traced value to a list
    of the state (``self.history.append(loss)``): a list's growth is not an assignment a
    ``jd.function`` can repeat on every call, and TF's ``tf.function`` runs such an append
    once, when it traces."""
    grown = []
    for chain, old, _ in places:
        if old is _assign.MISSING and chain[-1][0] == "item":
            try:
                kind = type(_chains.fetch(fn, chain[:-1]))
            except _chains.Gone:
                continue
            if kind in (list, collections.deque):
                grown.append((chain, kind.__name__))
    if not grown:
        return
    _assign.restore(fn, [(chain, old) for chain, old, _ in places])
    where, kind_name = _chains.describe(fn, grown[0][0][:-1]), grown[0][1]
    raise RuntimeError(
        f"The jd.function {describe(fn)} appended a value it computed to {where} (a "
        f"{kind_name}) "
        "while it was traced: a jd.function writes back what it assigns, and a list's growth "
        "is not an assignment it can repeat on every call (TF's tf.function runs such an "
        "append once, when it traces). Return the value and append it outside the "
        f"jd.function (value = step(x); {where}.append(value)), or keep it in a dict entry "
        "or an attribute the function assigns."
    )
