"""Compiling and dispatching jaxdist's programs: the one module that calls `jax.pmap`.

* `pmap` wraps `jax.pmap` over a strategy's replica axis, always through the
  attribute, so that `chex.fake_pmap` can replace it.
* `steps` is the one compile cache of user step functions. A bound method's
  steps are held weakly by its object (dropping it frees them); a plain
  function's are found by its code and globals (`CodeKey`), in a bounded LRU,
  so that a step defined inside each call reuses its compiled program.
* `collective` caches the programs of the cross-device ops (bounded LRU).
* `dispatch` runs every collective program jaxdist launches eagerly, within
  the in-flight bound of `jaxdist._base.inflight` (on CPU).
"""

from __future__ import annotations

import collections
import functools
import threading
import types
import warnings
import weakref
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdist._base import inflight as _inflight
from jaxdist._base.devices import AXIS, Replicas
from jaxdist._base.layout import globalize
from jaxdist._base.validate import describe
from jaxdist._state import checks as _checks
from jaxdist._state import recheck as _recheck

# -- pmap ---------------------------------------------------------------------------------


def pmap(fn: Callable, replicas: Replicas, in_axes: tuple | int) -> Callable:
    """`jax.pmap` of ``fn`` over ``replicas`` (through the attribute, for `chex.fake_pmap`)."""
    return jax.pmap(fn, axis_name=AXIS, in_axes=in_axes, devices=list(replicas.devices))


def spmd(fn: Callable, replicas: Replicas, in_axes: tuple) -> Callable:
    """``fn`` mapped over ``replicas`` like `pmap` (``in_axes`` 0 or None per argument,
    outputs stacked), as a `jax.shard_map` over the replicas' global mesh.

    Inside a trace with replicas in several processes: `jax.pmap` maps over this
    process's devices only, while traced values are global arrays.
    """
    mesh = replicas.sharding.mesh
    split, whole = replicas.sharding.spec, replicas.replicated.spec

    def body(*args: Any) -> Any:
        rows = [a[0] if ax == 0 else a for a, ax in zip(args, in_axes)]
        return jax.tree.map(lambda o: jnp.asarray(o)[None], fn(*rows))

    specs = tuple(split if ax == 0 else whole for ax in in_axes)
    return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=split, check_vma=False)


def is_fake_pmap() -> bool:
    """Whether `jax.pmap` is replaced (e.g. by `chex.fake_pmap`)."""
    return jax.pmap is not _REAL_PMAP


_REAL_PMAP = jax.pmap


# -- quick compilation -----------------------------------------------------------------------

# XLA's CPU debug options (XLA has no stability promise for them; a jaxlib without one
# rejects it at compile time, and `quick_options` then leaves that one out: jaxlib 0.11 and
# later have no ``xla_cpu_use_fusion_emitters``):
# LLVM optimization level 1 and XLA's classic fusion emitters instead of the MLIR ones.
# They compile the demo's partial-batch program in 0.46 s instead of 1.0 s, and it runs
# in 0.35 ms instead of 0.29 ms (level 0: 0.19 s, but 0.8 ms, too slow for later steps):
# the right trade for a program run once per epoch.
QUICK_CPU: dict[str, Any] = {
    "xla_backend_optimization_level": 1,
    "xla_cpu_use_fusion_emitters": False,
}


def quick_options(replicas: Replicas) -> dict[str, Any]:
    """``compiler_options`` for `jax.jit` that compile fast: those of `QUICK_CPU` that this
    jaxlib accepts, on CPU; none elsewhere."""
    if not replicas.on_cpu:
        return {}
    return {k: v for k, v in QUICK_CPU.items() if _accepted(k, v)}


@functools.cache
def _accepted(name: str, value: Any) -> bool:
    try:
        jax.jit(lambda x: x + 1).lower(np.float32(0)).compile({name: value})
    except Exception:  # noqa: BLE001 - an XLA without this option: compile without it
        return False
    return True


# -- the compile cache, weak on the user's function ---------------------------------------


def _owner(fn: Callable) -> tuple[Any, Hashable]:
    """What the cache holds weakly for ``fn`` (a bound method: its object), and a sub-key.

    A plain function is keyed by its code and globals instead (`CodeKey`): a step defined
    inside each call (``def train_fn(x): ...`` in a trainer's ``train_step``) is a new
    function object every time, with the same code and the same captured objects.
    """
    if isinstance(fn, types.MethodType):
        return fn.__self__, ("method", fn.__func__)
    if isinstance(fn, types.FunctionType):
        return CodeKey(fn.__code__, id(fn.__globals__)), ()
    return fn, ()


class CodeKey(tuple):
    """A plain function's code and globals: its steps are found by what it runs, not by
    the function object (a closure made again on every call finds its compiled step).
    What it captures is read afresh on every call (`jaxdist._state.stage`), as for one
    function whose state changed; a new class, number or shape there traces again."""

    __slots__ = ()

    def __new__(cls, code: types.CodeType, globals_id: int) -> CodeKey:
        return tuple.__new__(cls, (code, globals_id))


def weak_callable(fn: Callable) -> Callable[[], Callable]:
    """A function returning ``fn`` that does not keep ``fn`` (or a method's object) alive."""
    owner = fn.__self__ if isinstance(fn, types.MethodType) else fn
    try:
        ref = weakref.ref(owner)
    except TypeError:
        return lambda: fn
    if isinstance(fn, types.MethodType):
        func = fn.__func__
        return lambda: types.MethodType(func, _alive(ref()))
    return lambda: _alive(ref())


def _alive(x: Any) -> Any:
    if x is None:
        raise RuntimeError("jaxdist: a step function was garbage-collected while being traced.")
    return x


WARN_AT = 8


class StepCache:
    """Compiled steps per user function; entries die with the function."""

    def __init__(self) -> None:
        # id(owner) -> (weak reference to it, its table): by identity, so that looking up
        # runs none of the owner's code (``__hash__``, ``__eq__``) and two objects that
        # compare equal keep programs of their own; the reference's callback drops it
        self._weak: dict[int, tuple[weakref.ref, collections.OrderedDict]] = {}
        self._strong: collections.OrderedDict = collections.OrderedDict()
        self._builds: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # per function
        self._lock = threading.RLock()

    def _table(self, owner: Any) -> collections.OrderedDict:
        if type(owner) is CodeKey:
            return self._remember(owner, owner)
        found = self._lookup(owner)
        if found is not None:
            return found
        key = id(owner)
        try:
            ref = weakref.ref(owner, functools.partial(self._drop, key))
        except TypeError:  # not weakly referenceable: the bounded strong LRU
            return self._remember(key, owner)
        table: collections.OrderedDict = collections.OrderedDict()
        self._weak[key] = (ref, table)
        return table

    def _drop(self, key: int, ref: weakref.ref) -> None:
        entry = self._weak.get(key)
        if entry is not None and entry[0] is ref:  # not a newer object with the same id
            self._weak.pop(key, None)

    def _remember(self, key: Hashable, owner: Any) -> collections.OrderedDict:
        table = self._strong.setdefault(key, (owner, collections.OrderedDict()))[1]
        self._strong.move_to_end(key)
        while len(self._strong) > _STRONG_MAX:
            self._strong.popitem(last=False)
        return table

    def _lookup(self, owner: Any) -> collections.OrderedDict | None:
        key: Hashable = owner if type(owner) is CodeKey else id(owner)
        weak = self._weak.get(key) if type(key) is int else None
        if weak is not None:
            return weak[1] if weak[0]() is owner else None
        entry = self._strong.get(key)
        if entry is None or entry[0] is not owner and type(owner) is not CodeKey:
            return None
        try:
            self._strong.move_to_end(key)
        except KeyError:  # dropped by another thread meanwhile
            pass
        return entry[1]

    def get(
        self,
        fn: Callable,
        key: Hashable,
        build: Callable[[], Any],
        inputs: Callable[[Any], list | None] | None = None,
        staged: Callable[[Any], Any] | None = None,
    ) -> tuple[Any, list]:
        """The compiled step of ``fn`` for ``key`` (built and kept if missing), and its
        per-call inputs ``inputs(entry)``; an entry for which that is None (the state
        it was traced with has changed) is passed over and a new one is built.
        ``staged(entry)`` is an entry's `jaxdist._state.stage.Staged`: under the check
        mode (`jaxdist._state.recheck`) a found entry is compared with a new trace."""
        owner, sub = _owner(fn)
        try:  # the hot path: no lock, no new weak reference
            variants = (self._lookup(owner) or _NONE)[(sub, key)]
        except (KeyError, TypeError):
            variants = ()
        found = self._find(variants, inputs)
        if found is not None and staged is not None and _recheck.state_checks():
            found = _checked(fn, found[0], build, inputs, staged)
        if found is not None:
            return found
        with self._lock:
            table = self._table(owner)
            variants = table.setdefault((sub, key), [])
            table.move_to_end((sub, key))
            while len(table) > _SIGNATURES:  # the least recently built signature goes
                table.popitem(last=False)
            # a step of an object that cannot be weakly referenced (``__slots__``) is
            # only here, and another thread may have built this one meanwhile
            _checks.note_decline("")
            found = self._find(variants, inputs)
            if found is not None:
                return found
            entry = build()
            extra = inputs(entry) if inputs is not None else []
            if extra is None:
                raise RuntimeError(
                    f"jaxdist: the state {describe(fn)} reads changed while it was traced."
                )
            variants.insert(0, entry)
            del variants[_VARIANTS:]
            if type(owner) is CodeKey:  # this function's traces, or its code's
                self._builds[fn] = self._builds.get(fn, 0) + 1
                counts: tuple = (self._builds[fn], len(variants))
            else:
                counts = (self._count(table, sub),)
            if WARN_AT in counts:
                _warn_retrace(fn, _checks.last_decline(), key)
            return entry, extra

    @staticmethod
    def _find(variants: Any, inputs: Callable[[Any], list | None] | None) -> Any:
        for entry in list(variants):
            extra = inputs(entry) if inputs is not None else []
            if extra is not None:
                return entry, extra
        return None

    @staticmethod
    def _count(table: dict, sub: Hashable) -> int:
        return sum(len(v) for (s, _), v in table.items() if s == sub)

    def entries(self, fn: Callable) -> list:
        """The cached entries of ``fn`` (of its code, for a plain function), newest first."""
        owner, sub = _owner(fn)
        with self._lock:
            table: dict = self._lookup(owner) or {}
            return [e for (s, _), v in reversed(table.items()) if s == sub for e in v]

    def size(self, fn: Callable) -> int:
        """How many compiled steps the cache holds for ``fn`` (its number of traces)."""
        owner, sub = _owner(fn)
        with self._lock:
            if type(owner) is CodeKey:  # the traces this function object made
                return self._builds.get(fn, 0)
            return self._count(self._lookup(owner) or {}, sub)


def _checked(fn: Callable, entry: Any, build: Callable, inputs: Any, staged: Callable) -> Any:
    """The check mode's call of a found ``entry``: the step traced again (its warnings
    said already), compared with the entry's trace, then the entry's inputs read again
    (None: the trace changed the state it reads; the caller builds anew)."""
    cached = staged(entry)
    cached.unread(fn)  # the numbers the read stored put back: the trace sees the call's
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fresh = staged(build())
    _recheck.check(fn, cached.record(fn), fresh.record(fn))
    extra = inputs(entry) if inputs is not None else []
    return None if extra is None else (entry, extra)


_NONE: dict = {}
_SIGNATURES = 64  # argument signatures kept per object or code (least recent dropped)
_VARIANTS = 8  # traces kept per argument signature (one per state the step was seen with)
_STRONG_MAX = 128  # plain functions' code (and objects without weak references) kept


def _weakrefable(x: Any) -> bool:
    try:
        weakref.ref(x)
        return True
    except TypeError:
        return False


def _warn_retrace(fn: Callable, reason: str, key: Hashable = None) -> None:
    why = f" This trace was made because {reason}." if reason else ""
    if isinstance(key, tuple) and key and key[0] == "jd.function":
        warnings.warn(
            f"jd.function {describe(fn)!r} has been traced {WARN_AT} times (TF's retracing "
            "warning). Each new argument structure, shape or dtype, each new non-numeric "
            "Python value in its arguments, and each new value of a Python string, bool or "
            "function it reads from its object, closure or globals traces it again; Python "
            f"numbers are traced once. Keep argument shapes fixed (pad the last batch, or "
            f"drop it).{why}",
            stacklevel=5,
        )
        return
    warnings.warn(
        f"strategy.run has compiled {describe(fn)!r} {WARN_AT} times. Each new argument "
        "structure, shape or dtype, and each new non-numeric Python value (bool, str, None...) "
        "in args compiles a new step; Python numbers are traced. So does a new value of a "
        "string or function the step reads from its closure, globals or object, or of a "
        "number there that its Python needs as a value (range(n), if n > 0); other numbers "
        "there are re-read on every call (one more compile, at their first change). Keep "
        "argument shapes fixed." + why,
        stacklevel=5,
    )


steps = StepCache()


def step_count(fn: Callable) -> int:
    """How many compiled steps are cached for ``fn`` (each one a trace of ``fn``); for a
    ``jd.function``, how many times it was traced.

    >>> import jax.numpy as jnp, jaxdist as jd
    >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    >>> def step(x):
    ...     return x * 2
    >>> for i in range(5):
    ...     _ = s.run(step, args=(i,))   # Python numbers are traced: one compile
    >>> jd.experimental.step_count(step)
    1

    Raises:
        TypeError: ``fn`` is not callable (the function given to `Strategy.run`).
    """
    if not callable(fn):
        raise TypeError(
            "step_count(fn) takes the function given to strategy.run; "
            f"got {type(fn).__name__} {fn!r}."
        )
    return steps.size(getattr(fn, "python_function", fn))  # a jd.function: its traces


_COLLECTIVES: collections.OrderedDict = collections.OrderedDict()
_COLLECTIVES_MAX = 512


def collective(replicas: Replicas, key: Hashable, build: Callable[[], Callable]) -> Callable:
    """A cached pmapped program of the cross-device ops (all arguments mapped)."""
    full = (key, replicas.devices, jax.pmap)
    program = _COLLECTIVES.get(full)
    if program is None:
        program = _COLLECTIVES[full] = pmap(build(), replicas, 0)
        while len(_COLLECTIVES) > _COLLECTIVES_MAX:
            _COLLECTIVES.popitem(last=False)
    _COLLECTIVES.move_to_end(full)
    return program


def dispatch(program: Callable, replicas: Replicas, *args: Any, what: str = "") -> list:
    """Runs a pmapped program (returning a list of arrays) within the in-flight bound.

    With replicas in several processes, `jax.pmap` returns this process's rows;
    they become the global stacked arrays again (no copy).
    """
    outs = list(program(*args))
    if replicas.multi_process:
        outs = [globalize(a, replicas.sharding) for a in outs]
    if replicas.on_cpu and outs:
        _inflight.throttle(outs[0], what)
    return outs


def replica_ids(replicas: Replicas, traced: bool) -> Any:
    """``arange(R)``, the mapped argument of a step without one (a pmap needs one)."""
    if traced:
        return jnp.arange(replicas.num, dtype=jnp.int32)
    ids = _IDS.get(replicas.devices)
    if ids is None:
        ids = _IDS[replicas.devices] = jax.device_put(
            np.arange(replicas.num, dtype=np.int32), replicas.sharding
        )
    return ids


_IDS: dict[tuple, Any] = {}
