"""`Strategy.run`: one step function traced once for all replicas, lowered through `jax.pmap`.

Arguments are classified leaf by leaf: distributed values are mapped over the
replicas (their stacked arrays split one row per replica); arrays and Python
numbers are broadcast and traced (as `jax.jit` traces them: one compile for every
value); other Python values (bools, strings, None, hashable objects) are static
and part of the compile key. A number the step closes over is state, read again on
every call; to make a number static, bind it with ``functools.partial(step, n=3)``
(created once). Distributed values in the step's state are read per replica, and what
the step assigns there is written back (`jaxdist._state.replica`).

Two paths share one step body:

* eager (no JAX trace active): the pmapped step is cached weakly on ``fn`` (one
  entry per argument signature = one trace), and dispatched through
  `jaxdist._program.compile.dispatch` (within the in-flight bound); on one replica the step
  is compiled without a replica axis instead (`jaxdist._program.one_replica`): one dispatch
  whose outputs are already the plain arrays TF gives there, with no eager op per
  leaf (a distributed argument enters as its stacked array, unstacked inside). There,
  the second and later calls of a step with arguments of the same structure, leaf
  types and static values replay the first call's plan (`_one_replica.Plan`): no
  classification, signature, key or cache lookup, only identity and type checks, the
  re-read of the step's state and the dispatch (`jax.jit`'s C++ cache check catches a
  new shape or dtype);
* traced (inside `jax.jit`, a `lax` loop or any other trace): the step is
  pmapped afresh (on one replica: vmapped over an axis of size one, so no
  collective is left) and called inline, so the user's trace owns it and nothing
  about the trace (no tracer) is kept anywhere.

Ragged inputs (a partial batch) go to `jaxdist._partial.ragged`.
"""

from __future__ import annotations

import collections
import functools
import operator
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

import jax
import numpy as np
from jax import lax
from jax.extend.core import jaxpr_as_fun

from jaxdist._base import context as _context
from jaxdist._base import jax_internals as _jax_internals
from jaxdist._base import user_errors as _user_errors
from jaxdist._base.devices import AXIS, Replicas
from jaxdist._base.layout import is_tracer, shard_rows
from jaxdist._base.validate import describe, hashable_arg, is_number
from jaxdist._collective.replica_context import compiled_collectives, make_replica_context
from jaxdist._partial import ragged as _ragged
from jaxdist._program import compile as _compile
from jaxdist._program import one_replica as _one_replica
from jaxdist._state import aggregation as _aggregation
from jaxdist._state import arguments as _held_args
from jaxdist._state import promote as _promote
from jaxdist._state import recheck as _recheck
from jaxdist._state import replica as _replica
from jaxdist._state import varying as _varying
from jaxdist._state.frozen import lists_read, warn_frozen
from jaxdist._state.replica import Replica
from jaxdist._state.stage import Staged, example, released
from jaxdist._values.layout import parts
from jaxdist._values.layout import stack as stack_value
from jaxdist._values.layout import stacked as stacked_array
from jaxdist._values.trees import check_components
from jaxdist._values.values import from_stacked, is_distributed

MAPPED, BROADCAST, STATIC = "m", "b", "s"


_PLANS = _one_replica.Plans()
WORK: collections.Counter = collections.Counter()
"""``WORK["full"]``: the calls that took the full path (classified their arguments)."""


def _classify(leaf: Any, one: bool) -> str:
    if is_distributed(leaf):
        return BROADCAST if one else MAPPED
    if isinstance(leaf, (jax.Array, np.ndarray)) or is_number(leaf):
        return BROADCAST
    return STATIC


def _signature(x: Any, stacked: bool = False) -> Hashable:
    """What of an argument decides its trace (a stacked one: of its one row)."""
    if isinstance(x, jax.Array):
        shape = x.shape[1:] if stacked else x.shape
        return (shape, x.dtype, getattr(x, "weak_type", False))  # typed keys have none
    if isinstance(x, np.ndarray):
        return (x.shape, x.dtype)
    return type(x).__name__


def _static_key(value: Any, index: int) -> Hashable:
    try:  # (an unhashable object holding state: by identity, `jaxdist._state.arguments.key`)
        return (type(value), _held_args.key(value))
    except TypeError:
        return (type(value), hashable_arg(value, index))  # (raises, naming the leaf)


def _plain(leaf: Any, index: int, replicas: Replicas) -> Any:
    """A broadcast argument; with one replica, a distributed value's one component (so a
    `PerReplica` and the plain arrays `run` returns for one replica share a step)."""
    if not is_distributed(leaf):
        return leaf
    check_components(leaf, replicas, f"strategy.run (argument leaf {index})")
    x = stack_value(leaf, replicas)
    return x.reshape(x.shape[1:])


def _one_component(leaf: Any, index: int, replicas: Replicas) -> tuple[Any, bool]:
    """A distributed argument on one replica: its component, or its stacked array (True)
    for the one-replica program to unstack (no eager op either way)."""
    check_components(leaf, replicas, f"strategy.run (argument leaf {index})")
    held = parts(leaf)
    if held is not None and isinstance(held[0], jax.Array):
        return held[0], False
    data = stacked_array(leaf)
    if isinstance(data, jax.Array) and not is_tracer(data):
        return data, True
    return _plain(leaf, index, replicas), False


def _mapped(leaf: Any, replicas: Replicas, index: int) -> Any:
    """A distributed argument as an array stacked on the replicas, or None when ragged."""
    data = stacked_array(leaf)
    if (  # the common case, a value already in place: nothing to check or move
        isinstance(data, jax.Array)
        and not is_tracer(data)
        and data.sharding is replicas.sharding
        and data.shape[0] == replicas.num
    ):
        return data
    check_components(leaf, replicas, f"strategy.run (argument leaf {index})")
    x = stack_value(leaf, replicas)
    if x is None or is_tracer(x) or x.sharding is replicas.sharding:
        return x
    if x.sharding != replicas.sharding:
        x = jax.device_put(x, replicas.sharding)
    return x


def make_body(strategy: Any, cdo: Any, n: int, get_fn: Callable, sig: tuple, info: dict):
    """The replica function given to `jax.pmap`; records its outputs' layout in ``info``."""
    treedef, kinds, statics = sig
    fake = _compile.is_fake_pmap()

    dynamic = [k for k in kinds if k != STATIC]

    def body(*arrays: Any) -> list:
        if MAPPED not in kinds:  # the replica ids given to a step without a mapped argument
            arrays = arrays[1:]
        passed = {id(x): i for i, (x, k) in enumerate(zip(arrays, dynamic)) if k == BROADCAST}
        it, st = iter(arrays), iter(statics)
        leaves = [_held_args.value(next(st)[1]) if k == STATIC else next(it) for k in kinds]
        args, kwargs = jax.tree.unflatten(treedef, leaves)
        collectives, invariant = compiled_collectives(strategy, cdo, n)
        ctx = make_replica_context(strategy, collectives)
        trace = _jax_internals.current_trace()
        with _context.enter(_context.replica_state(strategy, ctx)):
            try:
                out = get_fn()(*args, **kwargs)
            except _user_errors.STEP_ERRORS as e:
                if not _user_errors.is_step_error(e):
                    raise
                _user_errors.raise_for_step(get_fn(), e)
        leaves, info["treedef"] = jax.tree.flatten(out)
        traced = [
            _jax_internals.is_inner_tracer(x, trace) or (fake and isinstance(x, jax.Array))
            for x in leaves
        ]
        # An argument returned as it is, and values that do not depend on the replica
        # (constants, captured arrays, merge_call results) come back as one value, as in TF.
        layout = []
        for x, t in zip(leaves, traced):
            if id(x) in passed:
                layout.append(("arg", passed[id(x)]))
            else:
                layout.append(("traced", id(x) in invariant) if t else ("const", x))
        info["layout"] = layout
        outs = [x for x, (kind, _) in zip(leaves, layout) if kind == "traced"]
        return outs or [lax.axis_index(AXIS)]  # the in-flight bound waits on one output

    return body


def _wrap(info: dict, outs: list, n: int, row: Callable, arg: Callable, state: Any = None) -> Any:
    """The step's outputs: stacked leaves as `PerReplica` (plain for one replica).

    ``row`` gives one replica's value of a stacked output, ``arg`` the argument array
    of an index (an argument returned as it is); ``state`` (eager) gives an untraced
    output as the step's state holds it now.
    """
    it = iter(outs)
    leaves = []
    for kind, what in info["layout"]:
        if kind == "arg":
            leaves.append(arg(what))
        elif kind == "const":
            leaves.append(what if state is None else state(what))
        elif n == 1 or what:  # one replica, or a merge_call result: one value
            leaves.append(row(next(it)))
        else:
            leaves.append(from_stacked(next(it)))
    return jax.tree.unflatten(info["treedef"], leaves)


def _first_row(a: Any) -> Any:
    return shard_rows(a)[0]


def _arguments(leaves: list, kinds: tuple, replicas: Replicas, one: bool) -> tuple | None:
    """The dynamic arguments, the static keys, the signatures and which arguments are
    stacked one-replica values (None when ragged)."""
    arrays, statics, sigs, stacked = [], [], [], []
    for i, (kind, leaf) in enumerate(zip(kinds, leaves)):
        if kind == STATIC:
            statics.append(_static_key(leaf, i))
            continue
        is_stacked = False
        if kind == MAPPED:
            x = _mapped(leaf, replicas, i)
        elif one and is_distributed(leaf):
            x, is_stacked = _one_component(leaf, i, replicas)
        else:
            x = _plain(leaf, i, replicas)
        if x is None:
            return None
        arrays.append(x)
        stacked.append(is_stacked)
        sigs.append(_signature(x, is_stacked))
    return arrays, tuple(statics), tuple(sigs), tuple(stacked)


MISS = _one_replica.MISS


def replay(strategy: Any, cdo: Any, fn: Callable, args: tuple, kwargs: Any = None) -> Any:
    """A repeated one-replica call of ``fn`` replayed from the last one
    (`jaxdist._program.one_replica.Plan`), or `MISS` (the caller takes the full path of `run`)."""
    plan = _PLANS.get(fn)
    if plan is None or _jax_internals.tracing() or _compile.is_fake_pmap():
        return MISS
    if _recheck.state_checks():  # (a plan kept before the mode was on: checked on the full path)
        return MISS
    _context.check_can_run(strategy)
    leaves, treedef = _structure(args, kwargs)
    return plan(strategy, cdo, fn, leaves, treedef)


def run(
    strategy: Any,
    replicas: Replicas,
    cdo: Any,
    fn: Callable,
    args: tuple,
    kwargs: dict,
    replayed: bool = False,
) -> Any:
    """Runs ``fn`` on every replica of ``strategy`` (see the module docstring);
    ``replayed``: `replay` was tried on this call already."""
    _context.check_can_run(strategy)
    if not replayed:
        out = replay(strategy, cdo, fn, args, kwargs)
        if out is not MISS:
            return out
    WORK["full"] += 1
    one = replicas.num == 1 and not replicas.multi_process
    direct = one and not _compile.is_fake_pmap()  # the one-replica program
    leaves, treedef = jax.tree.flatten((tuple(args), dict(kwargs)), is_leaf=is_distributed)
    kinds = tuple(_classify(x, one) for x in leaves)
    held = _held_args.objects(leaves, [k == STATIC for k in kinds])  # state in its arguments
    root = _held_args.root(fn, held, (args, kwargs, is_distributed))
    found = _arguments(leaves, kinds, replicas, direct)
    if found is None:
        return _ragged.run(strategy, replicas, cdo, root, tuple(args), dict(kwargs))
    arrays, statics, sigs, stacked = found
    sig = (treedef, kinds, statics)
    in_axes = tuple(0 if k == MAPPED else None for k in kinds if k != STATIC)
    if _jax_internals.tracing() or any(is_tracer(x) for x in arrays):
        arrays = [x.reshape(x.shape[1:]) if s else x for x, s in zip(arrays, stacked)]
        return _run_traced(strategy, replicas, cdo, (fn, root), sig, in_axes, arrays)
    key = (sig, sigs, program_key(strategy, cdo), replicas.devices, _compile.is_fake_pmap())
    again = None  # a later call may replay it: the leaves and their structure as it sees them
    if direct and not any(map(is_distributed, leaves)):
        again = (leaves, _structure(args, kwargs)[1])
    how = (sig, key, in_axes, direct, again, tuple(i for i, _ in held))
    return _run_eager(strategy, replicas, cdo, (fn, root), how, arrays, stacked)


def _structure(args: tuple, kwargs: dict) -> tuple[list, Any]:
    """The leaves and structure of a call as a replayed call compares them: the positional
    arguments' alone when there are no keyword arguments (the common case, one flatten
    less), else marked apart, so that ``args=((x,), {"a": y})`` is never ``fn(x, a=y)``."""
    if not kwargs:
        return jax.tree_util.tree_flatten(args)
    return jax.tree_util.tree_flatten(_Keywords(args, kwargs))  # (a PyTreeDef either way:
    # it compares unequal only to another PyTreeDef)


class _Keywords(NamedTuple):
    """A call with keyword arguments, as `_structure` flattens it (its own node type)."""

    args: tuple
    kwargs: dict


def _run_eager(
    strategy, replicas, cdo, fns: tuple, how: tuple, arrays: list, stacked: tuple
) -> Any:
    """One cached program, dispatched once: `jax.pmap` over the replicas, or on one
    replica the `jaxdist._program.one_replica` program (no replica axis, no per-leaf work).
    ``fns``: the step and the root of its state (`jaxdist._state.arguments`)."""
    (fn, root), (sig, key, in_axes, direct, replay, held) = fns, how
    ids = [_compile.replica_ids(replicas, False)] if MAPPED not in sig[1] else []
    in_axes = (0,) * len(ids) + in_axes

    def build() -> tuple:
        info: dict = {}
        body = make_body(strategy, cdo, replicas.num, _compile.weak_callable(fn), sig, info)
        rows = [ax == 0 or s for ax, s in zip(in_axes, (False,) * len(ids) + stacked)]
        examples = [example(x, r) for x, r in zip([*ids, *arrays], rows)]
        outputs = lambda: [x for _, x in info["layout"]]  # noqa: E731
        replica = Replica(AXIS, replicas.num, tuple(rows), _same if direct else _written)
        staged = Staged(
            root, body, examples, [(AXIS, replicas.num)], outputs, numbers=True, replica=replica
        )
        if direct:
            return _one_replica.program(staged.evaluate, replicas), info, staged
        axes = (*in_axes, *[0 if r else None for r in staged.input_rows])
        return _compile.pmap(staged.evaluate, replicas, axes), info, staged

    place = None if replicas.multi_process else replicas.replicate
    rows = None if direct else functools.partial(_state_rows, replicas)
    inputs = lambda e: e[2].inputs(root, place, rows)  # noqa: E731
    entry, extra = _compile.steps.get(fn, key, build, inputs, operator.itemgetter(2))
    program, info, staged = entry
    state = lambda x: staged.output(root, x)  # noqa: E731
    if not direct:
        what = f"strategy.run({describe(fn)})"
        outs = _compile.dispatch(program, replicas, *ids, *arrays, *extra, what=what)
        staged.write_back(root, outs)  # what the step assigned in its state
        return _wrap(info, outs, replicas.num, _first_row, arrays.__getitem__, state)
    # no collective in the program: nothing to bound in flight (see `jaxdist._base.inflight`)
    outs = program((*stacked, *[r or None for r in staged.input_rows]), *arrays, *extra)
    staged.write_back(root, outs)
    if replay is not None and not any(staged.input_rows) and not _recheck.state_checks():
        static_at = tuple(i for i, k in enumerate(sig[1]) if k == STATIC)
        plan = (program, staged, place, _replayed_outputs(info, staged))
        at = (static_at, held)
        _PLANS.put(fn, _one_replica.Plan((strategy, cdo), *replay, at, *plan))
    arg = lambda i: _first_row(arrays[i]) if stacked[i] else arrays[i]  # noqa: E731
    return _wrap(info, outs, 1, _same, arg, state)


def _replayed_outputs(info: dict, staged: Staged) -> Callable:
    """``wrap(fn, outs, arrays)`` of a replayed one-replica call (`_one_replica.Plan`):
    the outputs as they are when all are traced, else `_wrap`'s per-leaf layout."""
    treedef, layout = info["treedef"], info["layout"]
    n = len(layout)
    if all(kind == "traced" for kind, _ in layout):
        return lambda fn, outs, arrays: treedef.unflatten(outs if len(outs) == n else outs[:n])

    def wrap(fn: Callable, outs: list, arrays: list) -> Any:
        state = lambda x: staged.output(fn, x)  # noqa: E731
        return _wrap(info, outs, 1, _same, arrays.__getitem__, state)

    return wrap


def _same(a: Any, *_: Any) -> Any:
    return a


def _written(a: Any, varies: bool, how: str | None = None) -> Any:
    """A stacked output of a replica step's assignment, as its state holds it after the
    call: as its variable keeps it (``how``: `jaxdist._state.replica.rule`), else a
    `PerReplica` where replicas differ, else the one value (the first row)."""
    first = (lambda x: x[0]) if is_tracer(a) else _first_row
    kept = _aggregation.kept(a, varies, how, first)
    if kept is not None:
        return kept
    return from_stacked(a) if varies else first(a)


def _state_rows(replicas: Replicas, data: Any) -> Any:
    """A distributed value of the state, read per replica: its stacked array, split over
    the replicas' devices (already so when `run` made it)."""
    if isinstance(data, jax.Array) and data.sharding is not replicas.sharding:
        if data.sharding != replicas.sharding:
            return jax.device_put(data, replicas.sharding)
    return data


def program_key(strategy: Any, cdo: Any) -> Hashable:
    """What of a strategy decides its compiled steps: equal strategies share them."""
    ops: Hashable
    try:
        ops = (type(cdo), tuple(sorted(vars(cdo).items())))
        hash(ops)
    except TypeError:
        ops = (type(cdo), cdo)
    return (type(strategy), ops)


def _run_traced(strategy, replicas, cdo, fns, sig, in_axes, arrays) -> Any:
    """Inside a JAX trace: a fresh pmap called inline (nothing about the trace is kept).
    ``fns``: the step and the root of its state (`jaxdist._state.arguments`)."""
    fn, root = fns
    info: dict = {}
    body = make_body(strategy, cdo, replicas.num, lambda: fn, sig, info)
    dist = _replica.places(root, replicas.num)  # read per replica; what it assigns, taken
    body = _replica.with_state(root, body, [c for c, _ in dist], info)
    arrays = [*arrays, *(stacked_array(v) for _, v in dist)]
    in_axes = (*in_axes, *(0,) * len(dist))
    swap = _promote.swapped()
    if swap is not None:  # numbers of an outer trace's state (jd.function's) are inputs
        body = _numbers_out(body, swap, info)
    call_axes, call_args = in_axes, arrays
    if MAPPED not in sig[1]:  # a pmap needs one mapped argument
        call_axes, call_args = (0, *in_axes), [_compile.replica_ids(replicas, True), *arrays]
    forward, release = released(body)  # (JAX's caches keep the mapped function: not the step)
    try:
        outs, varies = _traced_map(root, replicas, forward, tuple(call_axes), call_args)
    finally:
        release()
    if info["assigned"] and not _context.in_function():
        raise _replica.assigned_under_jit(root, info["assigned"][0][0])
    if info["assigned"]:  # what the step assigned in its state: written back there
        row = _written if replicas.num > 1 else lambda a, *_: a[0]
        _replica.write_traced(root, info, outs, varies, row, len(info.get("written", ())))
    if info.get("written"):  # what the step stored there: replica 0's value, as eagerly
        values = outs[len(outs) - len(info["written"]) :]
        now = swap.now()  # type: ignore[union-attr]
        for i, v in zip(info["written"], values):
            now[i] = v[0]
        swap.put_back(now)  # type: ignore[union-attr]
    return _wrap(info, outs, replicas.num, lambda a: a[0], arrays.__getitem__)


def _traced_map(fn: Callable, replicas: Replicas, body: Callable, axes: tuple, args: list):
    """``body`` mapped over the replicas in the caller's trace: traced once here (the
    step's Python runs once), checked for state the user's compile froze, and replayed
    as a jaxpr. One replica (a `jax.vmap`): ``body`` traced alone with the replica axis in
    its environment, replayed inside the map. Several (`jax.pmap`, or a ``shard_map``
    across processes): the whole map traced, so that JAX itself takes in the values of
    the caller's trace that the step closes over (state an earlier call stored can carry
    a sharding over the replicas' own mesh, which a jaxpr traced apart and replayed
    inside the map would hold as a constant of another kind of mesh, and JAX refuses).
    Returns the outputs and a function telling which can differ across replicas."""
    spmd = _compile.spmd if replicas.multi_process else _compile.pmap
    fake = _compile.is_fake_pmap()
    one = replicas.num == 1 and not replicas.multi_process and not fake
    lists = lists_read(fn) if not _context.in_function() else None
    if one or fake:
        examples = [example(x, ax == 0) for x, ax in zip(args, axes)]
        closed = jax.make_jaxpr(body, axis_env=[(AXIS, replicas.num)])(*examples)
        warn_frozen(fn, closed, lists)
        replay = jaxpr_as_fun(closed)
        mapped = [ax == 0 for ax in axes]
        varies = lambda: _varying.varying(closed.jaxpr, mapped, AXIS)  # noqa: E731
        outs = (_one_replica.vmapped(replay, axes) if one else spmd(replay, replicas, axes))(*args)
        return outs, varies
    closed = jax.make_jaxpr(spmd(body, replicas, axes))(*args)
    warn_frozen(fn, closed, lists)
    return jaxpr_as_fun(closed)(*args), lambda: _varying.of_map(closed.jaxpr, AXIS)


def _numbers_out(body: Callable, swap: Any, info: dict) -> Callable:
    """``body`` returning, after its outputs, the numbers the step stored at ``swap``'s
    places (the places get their values back: no tracer of this trace is left there)."""

    def with_numbers(*arrays: Any) -> list:
        before = swap.now()
        outs = list(body(*arrays))
        now = swap.now()
        written = [i for i, (a, b) in enumerate(zip(before, now)) if a is not b]
        swap.put_back(before)
        info["written"] = written
        return outs + [jax.numpy.asarray(now[i]) for i in written]

    return with_numbers
