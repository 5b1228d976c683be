"""One replica as its own topology: a step compiled without a stacked replica axis.

`jax.pmap` gives every output a leading replica axis, so on one device each leaf of
a step's result used to be unstacked by its own eager ``reshape`` (TF unwraps one
replica's results to plain values): one dispatch per leaf. Here the step (the
per-replica program `jaxdist._state.stage.Staged` traced) is mapped with `jax.vmap` over a
replica axis of size one inside one `jax.jit`, which adds and removes that axis
itself: an eager call is one cached dispatch (the C++ fast path of `jax.jit`) whose
outputs are already plain arrays, and a collective over the one replica is a
reduction over an axis of size one, which XLA removes (no ``all-reduce`` is left in
the program, where XLA's CPU compiler keeps a one-member one under `jax.pmap`).

A distributed argument enters as its stacked array (shape ``(1, *shape)``) and is
unstacked inside the program; which arguments are stacked is a static argument of
the `jax.jit`, so a `PerReplica` and a plain array share one trace of the step.

A repeated eager call replays the first call's `Plan` (kept per step function by `Plans`,
held weakly): ``_run.run`` then costs, beyond `jax.jit`'s own dispatch, an identity check
of the strategy, a tree flatten, a comparison of the leaves' types (and static values, by
identity first), the re-read of the step's state and the result's unflatten. A `Program` is
one trace: called with arguments `jax.jit` would trace again, it raises `Retrace`, and the
call takes the full path (which compiles a new program for the new signature).
"""

from __future__ import annotations

import functools
import types
import weakref
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jaxdist._base.devices import AXIS, Replicas
from jaxdist._state import arguments as _arguments


def vmapped(fn: Callable, in_axes: Sequence[int | None]) -> Callable:
    """``fn`` mapped over a replica axis of size one (`jax.pmap`'s calling convention:
    ``in_axes`` 0 for a stacked argument, None for a broadcast one; outputs stacked).

    A broadcast argument stays unbatched, so what is computed from it alone is the
    same program as without the map (no batch axis of size one through the dots), and
    a collective of it over the one replica is the value itself.

    >>> import jax.numpy as jnp
    >>> from jax import lax
    >>> f = vmapped(lambda x, y: [lax.psum(x * y, "replica")], (0, None))
    >>> f(jnp.ones((1, 2)), 3.0)[0].tolist()
    [[3.0, 3.0]]
    """
    return jax.vmap(fn, in_axes=tuple(in_axes), axis_name=AXIS, axis_size=1)


def program(evaluate: Callable, replicas: Replicas) -> Program:
    """The compiled one-replica step (see `Program`)."""
    return Program(evaluate, replicas.first_device)


def _row(aval: Any, stacked: bool | None) -> tuple:
    """What of one argument decides the trace: one replica's shape, dtype and weak type
    (``stacked`` None: a value of the step's state, whose weak type does not count)."""
    if stacked is None:
        return (aval.shape, aval.dtype)
    return (aval.shape[1:] if stacked else aval.shape, aval.dtype, aval.weak_type)


class Retrace(Exception):
    """A `Program` was called with arguments of other shapes or dtypes than it was traced
    for (a `Plan` replaying it on a changed call: the caller takes the full path)."""


class Program:
    """``program(stacked, *args)`` runs ``evaluate`` (the per-replica program, with the
    replica ids as its first argument) on ``args``, where ``stacked[i]`` says that
    ``args[i]`` carries a leading replica axis of size one (None: it is a value read
    from the step's state). It returns a list of plain (unstacked) arrays committed to
    ``device``, in one dispatch.

    ``evaluate`` is one trace of the step, valid for the abstract values it was traced
    on: the first call's. A later call whose arguments `jax.jit` would trace again (a new
    shape, dtype or weak type) raises `Retrace` instead of tracing ``evaluate`` on values
    it was not made for; so `jax.jit`'s own C++ cache check is the one check of the
    arguments' shapes a replayed call (`Plan`) needs.
    """

    def __init__(self, evaluate: Callable, device: jax.Device) -> None:
        self._device = jax.sharding.SingleDeviceSharding(device)
        self._avals: tuple | None = None
        self._evaluate = evaluate
        self._programs: dict[tuple, Callable] = {}  # `jax.jit` programs, by ``stacked``

    def jitted(self, stacked: tuple) -> Callable:
        """The `jax.jit` program for one ``stacked`` pattern, called with the arguments
        alone (one per pattern: a static argument would be hashed on every call)."""
        found = self._programs.get(stacked)
        if found is None:
            run = functools.partial(self._run, stacked)
            found = self._programs[stacked] = jax.jit(run, out_shardings=self._device)
        return found

    def _run(self, stacked: tuple, *args: Any) -> list:
        avals = tuple(_row(jax.typeof(a), s) for a, s in zip(args, stacked))
        if self._avals is None:
            self._avals = avals
        elif avals != self._avals:
            raise Retrace
        ids = jnp.zeros((1,), jnp.int32)
        axes = (0, *(0 if s else None for s in stacked))
        outs = vmapped(self._evaluate, axes)(ids, *args)
        return [o[0] for o in outs]

    def __call__(self, stacked: tuple, *args: Any) -> list:
        jitted = self.jitted(stacked)
        try:
            return jitted(*args)
        except ValueError:  # an argument committed to another device (pmap moved it)
            device = self._device
            moved = [jax.device_put(a, device) if isinstance(a, jax.Array) else a for a in args]
            return jitted(*moved)

    def lower(self, stacked: tuple, *args: Any) -> Any:
        """The program lowered for these arguments (`jax.stages.Lowered`), to inspect."""
        return self.jitted(stacked).lower(*args)  # type: ignore[attr-defined]


MISS = object()
"""What `Plan` returns for a call it cannot replay (the caller takes the full path)."""


class Plan:
    """The repeated eager call of one step, replayed with the work of the first call.

    The first call classified every argument leaf, checked and keyed them, found the
    compiled step and the layout of its outputs. A later call of the same step on the
    same strategy, with arguments of the same tree structure, the same type leaf by leaf
    and the same static (non-array) values, needs none of that again: it fetches the
    step's state (``staged.inputs``: the one per-call read of what the step captured),
    calls the program and builds the result. Shapes and dtypes are not compared here:
    `jax.jit`'s own cache check does that in C++, and a `Program` called with new ones
    raises `Retrace` (the call then takes the full path and compiles, as before).

    Args:
        owner: ``(strategy, cross_device_ops)`` of the call, compared by identity.
        leaves: the first call's flat arguments (distributed values excluded).
        treedef: their tree structure.
        at: the positions of the static leaves (hashable Python values), and of those
            that hold state (`jaxdist._state.arguments`: read from this call's objects).
        program: the compiled step (`Program`).
        staged: the step's trace (`jaxdist._state.stage.Staged`): ``inputs``, ``write_back``
            and ``num_inputs``.
        place: where ``staged.inputs`` puts the state it reads.
        wrap: ``wrap(fn, outs, arrays)``, the step's result from the program's outputs.
    """

    def __init__(self, owner: tuple, leaves: list, treedef: Any, at: tuple, *how: Any):
        self._strategy, self._cdo = owner
        self._treedef = treedef
        static_at, self._held = at
        self._types = tuple(map(type, leaves))
        self._static_at = static_at
        self._statics = tuple(leaves[i] for i in static_at)
        self._first = {i: leaves[i] for i in self._held}
        dynamic = tuple(i for i in range(len(leaves)) if i not in static_at)
        self._dynamic_at = dynamic if static_at else None
        self._program, self._staged, self._place, self._wrap = how
        self._stacked = (False,) * len(dynamic) + (None,) * self._staged.num_inputs
        self._jitted = self._program.jitted(self._stacked)

    def __call__(self, strategy: Any, cdo: Any, fn: Callable, leaves: list, treedef: Any) -> Any:
        """The step's result, or `MISS` when this call is not the one replayed."""
        if (
            strategy is not self._strategy
            or cdo is not self._cdo
            or treedef != self._treedef
            or tuple(map(type, leaves)) != self._types
        ):
            return MISS
        arrays = leaves
        if self._dynamic_at is not None:  # compared by identity first (tuple equality)
            if any(leaves[i] is not self._first[i] for i in self._held):
                return MISS  # (objects holding state: by identity, never by their ``__eq__``)
            if tuple([leaves[i] for i in self._static_at]) != self._statics:
                return MISS
            arrays = [leaves[i] for i in self._dynamic_at]
        if self._held:  # objects in the arguments: their state read as the step's own
            fn = _arguments.root(fn, [(i, leaves[i]) for i in self._held])
        extra = self._staged.inputs(fn, self._place)
        if extra is None:  # the state the step was traced with changed
            return MISS
        try:
            try:
                outs = self._jitted(*arrays, *extra)
            except ValueError:  # an argument on another device: the program moves it
                outs = self._program(self._stacked, *arrays, *extra)
        except Retrace:
            self._staged.unread(fn)  # the full path reads (and counts) them again
            return MISS
        self._staged.write_back(fn, outs)
        return self._wrap(fn, outs, arrays)


class Plans:
    """The last one-replica call of each step function, to replay (`Plan`): ``_run.run``
    keeps one, looked up first on every call.

    Found by the function object itself (a bound method: its object and function),
    held weakly: a plan dies with its function. Keyed by identity, so the lookup is one
    dict read; a step made anew on each call (a closure) finds its compiled step through
    `jaxdist._program.compile.steps` as before, and is not replayed.
    """

    MAX = 256

    def __init__(self) -> None:
        self._plans: dict = {}

    @staticmethod
    def _key(fn: Callable) -> tuple[Hashable, Any]:
        if type(fn) is types.MethodType:
            return (id(fn.__self__), fn.__func__), fn.__self__
        return id(fn), fn

    def get(self, fn: Callable) -> Plan | None:
        if type(fn) is types.MethodType:  # (`_key`, inlined: this runs on every call)
            owner = fn.__self__
            found = self._plans.get((id(owner), fn.__func__))
        else:
            owner = fn
            found = self._plans.get(id(fn))
        if found is None or found[0]() is not owner:
            return None
        return found[1]

    def put(self, fn: Callable, plan: Plan) -> None:
        key, owner = self._key(fn)
        plans = self._plans

        def drop(_: Any) -> None:
            plans.pop(key, None)

        try:
            ref = weakref.ref(owner, drop)
        except TypeError:  # not weakly referenceable: not replayed
            return
        plans.pop(key, None)
        plans[key] = (ref, plan)
        while len(plans) > self.MAX:
            plans.pop(next(iter(plans)), None)
