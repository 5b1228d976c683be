"""`ReplicaContext.merge_call` in a partial-batch step (see `jaxdist._partial.replay`): a primitive
of its own (``merge_p``) whose ``merge_fn`` runs once with every replica's arguments when
the replicas' jaxprs reach it in lockstep (`run_merge`). Its result's shapes come from
``merge_fn`` on stand-ins (`bind_merge`); where the real results differ (a gather of a
partial batch), `MergeShapes` asks for another trace with them. It has no gradient or
batching rule (TF's tape gives no gradient through a merge_call).

>>> import numpy as np, jaxdist as jd
>>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
>>> def step(x):  # merge_fn sees every replica's rows, 2 and 1 of a batch of 3
...     ctx = jd.get_replica_context()
...     return ctx.merge_call(lambda strategy, v: strategy.reduce("SUM", v, axis=0), args=(x,))
>>> batch = next(iter(s.experimental_distribute_dataset([np.arange(3.0)])))
>>> float(s.run(step, args=(batch,)))  # one value for every replica, as TF's regroup
3.0
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend import core
from jax.interpreters import ad, batching

from jaxdist._base import context as _context
from jaxdist._base import jax_internals as _jax_internals
from jaxdist._base.layout import as_array
from jaxdist._partial import lockstep as _lockstep
from jaxdist._values.trees import select
from jaxdist._values.values import from_parts, from_stacked

# -- merge_call as a primitive -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)  # compared (and hashed) by identity
class MergeSpec:
    """A `merge_call` site: ``merge_fn``, where its array arguments go, its result's shape."""

    merge_fn: Callable
    index: int  # the replica's how-manieth merge_call
    treedef: Any
    leaves: tuple  # the non-array arguments, None where an array goes
    out_tree: Any
    out_leaves: tuple  # the non-array results, None where an array comes back
    out_avals: tuple


merge_p = core.Primitive(_lockstep.MERGE)
merge_p.multiple_results = True
merge_p.def_abstract_eval(lambda *avals, spec: list(spec.out_avals))

NESTED_MERGE = (
    "In a partial-batch step, ReplicaContext.merge_call cannot be called inside {what}: "
    "merge_fn is arbitrary Python run once for all replicas, with no gradient or batching "
    "rule. Call merge_call in the step's own code (outside jax.grad/jvp/vmap), or make every "
    "global batch divisible by num_replicas_in_sync (a full batch has no such limit)."
)


CLOSURE = (
    "In a partial-batch step, merge_fn used a value computed in the step that was not passed "
    "through merge_call's args or kwargs (a closure). merge_fn runs once for all replicas, "
    "after every replica has reached the merge_call, so give it such values as arguments: "
    "ctx.merge_call(merge_fn, args=(value,))."
)


def _no_impl(*args: Any, spec: MergeSpec) -> Any:
    raise RuntimeError(NESTED_MERGE.format(what="this transformation"))


def _no_jvp(primals: Any, tangents: Any, spec: MergeSpec) -> Any:
    raise RuntimeError(NESTED_MERGE.format(what="jax.grad / jvp / vjp"))


def _no_batching(args: Any, dims: Any, spec: MergeSpec) -> Any:
    raise RuntimeError(NESTED_MERGE.format(what="jax.vmap"))


merge_p.def_impl(_no_impl)
ad.primitive_jvps[merge_p] = _no_jvp
batching.primitive_batchers[merge_p] = _no_batching


def bind_merge(
    strategy: Any, n: int, k: int, known: Any, merge_fn: Callable, args: tuple, kwargs: dict
) -> Any:
    """Stage 1 of a merge_call: its result's shape from ``merge_fn`` on stand-ins (every
    replica given this replica's arguments), or ``known`` from running it (``merge_fn``
    can return shapes that depend on every replica's: a gather), and the primitive bound."""
    leaves, treedef = jax.tree.flatten((args, kwargs))
    arrays = [x for x in leaves if isinstance(x, jax.Array)]
    statics = tuple(None if isinstance(x, jax.Array) else x for x in leaves)
    info: dict = {}

    def stand_in(*xs: Any) -> list:
        it = iter(xs)
        copies = [from_stacked(jnp.stack([next(it)] * n)) if s is None else s for s in statics]
        a, k = jax.tree.unflatten(treedef, copies)
        with _context.enter(_context.merge_state(strategy)):
            result = select(merge_fn(strategy, *a, **k), 0)
        out, info["tree"] = jax.tree.flatten(result)
        info["leaves"] = tuple(None if isinstance(x, jax.Array) else x for x in out)
        return [x for x in out if isinstance(x, jax.Array)]

    shapes = jax.eval_shape(stand_in, *arrays)  # and the result's structure, in ``info``
    shapes = known or shapes
    avals = tuple(jax.core.ShapedArray(s.shape, s.dtype, weak_type=s.weak_type) for s in shapes)
    spec = MergeSpec(merge_fn, k, treedef, statics, info["tree"], info["leaves"], avals)
    it = iter(merge_p.bind(*arrays, spec=spec))
    return jax.tree.unflatten(
        spec.out_tree, [next(it) if s is None else s for s in spec.out_leaves]
    )


def run_merge(
    strategy: Any, n: int, groups: list[tuple], invariant: dict, stage_one: list
) -> Callable:
    """The lockstep's merge handler: ``merge_fn`` once, with every replica's arguments as
    `PerReplica` values; its result goes to every replica (a value that is not
    per-replica as one value, as TF). ``merge_fn`` is traced to a jaxpr first: one that
    captured a value of the replicas' traces (``stage_one``) is a clear error."""

    def merge(eqns: list, inputs: list) -> list:
        spec: MergeSpec = eqns[0].params["spec"]
        per_replica: list = [None] * n
        for values, members in zip(inputs, groups):
            split = [_lockstep.rows(v, len(members)) for v in values]
            for j, i in enumerate(members):
                per_replica[i] = [s[j] for s in split]
        flat = [x for row in per_replica for x in row]
        same: list = []
        call = functools.partial(_call_merge, strategy, spec, n, same)
        closed, shapes = jax.make_jaxpr(call, return_shape=True)(*flat)
        for c in closed.consts:
            if any(_jax_internals.is_inner_tracer(c, t) for t in stage_one):
                raise RuntimeError(CLOSURE)
        columns = jax.tree.unflatten(jax.tree.structure(shapes), core.jaxpr_as_fun(closed)(*flat))
        got = [[_spec(c if one else c[i]) for c, one in zip(columns, same)] for i in range(n)]
        for eqn, members in zip(eqns, groups):
            want = [_spec(a) for a in eqn.params["spec"].out_avals]
            if any(got[i] != want for i in members):
                raise MergeShapes(spec.index, got)
        return [_merge_outputs(columns, same, members, invariant) for members in groups]

    return merge


class MergeShapes(Exception):  # noqa: N818 - a signal to trace again (`jaxdist._partial.replay.trace`)
    """merge_fn's results have other shapes than its stand-ins gave: trace again with these."""

    def __init__(self, index: int, shapes: list) -> None:
        super().__init__(index, shapes)
        self.index, self.shapes = index, shapes


def _spec(x: Any) -> jax.ShapeDtypeStruct:
    aval = jax.typeof(x) if not isinstance(x, jax.core.ShapedArray) else x
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)


def _call_merge(strategy: Any, spec: MergeSpec, n: int, same: list, *flat: Any) -> list:
    """``merge_fn`` on the replicas' arguments; per array result, one value (``same``) or
    each replica's."""
    k = len(flat) // n
    rows = [flat[i * k : (i + 1) * k] for i in range(n)]
    it = iter([from_parts(list(column)) for column in zip(*rows)])
    a, kw = jax.tree.unflatten(spec.treedef, [next(it) if s is None else s for s in spec.leaves])
    with _context.enter(_context.merge_state(strategy)):
        result = spec.merge_fn(strategy, *a, **kw)
    outs = [_array_leaves(select(result, i)) for i in range(n)]
    same[:] = [all(x is c[0] for x in c) for c in zip(*outs)]
    return [c[0] if one else list(c) for c, one in zip(zip(*outs), same)]


def _array_leaves(tree: Any) -> list:
    return [x for x in jax.tree.leaves(tree) if isinstance(x, jax.Array)]


def _merge_outputs(columns: list, same: list, members: tuple, invariant: dict) -> list:
    """A group's merge results: one value where every replica got the same object."""
    values = []
    for column, one in zip(columns, same):
        if one:
            invariant[id(column)] = column
            values.append((column, False))
        else:
            values.append((jnp.stack([as_array(column[i]) for i in members]), True))
    return values
