"""Tracing the replicas of a ragged step (a partial batch) inside one program, by replay.

One SPMD program cannot give replicas arrays of different shapes, so a ragged
step traces every replica's ``fn`` on its own true slice. Collectives need every
replica's value, so they are resolved by replay, pass by pass: a pass traces the
replicas until each reaches the first collective whose result is not known yet,
records its input there, and the result is computed from all of them; the next
pass feeds the known results and goes one collective further. A step with C
collectives takes C + 1 passes; the repeated prefixes are the same computation
and the compiler merges them.

Replicas whose inputs have the same shapes form a group and are traced once,
with `jax.vmap` over the group (a TF split has at most three sizes: full,
remainder, empty), so the program grows with the number of groups, not of
replicas. In a grouped pass the code after the pending collective still runs,
on a stand-in value of the right shape (its results are unused and removed by
the compiler). Should a step not trace that way, the replicas are traced one by
one (`trace_replicas`), stopping each at the pending collective.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxdist import _compile, _context
from jaxdist._cross_device_ops import accumulation_for
from jaxdist._layout import as_array, is_array, is_tracer
from jaxdist._reduce_op import ReduceOp, finish
from jaxdist._replica_context import Collectives, gather_leaf, make_replica_context
from jaxdist._values import from_parts, from_stacked, select

MAX_COLLECTIVES = 10_000


class _Pause(BaseException):
    """A replica reached a collective whose result is not known yet (not an error)."""


# -- combining the replicas' collective inputs ---------------------------------------------


def _all_reduce(cdo: Any, n: int, payloads: list, invariant: dict) -> list:
    op: ReduceOp = payloads[0][0]

    def combine(*leaves: Any) -> Any:
        column = [as_array(x) for x in leaves]
        _same_shapes("all_reduce", column)
        fn = accumulation_for(cdo, column[0])
        total = fn(column) if fn is not None else sum(column[1:], column[0])
        return finish(op, total, n)

    _same_structures("all_reduce", [p[1] for p in payloads])
    out = jax.tree.map(combine, *[p[1] for p in payloads])
    return [jax.tree.map(lambda x: x * 1, out) for _ in range(n)]  # one object per replica


def _same_shapes(what: str, column: list) -> None:
    for i, x in enumerate(column):
        if (x.shape, x.dtype) != (column[0].shape, column[0].dtype):
            raise ValueError(
                f"ReplicaContext.{what} needs the same shape and dtype on every replica (TF "
                f"fails on a shape mismatch too); replica 0 gave {column[0].dtype}"
                f"{list(column[0].shape)} and replica {i} gave {x.dtype}{list(x.shape)}."
            )


def _same_structures(what: str, values: list) -> None:
    trees: list[Any] = [jax.tree.structure(v) for v in values]
    for i, t in enumerate(trees):
        if t != trees[0]:
            raise ValueError(
                f"ReplicaContext.{what} needs the same structure on every replica; replica 0 "
                f"gave {trees[0]} and replica {i} gave {t}."
            )


def _all_gather(cdo: Any, n: int, payloads: list, invariant: dict) -> list:
    axis = payloads[0][1]

    def combine(*column: Any) -> Any:
        rows = [gather_leaf(x, axis, lambda v: v) for x in column]
        return rows[0] if rows[0].ndim == 0 else jnp.concatenate(rows, axis=axis)

    _same_structures("all_gather", [p[0] for p in payloads])
    out = jax.tree.map(combine, *[p[0] for p in payloads])
    return [jax.tree.map(lambda x: x * 1, out) for _ in range(n)]


def _merge_call(strategy: Any, n: int, payloads: list, invariant: dict) -> list:
    """``merge_fn`` once, on `PerReplica` arguments; its result goes to every replica."""
    merge_fn = payloads[0][0]
    flat = [jax.tree.flatten((p[1], p[2])) for p in payloads]
    merged = [
        from_parts(column) if isinstance(column[0], jax.Array) else column[0]
        for column in zip(*[f[0] for f in flat])
    ]
    args, kwargs = jax.tree.unflatten(flat[0][1], merged)
    with _context.enter(_context.merge_state(strategy)):
        result = merge_fn(strategy, *args, **kwargs)
    for leaf in jax.tree.leaves(result):
        if is_tracer(leaf):
            invariant[id(leaf)] = leaf
    return [select(result, i) for i in range(n)]


def combine(strategy: Any, cdo: Any, n: int, kind: str, payloads: list, invariant: dict) -> list:
    """The result of collective ``kind`` for each replica, from each replica's input."""
    if kind == "merge_call":
        return _merge_call(strategy, n, payloads, invariant)
    return (_all_reduce if kind == "all_reduce" else _all_gather)(cdo, n, payloads, invariant)


def _stand_in(strategy: Any, n: int, kind: str, payload: tuple) -> Any:
    """A value shaped like the pending collective's result (its code runs, unused)."""
    if kind == "all_reduce":
        op, value = payload
        return jax.tree.map(lambda x: finish(op, as_array(x), n), value)
    if kind == "all_gather":
        value, axis = payload
        return jax.tree.map(
            lambda x: gather_leaf(x, axis, lambda v: jnp.concatenate([v] * n, axis=axis)), value
        )
    merge_fn, args, kwargs = payload
    copies = jax.tree.map(
        lambda x: from_stacked(jnp.stack([x] * n)) if isinstance(x, jax.Array) else x,
        (args, kwargs),
    )
    with _context.enter(_context.merge_state(strategy)):
        result = merge_fn(strategy, *copies[0], **copies[1])
    return select(result, 0)


NESTED = (
    "In a partial-batch step, a ReplicaContext collective was given a value computed inside "
    "a nested JAX transformation of the step ({what}: jax.grad/vjp, a lax loop or cond body, "
    "jax.checkpoint or a custom_vjp). The replicas of a partial batch are traced one shape at "
    "a time and their collectives combined between traces, which cannot reach inside those. "
    "Call the collective on values computed in the step's own code (for example all_reduce "
    "the gradients after jax.grad), or make every global batch divisible by "
    "num_replicas_in_sync (a full batch has no such limit)."
)


def check_not_nested(trace: Any, payload: Any) -> None:
    """Raises `NESTED` when a collective's input is a tracer of a trace nested in the step's
    trace ``trace`` (its value does not exist outside that trace)."""
    now = _compile.current_trace()
    if now is None or now is trace:
        return
    for x in jax.tree.leaves(payload):
        if _compile.is_inner_tracer(x, now):
            raise RuntimeError(NESTED.format(what=type(now).__name__))


def _mismatch(where: str, got: list) -> RuntimeError:
    return RuntimeError(
        "The replicas of a partial-batch step did not call the same collectives in the same "
        f"order: at {where} they did {got}. Every replica must call the same ReplicaContext "
        "collectives in the same order."
    )


# -- one replica at a time ----------------------------------------------------------------


def trace_replicas(strategy: Any, cdo: Any, fn: Callable, inputs: list, devices: tuple) -> tuple:
    """Traces ``fn`` on each replica's ``(args, kwargs)``; returns (outputs, invariant ids)."""
    n = len(inputs)
    known: list[tuple[str, list]] = []
    invariant: dict[int, Any] = {}
    trace = _compile.current_trace()
    for _ in range(MAX_COLLECTIVES):
        outs: list = [None] * n
        pending: list = [None] * n
        for i, (args, kwargs) in enumerate(inputs):
            count = [0]

            def call(
                kind: str, *payload: Any, i: int = i, count: list = count, pending: list = pending
            ) -> Any:
                k, count[0] = count[0], count[0] + 1
                if k < len(known):
                    if known[k][0] != kind:
                        raise _mismatch(f"collective {k}", [kind, known[k][0]])
                    return known[k][1][i]
                check_not_nested(trace, payload)
                pending[i] = (kind, payload)
                raise _Pause

            ctx = make_replica_context(strategy, _collectives(call, lambda i=i: i, devices[i]))
            try:
                with _context.enter(_context.replica_state(strategy, ctx)), jax.disable_jit():
                    outs[i] = fn(*args, **kwargs)
            except _Pause:
                pass
        if all(p is None for p in pending):
            return outs, invariant
        kinds = [p[0] if p is not None else "returned" for p in pending]
        if len(set(kinds)) != 1 or "returned" in kinds:
            raise _mismatch(f"collective {len(known)}", kinds)
        results = combine(strategy, cdo, n, kinds[0], [p[1] for p in pending], invariant)
        known.append((kinds[0], results))
    raise RuntimeError(f"A partial-batch step called more than {MAX_COLLECTIVES} collectives.")


def _collectives(call: Callable, replica_id: Callable, device: Any) -> Collectives:
    return Collectives(
        replica_id=replica_id,
        all_reduce=lambda op, value: call("all_reduce", op, value),
        all_gather=lambda value, axis: call("all_gather", value, axis),
        merge_call=lambda fn, args, kwargs: call("merge_call", fn, args, kwargs),
        devices=lambda: (device,) if isinstance(device, str) else tuple(device),
    )


# -- groups of same-shaped replicas, traced once each with jax.vmap --------------------------


def _groups(inputs: list) -> list[list[int]]:
    """Replicas whose inputs have the same structure, shapes and dtypes (and static values)."""
    groups: dict = {}
    for i, tree in enumerate(inputs):
        leaves, treedef = jax.tree.flatten(tree)
        shapes = ((jnp.shape(x), jnp.result_type(x)) if is_array(x) else id(x) for x in leaves)
        key = (treedef, *shapes)
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def trace_groups(strategy: Any, cdo: Any, fn: Callable, inputs: list, devices: tuple) -> tuple:
    """`trace_replicas` with each group of same-shaped replicas traced once (`jax.vmap`)."""
    n = len(inputs)
    groups = _groups(inputs)
    known: list[tuple[str, list]] = []
    invariant: dict[int, Any] = {}
    for _ in range(MAX_COLLECTIVES):
        runs = [_GroupPass(strategy, fn, inputs, members, known, n, devices) for members in groups]
        if all(r.pending is None for r in runs):
            outs: list = [None] * n
            for members, r in zip(groups, runs):
                for g, i in enumerate(members):
                    outs[i] = r.output(g, i)
            return outs, invariant
        kinds = [r.pending[0] if r.pending else "returned" for r in runs]
        if len(set(kinds)) != 1 or "returned" in kinds:
            raise _mismatch(f"collective {len(known)}", kinds)
        payloads: list = [None] * n
        for members, r in zip(groups, runs):
            for g, i in enumerate(members):
                payloads[i] = r.payload(g)
        known.append((kinds[0], combine(strategy, cdo, n, kinds[0], payloads, invariant)))
    raise RuntimeError(f"A partial-batch step called more than {MAX_COLLECTIVES} collectives.")


class _GroupPass:
    """One pass over one group: ``fn`` vmapped over the group's members, up to the pending
    collective (whose input it records), with the known collectives' results fed in."""

    def __init__(self, strategy, fn, inputs, members, known, n, devices) -> None:
        self.strategy, self.fn, self.members, self.known, self.n = strategy, fn, members, known, n
        self.devices = tuple(devices[i] for i in members)
        flat = [jax.tree.flatten(inputs[i]) for i in members]
        self.in_tree = flat[0][1]
        self.columns = list(zip(*[f[0] for f in flat]))
        self.shared = [all(x is c[0] for x in c) or not is_array(c[0]) for c in self.columns]
        self.pending: Any = None
        self.layout: list[tuple[str, Any]] = []
        batched = [jnp.stack([as_array(x) for x in c]) for c, s in self._columns() if not s]
        known_in = [jax.tree.map(_stack, *[res[i] for i in members]) for _, res in known]
        ids = jnp.asarray(members, jnp.int32)
        self.batched_out, self.payload_leaves = jax.vmap(self._body)(ids, batched, known_in)

    def _columns(self) -> zip:
        return zip(self.columns, self.shared)

    def _body(self, rid: Any, batched: list, known_rows: list) -> tuple:
        it = iter(batched)
        leaves = [c[0] if s else next(it) for c, s in self._columns()]
        args, kwargs = jax.tree.unflatten(self.in_tree, leaves)
        trace, count, payload_out = _compile.current_trace(), [0], []

        def call(kind: str, *payload: Any) -> Any:
            k, count[0] = count[0], count[0] + 1
            if k < len(self.known):
                if self.known[k][0] != kind:
                    raise _mismatch(f"collective {k}", [kind, self.known[k][0]])
                return known_rows[k]
            if k == len(self.known):
                check_not_nested(trace, payload)
                arrays, static = _split_payload(kind, payload)
                self.pending = (kind, static, jax.tree.structure(arrays))
                payload_out.extend(jax.tree.leaves(arrays))
            return _stand_in(self.strategy, self.n, kind, payload)

        ctx = make_replica_context(self.strategy, _collectives(call, lambda: rid, self.devices))
        with _context.enter(_context.replica_state(self.strategy, ctx)), jax.disable_jit():
            out = self.fn(*args, **kwargs)
        out_leaves, self.out_tree = jax.tree.flatten(out)
        self.layout = _classify(out_leaves, known_rows, trace)
        batched_out = [x for x, (kind, _) in zip(out_leaves, self.layout) if kind == "batched"]
        return batched_out, payload_out

    def output(self, g: int, i: int) -> Any:
        """Member ``g`` (replica ``i``)'s output."""
        it = iter(self.batched_out)
        leaves = []
        for kind, what in self.layout:
            if kind == "batched":
                leaves.append(next(it)[g])
            elif kind == "known":
                leaves.append(jax.tree.leaves(self.known[what[0]][1][i])[what[1]])
            else:
                leaves.append(what)
        return jax.tree.unflatten(self.out_tree, leaves)

    def payload(self, g: int) -> tuple:
        """Member ``g``'s input to the pending collective."""
        kind, static, tree = self.pending
        rows = jax.tree.unflatten(tree, [x[g] for x in self.payload_leaves])
        return _join_payload(kind, static, rows)


def _classify(out_leaves: list, known_rows: list, trace: Any) -> list[tuple[str, Any]]:
    """Each output: a known collective's result fed in, computed (batched), or a constant."""
    known_ids = {
        id(x): (k, j)
        for k, row in enumerate(known_rows)
        for j, x in enumerate(jax.tree.leaves(row))
    }
    layout: list[tuple[str, Any]] = []
    for x in out_leaves:
        if id(x) in known_ids:
            layout.append(("known", known_ids[id(x)]))
        elif _compile.is_inner_tracer(x, trace):
            layout.append(("batched", None))
        else:
            layout.append(("const", x))
    return layout


def _stack(*rows: Any) -> Any:
    return jnp.stack([as_array(r) for r in rows])


def _split_payload(kind: str, payload: tuple) -> tuple:
    """A collective's input as (arrays, static parts)."""
    if kind == "all_reduce":
        op, value = payload
        return jax.tree.map(as_array, value), op
    if kind == "all_gather":
        value, axis = payload
        return jax.tree.map(as_array, value), axis
    merge_fn, args, kwargs = payload
    leaves, treedef = jax.tree.flatten((args, kwargs))
    arrays = [x for x in leaves if isinstance(x, jax.Array)]
    return arrays, (merge_fn, treedef, [None if isinstance(x, jax.Array) else x for x in leaves])


def _join_payload(kind: str, static: Any, arrays: Any) -> tuple:
    if kind == "all_reduce":
        return static, arrays
    if kind == "all_gather":
        return arrays, static
    merge_fn, treedef, leaves = static
    it = iter(arrays)
    args, kwargs = jax.tree.unflatten(treedef, [next(it) if x is None else x for x in leaves])
    return merge_fn, args, kwargs


def trace(strategy: Any, cdo: Any, fn: Callable, inputs: list, devices: tuple) -> tuple:
    """Grouped tracing, falling back to one replica at a time should a step not trace so."""
    try:
        return trace_groups(strategy, cdo, fn, inputs, devices)
    except Exception:  # noqa: BLE001 - retried one at a time; a real error is raised there
        return trace_replicas(strategy, cdo, fn, inputs, devices)
