"""Running the replicas of a partial-batch step side by side, stopping at each collective.

`jaxdist._partial.replay` traces one jaxpr per group of same-shaped replicas, under an
axis environment for the replica axis, so the collectives in it are JAX's own
``psum`` / ``all_gather`` / ``reduce_scatter`` / ``axis_index`` equations, at any
depth of transformation: `jax.grad` has already turned each collective's
gradient into the same collective of the cotangents (JAX's transpose rules, the
ones a ``shard_map`` uses with ``check_vma=False``; TF's rule), `jax.vmap` has
batched them, and nested ``jit`` / ``checkpoint`` / ``custom_vjp`` / ``cond`` /
``scan`` equations hold them in their sub-jaxprs.

This module evaluates the groups' jaxprs in the caller's trace, in lockstep:

* the equations between two collectives run under `jax.vmap` over the group's
  members (a value every member shares, such as a collective's result, stays
  unbatched), those with a host effect (a callback) once per member, used or not
  (`jaxdist._partial.callbacks`);
* at a collective every group stops, and the result is computed from every
  replica's value (`combine`), in replica order;
* a nested jaxpr that holds a collective is entered (``checkpoint`` and
  ``custom_jvp``/``custom_vjp`` calls are inlined; every branch of a ``cond`` runs,
  its collectives on every replica, and each member keeps its own branch's
  result). `jax.jit` and ``lax.scan`` / ``fori_loop`` with static bounds do not
  get here: the replicas are traced with jit disabled, which inlines a jit and
  unrolls a scan. A ``while_loop`` (a ``fori_loop`` with a traced trip count)
  holding a collective cannot run so and is a clear error, as are collectives
  other than the ones above (``ppermute``, ``all_to_all``).

Values are ``(array, batched)`` pairs: batched arrays have the group's members
along their leading axis.

JAX internals this module reads (through `jax.extend.core`, JAX's extension API,
which has no stability promise): the names and parameters of the collective and
call primitives (``psum`` ``axes``, ``all_gather`` ``all_gather_dimension`` /
``tiled``, ``reduce_scatter`` ``scatter_dimension``, ``cond`` ``branches``, the
sub-jaxpr of ``jit`` / ``remat2`` / ``custom_*_call``), as of jax 0.10 to 0.12.
`jaxdist._base.jax_internals.check_collectives` checks them on this JAX before the first
partial-batch step and `tests/partial/test_nested_collectives.py` exercises each of them; an
unknown primitive holding a collective is a clear error, not a wrong answer.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend import core

from jaxdist._base.devices import AXIS
from jaxdist._base.jax_internals import check_collectives, host_effects
from jaxdist._partial import callbacks as _callbacks

Value = tuple[Any, bool]
Run = Generator[tuple, Any, list]

MERGE = "jaxdist_merge_call"
REDUCING = {"psum": jnp.add, "pmax": jnp.maximum, "pmin": jnp.minimum}
COLLECTIVES = {*REDUCING, "all_gather", "reduce_scatter", "axis_index", MERGE}
UNSUPPORTED = {
    "ppermute",
    "all_to_all",
    "psum_invariant",
    "pbroadcast",
    "pgather",
    "ragged_all_to_all",
}
INLINE = {
    "jit": "jaxpr",
    "pjit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "remat2": "jaxpr",
    "checkpoint": "jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
}


class Groups(NamedTuple):
    """What every group's run needs: the replica count, each group's members (replica
    ids), and the `merge_call` handler (per-group inputs to per-group outputs)."""

    n: int
    members: list[tuple[int, ...]]
    merge: Callable[[list, list], list]


def run(groups: Groups, jaxprs: Sequence[Any], args: Sequence[list[Value]]) -> list[list[Value]]:
    """Each group's outputs of its closed jaxpr on its arguments, run in lockstep."""
    check_collectives(AXIS)  # this JAX's primitives are the ones read here (cached)
    runs = [_run(j.jaxpr, j.consts, a, m) for j, a, m in zip(jaxprs, args, groups.members)]
    return _lockstep(groups, runs)


def rows(value: Value, size: int) -> list:
    """A group value's per-member arrays."""
    x, batched = value
    return [x[j] for j in range(size)] if batched else [x] * size


# -- one group -------------------------------------------------------------------------------


def _run(
    jaxpr: Any,
    consts: Sequence[Any],
    args: Sequence[Value],
    members: tuple,
    when: Value | None = None,
) -> Run:
    """One group's run of ``jaxpr``; ``when`` (a boolean per member, None: all) says which
    members take it, for the callbacks in a ``cond`` branch."""
    env: dict = {v: (c, False) for v, c in zip(jaxpr.constvars, consts)}
    env.update(zip(jaxpr.invars, args))
    for step in _plan(jaxpr):
        if isinstance(step, _Segment):
            _evaluate(step, env, len(members))
            continue
        if isinstance(step, _Effect):
            _callbacks.each_member(step.eqn, env, len(members), when)
            continue
        ins = [_read(env, v) for v in step.invars]
        outs = yield from _sync(step, ins, members, when)
        env.update((v, o) for v, o in zip(step.outvars, outs) if not isinstance(v, core.DropVar))
    return [_read(env, v) for v in jaxpr.outvars]


def _read(env: dict, v: Any) -> Value:
    return (v.val, False) if isinstance(v, core.Literal) else env[v]


class _Segment(NamedTuple):
    eqns: list
    ins: list
    outs: list


class _Effect(NamedTuple):
    """An equation with a host effect (a callback) and no collective: run per member."""

    eqn: Any


def _plan(jaxpr: Any) -> list:
    """The equations as segments (no collective, no host effect: those whose outputs are
    used), and the equations between them (collectives, and the host effects, every one
    run whether its outputs are used or not)."""
    steps: list = []
    for eqn in jaxpr.eqns:
        if _has_collective(eqn):
            steps.append(eqn)
        elif host_effects(eqn.effects):
            steps.append(_Effect(eqn))
        elif steps and isinstance(steps[-1], list):
            steps[-1].append(eqn)
        else:
            steps.append([eqn])
    live = {v for v in jaxpr.outvars if not isinstance(v, core.Literal)}
    plan: list = []
    for step in reversed(steps):
        eqns = step if isinstance(step, list) else [getattr(step, "eqn", step)]
        defined = {v for e in eqns for v in e.outvars}
        used = [v for e in eqns for v in e.invars if not isinstance(v, core.Literal)]
        ins = [v for v in dict.fromkeys(used) if v not in defined]
        if isinstance(step, list):
            outs = [v for e in eqns for v in e.outvars if v in live]
            plan.append(_Segment(eqns, ins, outs))
        else:
            plan.append(step)
        live = (live - defined) | set(ins)
    return plan[::-1]


def _has_collective(eqn: Any) -> bool:
    if eqn.primitive.name in REDUCING and not _named_axes(eqn):
        return False  # over array axes only (a jax.vmap's own axis_name): a local reduction
    if eqn.primitive.name in COLLECTIVES or eqn.primitive.name in UNSUPPORTED:
        return True
    return any(_has_collective(e) for j in core.jaxprs_in_params(eqn.params) for e in j.eqns)


def _evaluate(seg: _Segment, env: dict, size: int) -> None:
    """A segment's equations, under `jax.vmap` over the members where an input is batched."""
    if not seg.outs:
        return
    info = core.DebugInfo(
        "partial-batch step", "", tuple(map(str, seg.ins)), tuple(map(str, seg.outs))
    )
    jaxpr = core.Jaxpr([], seg.ins, seg.outs, seg.eqns, _effects(seg.eqns), info)
    fn = core.jaxpr_as_fun(core.ClosedJaxpr(jaxpr, []))
    values = [env[v] for v in seg.ins]
    batched = any(b for _, b in values)
    if batched:
        axes = [0 if b else None for _, b in values]
        fn = jax.vmap(fn, in_axes=axes, axis_size=size)
    outs = fn(*[x for x, _ in values])
    env.update((v, (o, batched)) for v, o in zip(seg.outs, outs))


def _effects(eqns: list) -> Any:
    return frozenset().union(*(e.effects for e in eqns))


def _sync(eqn: Any, ins: list[Value], members: tuple, when: Value | None) -> Run:
    """An equation holding a collective: the collective itself (all groups stop here),
    or a nested jaxpr entered (``when``: see `_run`)."""
    name = eqn.primitive.name
    if name == "axis_index":
        return [(jnp.asarray(members, jnp.int32), True)]
    if name in COLLECTIVES:
        return (yield (name, eqn, ins))
    if name in INLINE:
        sub = eqn.params[INLINE[name]]
        jaxpr, consts = (sub.jaxpr, sub.consts) if hasattr(sub, "consts") else (sub, [])
        return (yield from _run(jaxpr, consts, ins, members, when))
    if name == "cond":
        return (yield from _cond(eqn, ins, members, when))
    raise unsupported(name)


def unsupported(name: str) -> RuntimeError:
    what = {
        "while": "a lax.while_loop (or a fori_loop with a traced trip count)",
        # scans are unrolled; one is left only on a replica with no example (zero rows)
        "scan": "a lax.scan / lax.map over the rows of a replica that got no example "
        "(it calls the collective no time, the others once per row; TF would hang)",
    }.get(name, f"'{name}'")
    if name in UNSUPPORTED:
        what = f"lax.{name} (not available in partial-batch steps)"

    return RuntimeError(
        f"In a partial-batch step, a collective inside {what} cannot be run: the replicas "
        "of a partial batch run side by side and exchange values at each collective, "
        "which works for collectives (psum, pmean, pmax, pmin, all_gather, psum_scatter, "
        "axis_index and the ReplicaContext ones) at the step's level and inside jax.grad, "
        "vmap, jit, checkpoint, custom_jvp/custom_vjp, lax.cond/switch and lax.scan (a "
        "fori_loop with static bounds). Move the collective out of it, or make every "
        "global batch divisible by num_replicas_in_sync (a full batch has no such limit)."
    )


def _cond(eqn: Any, ins: list[Value], members: tuple, when: Value | None) -> Run:
    """Every branch runs (its collectives too, the same on every replica; its callbacks
    on the members that take it); each member keeps the outputs of its own branch."""
    (index, batched), ops = ins[0], ins[1:]
    branches = []
    for b, branch in enumerate(eqn.params["branches"]):
        taken = _callbacks.taken(index == b, batched, when)
        branches.append((yield from _run(branch.jaxpr, branch.consts, ops, members, taken)))
    outs = []
    for column in zip(*branches):
        values = [(index, batched), *column]
        axes = [0 if b else None for _, b in values]
        pick = lambda i, *xs: lax.select_n(i, *xs)  # noqa: E731
        if any(axes[i] == 0 for i in range(len(axes))):
            pick = jax.vmap(pick, in_axes=axes, axis_size=len(members))
        outs.append((pick(*[x for x, _ in values]), any(b for _, b in values)))
    return outs


# -- all groups -------------------------------------------------------------------------------


def _lockstep(groups: Groups, runs: list[Run]) -> list[list[Value]]:
    sends: list = [None] * len(runs)
    outs: list = [None] * len(runs)
    while True:
        requests: list = []
        for g, r in enumerate(runs):
            try:
                requests.append(r.send(sends[g]))
            except StopIteration as stop:
                outs[g] = stop.value
                requests.append(None)
        if all(q is None for q in requests):
            return outs
        kinds = [q[0] if q is not None else "returned" for q in requests]
        if len(set(kinds)) != 1:
            raise mismatch(kinds)
        if kinds[0] == MERGE:
            sends = groups.merge([q[1] for q in requests], [q[2] for q in requests])
        else:
            sends = combine(groups, kinds[0], requests)


def mismatch(kinds: list) -> RuntimeError:
    return RuntimeError(
        "The replicas of a partial-batch step did not call the same collectives in the same "
        f"order: their groups of same-shaped replicas reached {kinds}. Every replica must "
        "call the same collectives in the same order."
    )


def combine(groups: Groups, name: str, requests: list) -> list[list[Value]]:
    """The result of collective ``name`` for every group, from every replica's input."""
    eqn = requests[0][1]
    axes = _named_axes(eqn)
    if axes != (AXIS,) or eqn.params.get("axis_index_groups") is not None:
        raise RuntimeError(
            f"In a partial-batch step, lax.{name} must be over jd.AXIS ({AXIS!r}) alone and "
            f"without axis_index_groups; got axis_name={axes}."
        )
    columns = list(zip(*[q[2] for q in requests]))
    if name in REDUCING:  # array axes first (a jax.vmap's axis_name with jd.AXIS)
        columns = [tuple(_local(name, eqn, v) for v in column) for column in columns]
    avals = [v.aval for v in eqn.outvars]
    if name in REDUCING:
        for column in columns:
            _check_shapes(groups, column, name)
        out = [(_reduce(groups, name, c).astype(a.dtype), False) for c, a in zip(columns, avals)]
        return [out] * len(requests)
    if name == "all_gather":
        return [[(_gather(groups, columns[0], eqn.params), False)]] * len(requests)
    return _scatter(groups, columns[0], eqn.params)


def _named_axes(eqn: Any) -> tuple:
    """A collective's axis names; its positional axes (a `jax.vmap` turns its own named
    axis into one) are array axes reduced on each replica."""
    axes = eqn.params.get("axes", eqn.params.get("axis_name"))
    axes = axes if isinstance(axes, tuple) else (axes,)
    return tuple(a for a in axes if not isinstance(a, int))


def _local(name: str, eqn: Any, value: Value) -> Value:
    """``value`` reduced over the collective's positional axes (none: as it is)."""
    axes = tuple(a for a in eqn.params.get("axes", ()) if isinstance(a, int))
    if not axes:
        return value
    x, batched = value
    # lax's reductions: an empty replica's rows give the identity (0, -inf, +inf)
    fold = {"psum": lax.reduce_sum, "pmax": lax.reduce_max, "pmin": lax.reduce_min}[name]
    return fold(jnp.asarray(x), tuple(a + int(batched) for a in axes)), batched


def _check_shapes(groups: Groups, column: Sequence[Value], name: str) -> None:
    """Every replica's input to a reducing collective has one shape and dtype."""
    got: list = [None] * groups.n
    for (x, batched), members in zip(column, groups.members):
        shape, dtype = jnp.shape(x)[1:] if batched else jnp.shape(x), jnp.result_type(x)
        for i in members:
            got[i] = f"{dtype}{list(shape)}"
    for i, g in enumerate(got):
        if g != got[0]:
            raise ValueError(
                f"ReplicaContext.all_reduce (lax.{name} over jd.AXIS) needs the same shape and "
                f"dtype on every replica (TF fails on a shape mismatch too); replica 0 gave "
                f"{got[0]} and replica {i} gave {g}."
            )


def _reduce(groups: Groups, name: str, column: Sequence[Value]) -> Any:
    op = REDUCING[name]
    total = None
    for (x, batched), members in zip(column, groups.members):
        x = jnp.asarray(x)
        if batched:
            part = jnp.sum(x, 0, dtype=x.dtype) if name == "psum" else _fold(op, x)
        else:
            part = x * len(members) if name == "psum" else x
        total = part if total is None else op(total, part)
    return total


def _fold(op: Callable, x: Any) -> Any:
    return jnp.max(x, 0) if op is jnp.maximum else jnp.min(x, 0)


def _replica_rows(groups: Groups, column: Sequence[Value]) -> list:
    out: list = [None] * groups.n
    for value, members in zip(column, groups.members):
        for i, row in zip(members, rows(value, len(members))):
            out[i] = jnp.asarray(row)
    if len({(r.shape, r.dtype) for r in out}) != 1:
        raise RuntimeError(
            "In a partial-batch step, lax.all_gather / psum_scatter over jd.AXIS need the same "
            f"shape on every replica; got {[tuple(r.shape) for r in out]}. Use "
            "ReplicaContext.all_gather for values whose lengths differ between replicas."
        )
    return out


def _gather(groups: Groups, column: Sequence[Value], params: dict) -> Any:
    replica_rows = _replica_rows(groups, column)
    d = params["all_gather_dimension"]
    join = jnp.concatenate if params["tiled"] else jnp.stack
    return join(replica_rows, axis=d)


def _scatter(groups: Groups, column: Sequence[Value], params: dict) -> list[list[Value]]:
    total = sum(_replica_rows(groups, column)[1:], _replica_rows(groups, column)[0])
    d, n = params["scatter_dimension"], groups.n
    size = total.shape[d] // n
    own = [lax.slice_in_dim(total, i * size, (i + 1) * size, axis=d) for i in range(n)]
    if not params["tiled"]:
        own = [jnp.squeeze(x, d) for x in own]
    return [[(jnp.stack([own[i] for i in members]), True)] for members in groups.members]
