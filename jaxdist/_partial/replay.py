"""Tracing the replicas of a ragged step (a partial batch) inside one program.

One SPMD program cannot give replicas arrays of different shapes, so a ragged
step traces ``fn`` on each replica's true slice. Replicas whose inputs have the
same shapes form a group (a TF split has at most three sizes: full, remainder,
empty) and are traced once: `trace_group` makes a jaxpr of one replica of the
group, under an axis environment for the replica axis ``jd.AXIS``. There every
collective is one of JAX's (`ReplicaContext.all_reduce` is ``lax.psum``, as in a
full batch), so raw ``lax`` collectives over ``jd.AXIS`` (flax's
``BatchNorm(axis_name=jd.AXIS)``) work, and at any depth of transformation:
JAX's own rules differentiate them (the gradient of an all-reduce is the
all-reduce of the cotangents, as TF), batch them under `jax.vmap`, and keep them
inside nested ``jit`` / ``checkpoint`` / ``cond`` / ``scan`` jaxprs.
`jaxdist._partial.lockstep` then runs the groups' jaxprs side by side in the caller's
trace, exchanging values at each collective.

Two collectives are not plain ``lax`` ones:

* `ReplicaContext.all_gather` of values whose lengths differ between replicas:
  each replica pads to the longest, ``lax.all_gather`` s and keeps every replica's
  true rows. The lengths come from every group's trace, so a step whose gathers
  have such lengths is traced again once they are known (a replay: one more
  trace per round of newly learnt lengths);
* `ReplicaContext.merge_call` (`jaxdist._partial.merge`): a primitive of its own (``merge_p``) whose
  ``merge_fn`` runs once with every replica's arguments when the groups reach
  it. Its result's shapes come from ``merge_fn`` on stand-ins (every replica
  with this replica's shapes); where the real results differ (a gather of a
  partial batch), the step is traced again with them. It has no gradient rule
  (TF's tape gives no gradient through a merge_call): inside `jax.grad` /
  `jax.vmap` of a partial-batch step it is a clear error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxdist._base import context as _context
from jaxdist._base import jax_internals as _jax_internals
from jaxdist._base.devices import AXIS
from jaxdist._base.layout import as_array, is_array
from jaxdist._base.validate import describe
from jaxdist._collective.replica_context import (
    Collectives,
    compiled_collectives,
    gather_leaf,
    make_replica_context,
)
from jaxdist._partial import lockstep as _lockstep
from jaxdist._partial import merge as _merge
from jaxdist._state import assign as _assign
from jaxdist._state import promote as _promote
from jaxdist._state import replica as _replica
from jaxdist._state import varying as _varying

MAX_PASSES = 100

# -- stage 1: one jaxpr per group of same-shaped replicas ---------------------------------------


class _Learnt:
    """What one group's trace cannot know and another's gives: the lengths along the
    gathered axis of each `ReplicaContext.all_gather` (in call order; ``guessed`` says a
    trace went on without them), and each `merge_call`'s result shapes per replica."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.sizes: dict[int, list] = {}
        self.guessed: set[int] = set()
        self.merges: dict[int, list] = {}  # merge_call index -> each replica's result shapes
        self.shapes: dict[int, tuple] = {}  # gather index -> (axis, each replica's shape)

    def gather(self, k: int, members: tuple, x: Any, axis: int) -> Any:
        sizes = self.sizes.setdefault(k, [None] * self.n)
        known = None not in sizes
        shapes = self.shapes.setdefault(k, (axis, [None] * self.n))[1]
        for i in members:
            sizes[i], shapes[i] = x.shape[axis], tuple(x.shape)
        self.check(k)
        if not known:
            self.guessed.add(k)
        if not known or len(set(sizes)) == 1:
            return lax.all_gather(x, AXIS, axis=axis, tiled=True)
        longest = max(sizes)
        pad = [(0, 0)] * x.ndim
        pad[axis] = (0, longest - x.shape[axis])
        rows = lax.all_gather(jnp.pad(x, pad), AXIS)
        return jnp.concatenate(
            [lax.slice_in_dim(rows[i], 0, s, axis=axis) for i, s in enumerate(sizes)], axis=axis
        )

    def check(self, k: int) -> None:
        """`ValueError` where the replicas' values of gather ``k`` differ off its axis."""
        axis, shapes = self.shapes[k]
        seen = [(i, sh) for i, sh in enumerate(shapes) if sh is not None]
        for i, shape in seen[1:]:
            first = seen[0][1]
            off = [d for d in range(len(shape)) if d != axis and shape[d] != first[d]]
            if len(shape) != len(first) or off:
                where = f"axis {off[0]}" if off else "rank"
                raise ValueError(
                    f"ReplicaContext.all_gather(axis={axis}) needs every replica's value to "
                    f"have the same shape except along axis {axis} (TF raises "
                    f"InvalidArgumentError); replica {seen[0][0]} gave shape {first} and "
                    f"replica {i} gave {shape}, which differ in {where}."
                )

    def replay(self) -> bool:
        """Whether a guess turned out wrong (lengths differ): the groups are traced again."""
        wrong = any(len(set(self.sizes[k])) > 1 for k in self.guessed)
        self.guessed = set()
        return wrong


class _Traced(NamedTuple):
    jaxpr: Any  # a ClosedJaxpr of one replica of the group
    args: list  # the group's arguments, (array, batched)
    out_tree: Any
    layout: list  # per output leaf: None (computed) or (constant,)
    trace: Any  # the trace that made the jaxpr (dead: a value of it is a leak)
    written: list  # the state's numbers it stored (`_promote.Swapped`): last outputs
    assigned: tuple  # what it assigned (`take_assigned`'s records), and which outputs vary


def _collectives(
    strategy: Any, cdo: Any, n: int, members: tuple, gathers: _Learnt, devices: tuple
) -> Collectives:
    base, _ = compiled_collectives(strategy, cdo, n)
    count, merges = [0], [0]

    def merge_call(fn: Callable, args: tuple, kwargs: dict) -> Any:
        k, merges[0] = merges[0], merges[0] + 1
        known = gathers.merges.get(k)
        return _merge.bind_merge(strategy, n, k, known and known[members[0]], fn, args, kwargs)

    def all_gather(value: Any, axis: int) -> Any:
        def one(x: Any) -> Any:
            count[0] += 1
            return gathers.gather(count[0] - 1, members, x, axis)

        return jax.tree.map(lambda x: gather_leaf(x, axis, one), value)

    return Collectives(
        replica_id=base.replica_id,
        all_reduce=base.all_reduce,
        all_gather=all_gather,
        merge_call=merge_call,
        devices=lambda: tuple(devices[i] for i in members),
    )


def trace_group(
    strategy: Any,
    cdo: Any,
    fn: Callable,
    inputs: list,
    members: tuple,
    devices: tuple,
    gathers: _Learnt,
    stack: Callable | None = None,
) -> _Traced:
    """One replica of a group traced to a jaxpr, and the group's arguments.

    ``stack(k, members)``, where given, is the group's rows of flat input ``k`` as one
    array (a slice of the value they came from, instead of the rows stacked again), or
    None."""
    flat = [jax.tree.flatten(inputs[i]) for i in members]
    leaves, in_tree = flat[0]
    dynamic = [k for k, x in enumerate(leaves) if is_array(x)]
    info: dict = {}

    def replica(*arrays: Any) -> list:
        full = list(leaves)
        for k, a in zip(dynamic, arrays):
            full[k] = a
        args, kwargs = jax.tree.unflatten(in_tree, full)
        rows, args = _replica.swapped(fn, args)  # the replica's own rows of its state
        collectives = _collectives(strategy, cdo, gathers.n, members, gathers, devices)
        ctx = make_replica_context(strategy, collectives)
        info["trace"] = trace = _jax_internals.current_trace()
        swap = _promote.swapped()  # numbers of the state that are inputs: each group
        if swap is not None:  # starts from them, and gives what it stores there
            swap.restart()
        with rows, _context.enter(_context.replica_state(strategy, ctx)):
            out, info["assigned"], assigned = _assigning(fn, args, kwargs, swap)
        written = swap.pending() if swap is not None else []
        info["written"] = [i for i, _ in written]
        out_leaves, info["tree"] = jax.tree.flatten(out)
        info["layout"] = [
            None if _jax_internals.is_inner_tracer(x, trace) else (x,) for x in out_leaves
        ]
        outs = [x for x, c in zip(out_leaves, info["layout"]) if c is None]
        return outs + assigned + [jnp.asarray(v) for _, v in written]

    # jit disabled: a `jax.jit` inside fn is traced again in this replica's context, never
    # taken from (or left in) its cache, where a trace made for another context may be.
    closed = _trace(replica, gathers.n, [leaves[k] for k in dynamic])
    args = []
    for k in dynamic:
        column = [f[0][k] for f in flat]
        shared = all(x is column[0] for x in column)
        args.append((column[0], False) if shared else (_stacked(column, k, members, stack), True))
    everyone = [jax.tree.leaves(i) for i in inputs]  # an input varies if replicas' differ
    varying = [any(e[k] is not leaves[k] for e in everyone) for k in dynamic]
    start = sum(c is None for c in info["layout"])
    at = range(start, start + sum(x is None for *_, ks in info["assigned"] for x in ks))
    flags = _varying.varying(closed.jaxpr, varying, AXIS)
    assigned = (info["assigned"], flags, _varying.slices(closed, at, AXIS, dynamic))
    how = (info["tree"], info["layout"], info["trace"], info["written"], assigned)
    return _Traced(closed, args, *how)


def _assigning(fn: Callable, args: tuple, kwargs: dict, swap: Any) -> tuple:
    """``fn(*args, **kwargs)`` in the running trace, what it assigned in its state taken
    out (`jaxdist._state.assign.take_assigned`'s records and leaves): the output, records,
    leaves. A step taking its state as arguments (`jaxdist._state.replica.explicit_state`)
    assigns nothing: its objects are not walked."""
    if _replica.is_explicit(fn):
        return fn(*args, **kwargs), [], []
    before = _assign.snapshot(fn)
    numbers = _assign.number_places(before, swap)  # (their tracers, before the step)
    out = fn(*args, **kwargs)
    return (out, *_assign.take_assigned(fn, before, numbers, _any))


def _any(fn: Callable, places: list) -> None:
    del fn, places  # a replica step may assign anything: each replica's value is kept


def _stacked(column: list, k: int, members: tuple, stack: Callable | None) -> Any:
    whole = stack(k, members) if stack is not None else None
    rows = [as_array(x) for x in column]
    if whole is not None and jnp.shape(whole) == (len(rows), *jnp.shape(rows[0])):
        return whole
    return jnp.stack(rows)


def _trace(replica: Callable, n: int, arrays: list) -> Any:
    """``replica`` traced under the replica axis, with jit disabled; a replica with no
    example whose step scans its rows (``lax.map(f, x)``) is traced with jit enabled: JAX
    cannot run a zero-length scan with jit disabled ("zero-length scan is not supported
    in disable_jit() mode", jax 0.10), and its scan, holding no collective, stays whole."""
    trace = jax.make_jaxpr(replica, axis_env=[(AXIS, n)])
    try:
        with jax.disable_jit():
            return trace(*arrays)
    except ValueError as e:
        if "zero-length scan" not in str(e):
            raise
    return trace(*arrays)


def _groups(inputs: list) -> list[tuple[int, ...]]:
    """Replicas whose inputs have the same structure, shapes and dtypes (and static values)."""
    groups: dict = {}
    for i, tree in enumerate(inputs):
        leaves, treedef = jax.tree.flatten(tree)
        shapes = ((jnp.shape(x), jnp.result_type(x)) if is_array(x) else id(x) for x in leaves)
        groups.setdefault((treedef, *shapes), []).append(i)
    return [tuple(g) for g in groups.values()]


def _trace_all(
    strategy, cdo, fn, inputs, groups, devices, gathers: _Learnt, stack=None
) -> list[_Traced]:
    """Every group's jaxpr, traced again while all_gather lengths are being learnt."""
    for _ in range(MAX_PASSES):
        traced, error = [], None
        for members in groups:
            try:
                traced.append(
                    trace_group(strategy, cdo, fn, inputs, members, devices, gathers, stack)
                )
            except Exception as e:  # noqa: BLE001 - raised below unless a replay is due
                error = error or e
        if not gathers.replay():
            if error is not None:
                raise error
            return traced
    raise RuntimeError(f"A partial-batch step was traced {MAX_PASSES} times without settling.")


def trace(
    strategy: Any,
    cdo: Any,
    fn: Callable,
    inputs: list,
    devices: tuple,
    stack: Callable | None = None,
) -> tuple:
    """Every replica's outputs of ``fn`` on its ``(args, kwargs)`` in ``inputs``, in the
    caller's trace; also the ids of outputs that are one value for every replica
    (``stack``: see `trace_group`), and what the step assigned in its state (`_assigned`)."""
    groups, n = _groups(inputs), len(inputs)
    learnt = _Learnt(n)
    for _ in range(MAX_PASSES):
        traced = _trace_all(strategy, cdo, fn, inputs, groups, devices, learnt, stack)
        invariant: dict[int, Any] = {}
        merge = _merge.run_merge(strategy, n, groups, invariant, [t.trace for t in traced])
        try:
            plan = _lockstep.Groups(n, groups, merge)
            results = _lockstep.run(plan, [t.jaxpr for t in traced], [t.args for t in traced])
            break
        except _merge.MergeShapes as e:  # a merge_fn's result shapes depend on every replica's
            learnt.merges[e.index] = e.shapes
    else:
        raise RuntimeError(f"A partial-batch step was traced {MAX_PASSES} times without settling.")
    _settle_numbers(traced[0], results[0])  # groups[0] holds replica 0
    outs: list = [None] * n
    for t, members, values in zip(traced, groups, results):
        split = [_lockstep.rows(v, len(members)) for v in values]
        for j, i in enumerate(members):
            it = iter(s[j] for s in split)
            leaves = [next(it) if c is None else c[0] for c in t.layout]
            outs[i] = jax.tree.unflatten(t.out_tree, leaves)
    return outs, invariant, _assigned(fn, traced, groups, results, n)


def _assigned(fn: Callable, traced: list, groups: list, results: list, n: int) -> list:
    """What the replicas assigned in the state, as its places keep it (`jaxdist._state.
    replica.combined`): ``[(chain, value)]``."""
    records = traced[0].assigned[0]
    places = [chain for chain, _, _ in records]
    if any([c for c, _, _ in t.assigned[0]] != places for t in traced[1:]):
        raise RuntimeError(
            f"The replicas of the step {describe(fn)} assigned different places of its state "
            "on a partial batch (each group of replicas of one size is traced once): assign "
            "the same places on every replica."
        )
    if not records:
        return []
    k = sum(x is None for _, _, leaves in records for x in leaves)
    columns: list = [[None] * n for _ in range(k)]
    varies = [False] * k
    for t, members, values in zip(traced, groups, results):
        start = sum(c is None for c in t.layout)
        flags = t.assigned[1][start : start + k]
        same = [a == b for a, b in zip(t.assigned[2], traced[0].assigned[2])]  # across sizes
        varies = [a or b or not c for a, b, c in zip(varies, flags, same)]
        for j in range(k):
            rows = _lockstep.rows(values[start + j], len(members))
            for m, i in enumerate(members):
                columns[j][i] = rows[m]
    return _replica.combined(fn, records, columns, varies)


def _settle_numbers(traced: _Traced, values: list) -> None:
    """The numbers the step stored in its state, as replica 0 computed them."""
    swap = _promote.swapped()
    if swap is not None:
        tail = values[len(values) - len(traced.written) :] if traced.written else []
        swap.settle(traced.written, [_lockstep.rows(v, 1)[0] for v in tail])
