"""Steps whose per-replica inputs differ in shape (a partial last batch).

One SPMD program cannot give replicas arrays of different shapes, so such a step
traces each replica's ``fn`` on its own true slice, all inside one program (see
`jaxdist._partial.replay`): eagerly one `jax.jit` program compiled once per pattern of
replica shapes (it runs on the first replica device; outputs then move to each
replica's device), and inside a user's `jax.jit` or `lax` loop inline in the
user's trace, on inputs gathered whole onto every replica device (`_constrain`).
Every replica must call the same `ReplicaContext` collectives in the same order
(as in TF); raw `jax.lax` collectives over the replica axis are not available
here (there is no mapped axis).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdist._base import context as _context
from jaxdist._base import jax_internals as _jax_internals
from jaxdist._base import user_errors as _user_errors
from jaxdist._base.devices import AXIS, Replicas
from jaxdist._base.layout import as_array, is_array, is_tracer
from jaxdist._base.validate import hashable_arg, is_number
from jaxdist._collective.reduce import all_rows
from jaxdist._partial import replay as _replay
from jaxdist._program import compile as _compile
from jaxdist._state import arguments as _arguments
from jaxdist._state import assign as _assign
from jaxdist._state import replica as _replica
from jaxdist._state.stage import Staged
from jaxdist._values.layout import padded, parts, stacked
from jaxdist._values.trees import combine_parts
from jaxdist._values.values import from_parts, is_distributed


def split_inputs(args: tuple, kwargs: dict, n: int) -> tuple[list, Callable]:
    """Replica i's ``(args, kwargs)``, distributed leaves replaced by their component i
    (each value split once: a traced split slices every row), and for `_replay.trace` a
    function giving the rows of replicas ``members`` (in a row) of flat input ``k`` as
    one slice of the stacked or padded array they came from (a group's input then costs
    one slice, not a slice per replica and a stack), or None."""
    leaves, treedef = jax.tree.flatten((args, kwargs), is_leaf=is_distributed)
    columns = [v.values if is_distributed(v) else None for v in leaves]
    inputs = [
        jax.tree.unflatten(treedef, [v if c is None else c[i] for v, c in zip(leaves, columns)])
        for i in range(n)
    ]

    def rows(k: int, members: tuple) -> Any:
        lo, hi = members[0], members[-1] + 1
        flat = jax.tree.leaves(inputs[lo])
        if members != tuple(range(lo, hi)) or len(flat) != len(leaves):
            return None
        v, column = leaves[k], columns[k]
        if column is None or flat[k] is not column[lo]:
            return None  # not this value's row (a row of several leaves came first)
        if stacked(v) is not None:
            return stacked(v)[lo:hi]
        data, lengths = padded(v) or (None, ())
        if data is None or len({lengths[i] for i in members}) != 1:
            return None
        return data[lo:hi, : lengths[lo]] if isinstance(lengths[lo], int) else None

    return inputs, rows


def regroup(outs: list, invariant: dict, replicas: Replicas | None) -> Any:
    """Per-replica outputs as one structure: `PerReplica` leaves, or one value where every
    replica returned the same constant or `merge_call` result (as TF and the compiled path).

    ``replicas`` is None inside a trace (outputs stay tracers, same shapes stacked).
    """
    if len(outs) == 1:
        return outs[0]
    flat = [jax.tree.flatten(o) for o in outs]
    treedef: Any = flat[0][1]
    if any(t != treedef for _, t in flat):
        raise ValueError(
            f"fn must return the same structure for every replica; got {[str(t) for _, t in flat]}."
        )
    leaves = []
    for column in zip(*[f[0] for f in flat]):
        one = all(x is column[0] for x in column) and (
            not is_tracer(column[0]) or id(column[0]) in invariant
        )
        leaves.append(column[0] if one else combine_parts(list(column), replicas))
    return jax.tree.unflatten(treedef, leaves)


def run(strategy: Any, replicas: Replicas, cdo: Any, fn: Callable, args: tuple, kwargs: dict):
    """`Strategy.run` of a step with ragged per-replica inputs (see the module docstring).

    Across several workers, every worker first gathers every replica's inputs, then
    computes every replica's step (the same on each worker: no further communication)
    and keeps its own replicas' outputs. Partial batches are rare (one per epoch), so
    the redundant work is cheap; it gives TF's answers for run, all_reduce and reduce.
    """
    devices = replicas.strings()
    traced = _jax_internals.tracing() or any(is_tracer(x) for x in jax.tree.leaves((args, kwargs)))
    if (
        replicas.multi_process
        and traced
        and any(
            is_distributed(v) and parts(v) is not None
            for v in jax.tree.leaves((args, kwargs), is_leaf=is_distributed)
        )
    ):
        raise NotImplementedError(
            "Per-replica values of different shapes other than partial batches cannot be "
            "traced across workers inside jax.jit; give every replica arrays of the same shape."
        )
    if replicas.multi_process and not traced:
        args, kwargs = jax.tree.map(
            lambda v: _everywhere(v, replicas) if is_distributed(v) else v,
            (args, kwargs),
            is_leaf=is_distributed,
        )
    args = _replica.with_rows(fn, replicas.num, tuple(args))  # its state read per replica
    if traced:
        args, kwargs = _constrain((args, kwargs), replicas, into=True)
        inputs, rows = split_inputs(args, kwargs, replicas.num)
        outs, invariant, assigned = _user_traced(strategy, cdo, fn, inputs, devices, rows)
        if assigned and not _context.in_function():
            raise _replica.assigned_under_jit(fn, assigned[0][0])
        for chain, value in assigned:  # written back by the jd.function being traced
            _assign.replace(fn, chain, value)
        out = regroup(outs, invariant, None)
        return _constrain(out, replicas, into=False)
    return _run_compiled(strategy, replicas, cdo, fn, (args, kwargs), devices)


def _constrain(tree: Any, replicas: Replicas, into: bool) -> Any:
    """Traced: the stacked and padded arrays of ``tree``'s distributed values made whole
    on every replica device (``into`` the step; plain arrays too), or split over the
    replicas again (out of it).

    Replicas slice their own rows out of the inputs. Left to the compiler, slices of
    arrays split over the devices became hundreds of collective permutes and
    all-to-alls (120 ms a step for the demo's MLP on 8 CPU devices). Whole inputs
    cost one all-gather per dtype, for batches and for the rest (the arrays packed
    into one: each collective is a rendezvous of every device, 0.1 ms on 8 CPU
    devices, 3 ms for the demo's 25 arrays one by one), and every device then
    computes the step. The moves are one
    `jax.shard_map`, so the compiler cannot spread a layout across them.
    """
    moved: list = []
    kinds: list = []  # batches apart from state (an unused one is then dropped whole)

    def collect(v: Any) -> Any:
        if is_distributed(v) and parts(v) is None:
            moved.extend(as_array(a) for a in jax.tree.leaves(v))
            kinds.extend([padded(v) is not None] * len(jax.tree.leaves(v)))
        elif into and not is_distributed(v) and is_array(v) and jnp.ndim(v):
            return jax.lax.with_sharding_constraint(v, replicas.replicated)
        return v

    tree = jax.tree.map(collect, tree, is_leaf=is_distributed)
    it = iter(_move(moved, kinds, replicas, into) if moved else [])

    def place(v: Any) -> Any:
        if is_distributed(v) and parts(v) is None:
            return jax.tree.map(lambda _: next(it), v)
        return v

    return jax.tree.map(place, tree, is_leaf=is_distributed)


def _move(arrays: list, kinds: list, replicas: Replicas, into: bool) -> list:
    split, whole = replicas.sharding.spec, replicas.replicated.spec
    body = (lambda *xs: _packed(_gather_rows, list(xs), kinds)) if into else _own_rows
    return jax.shard_map(
        body,
        mesh=replicas.sharding.mesh,
        in_specs=split if into else whole,
        out_specs=whole if into else split,
        check_vma=False,
    )(*arrays)


def _packed(move: Callable, arrays: list, kinds: list) -> list:
    """``move`` of each of ``arrays`` (stacked: rows along axis 0), done once per dtype
    and kind on the arrays packed side by side."""
    out: list = [None] * len(arrays)
    by_dtype: dict = {}
    for k, (a, kind) in enumerate(zip(arrays, kinds)):
        by_dtype.setdefault((a.dtype, kind), []).append(k)
    for ks in by_dtype.values():
        if len(ks) == 1:
            out[ks[0]] = move(arrays[ks[0]])
            continue
        rows = [arrays[k].reshape(arrays[k].shape[0], -1) for k in ks]
        moved = move(jnp.concatenate(rows, axis=1))
        start = 0
        for k, r in zip(ks, rows):
            piece = moved[:, start : start + r.shape[1]]
            out[k] = piece.reshape(moved.shape[0], *arrays[k].shape[1:])
            start += r.shape[1]
    return out


def _own_rows(*xs: jax.Array) -> list:
    return [_own_row(x) for x in xs]


def _gather_rows(x: jax.Array) -> jax.Array:
    return jax.lax.all_gather(x, AXIS, tiled=True)


def _own_row(x: jax.Array) -> jax.Array:
    return jax.lax.dynamic_slice_in_dim(x, jax.lax.axis_index(AXIS), 1)


def _run_compiled(strategy: Any, replicas: Replicas, cdo: Any, fn: Callable, inputs, devices):
    """Eager: one jitted program per pattern of replica shapes, cached weakly on ``fn``.

    The program takes every input array on the first replica device (a padded
    partial batch is one array), traces the replicas, and returns the outputs in
    their distributed layouts; these then move to the replicas' devices.
    """
    flat, in_tree = jax.tree.flatten(inputs)
    arrays = tuple(i for i, x in enumerate(flat) if _is_array_or_number(x))
    statics = tuple((i, _static(flat[i], i)) for i in range(len(flat)) if i not in arrays)
    avals = tuple(jax.typeof(as_array(flat[i])) for i in arrays)
    key = ("ragged", in_tree, arrays, statics, avals, replicas.devices)
    get_fn = _compile.weak_callable(fn)  # (``fn``: the step, or the root with its arguments)
    step = _arguments.step_of(fn)  # its programs are cached on the step itself
    n = replicas.num

    def build() -> tuple:
        info: dict = {}

        def program(*values: Any) -> list:
            leaves: list = [None] * len(flat)
            for i, v in statics + tuple(zip(arrays, values)):
                leaves[i] = _arguments.value(v)
            args, kwargs = jax.tree.unflatten(in_tree, leaves)
            inputs, rows = split_inputs(args, kwargs, n)
            outs, invariant, assigned = _user_traced(strategy, cdo, get_fn(), inputs, devices, rows)
            out_leaves, info["treedef"] = jax.tree.flatten(regroup(outs, invariant, None))
            info["consts"] = [None if is_tracer(x) else (x,) for x in out_leaves]
            info["chains"] = [chain for chain, _ in assigned]  # written back after the call
            written, info["written"] = jax.tree.flatten([value for _, value in assigned])
            info["written_layout"] = [None if is_tracer(x) else (x,) for x in written]
            return [x for x in out_leaves + written if is_tracer(x)]

        outputs = lambda: [c[0] for c in info["consts"] if c]  # noqa: E731
        staged = Staged(fn, program, avals, outputs=outputs, numbers=True)
        options = _compile.quick_options(replicas)
        return jax.jit(staged.evaluate, compiler_options=options), info, staged

    to_first = functools.partial(jax.device_put, device=replicas.first_device)
    (program, info, staged), extra = _compile.steps.get(
        step, key, build, lambda entry: entry[2].inputs(fn, to_first), operator.itemgetter(2)
    )
    first = [replicas.first_device] * len(arrays)
    host = [_host_view(flat[i], replicas) for i in arrays]
    outs = program(*jax.device_put(host, first), *extra)
    staged.write_back(fn, outs)  # Python numbers the step changed in its state
    traced = iter(outs)
    out = [next(traced) if c is None else staged.output(fn, c[0]) for c in info["consts"]]
    if info["chains"]:  # what it assigned in its state, on the replicas' devices
        kept = [next(traced) if c is None else c[0] for c in info["written_layout"]]
        values = _to_replicas(jax.tree.unflatten(info["written"], kept), replicas)
        for chain, value in zip(info["chains"], values):
            _assign.replace(fn, chain, value)
    return _to_replicas(jax.tree.unflatten(info["treedef"], out), replicas)


def _static(value: Any, index: int) -> Any:
    """A static argument's key (an unhashable object holding state: by identity)."""
    try:
        return _arguments.key(value)
    except TypeError:
        return hashable_arg(value, index)  # (raises, naming the leaf)


def _everywhere(value: Any, replicas: Replicas) -> Any:
    """Every replica's component of ``value`` on this worker's first device (same layout)."""
    if parts(value) is not None:
        raise NotImplementedError(
            "Per-replica values of different shapes other than partial batches cannot be "
            "gathered across workers; give every replica arrays of the same shape."
        )
    full = all_rows(replicas, value)
    return jax.tree.unflatten(jax.tree.structure(value), [full])


def _to_replicas(tree: Any, replicas: Replicas) -> Any:
    """The distributed values of ``tree``, computed on the first device, moved to the
    replicas' devices (this worker's replicas only, with several workers)."""
    leaves, treedef = jax.tree.flatten(tree, is_leaf=is_distributed)
    stacked = []
    for i, v in enumerate(leaves):
        components = parts(v) if is_distributed(v) else None
        if components is not None:
            mine = [components[r] for r in replicas.local]
            leaves[i] = from_parts(jax.device_put(mine, list(replicas.local_devices)))
        elif is_distributed(v):
            stacked.append(i)
    arrays = [jax.tree.leaves(leaves[i]) for i in stacked]
    placed = iter(_place([a for row in arrays for a in row], replicas))
    for i, row in zip(stacked, arrays):
        leaves[i] = jax.tree.unflatten(jax.tree.structure(leaves[i]), [next(placed) for _ in row])
    return jax.tree.unflatten(treedef, leaves)


def _place(full: list[jax.Array], replicas: Replicas) -> list[jax.Array]:
    if not replicas.multi_process:
        # Between CPU devices, through a host view: splitting a device array compiles a
        # slicing program per shape (0.1 s each), splitting a NumPy view does not. One
        # device_put for every array.
        host = [np.asarray(a) for a in full] if replicas.on_cpu else full
        return jax.device_put(host, [replicas.sharding] * len(full))
    return [
        jax.make_array_from_single_device_arrays(
            a.shape,
            replicas.sharding,
            [
                jax.device_put(a[i : i + 1], d)
                for i, d in zip(replicas.local, replicas.local_devices)
            ],
        )
        for a in full
    ]


def _host_view(x: Any, replicas: Replicas) -> Any:
    """``x`` to send to the first device: spread over CPU devices, a NumPy view (one
    copy; gathering a device array to one device takes JAX's slow path)."""
    spread = isinstance(x, jax.Array) and len(x.sharding.device_set) > 1
    return np.asarray(x) if spread and replicas.on_cpu and x.is_fully_addressable else as_array(x)


def _is_array_or_number(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray)) or is_number(x)


def _user_traced(strategy: Any, cdo: Any, fn: Callable, *how: Any) -> tuple:
    """`_replay.trace` of the user's step; a Python use of a traced value in it is the
    error `jaxdist._base.user_errors` words (the step's file:line and the fix), as on full
    batches."""
    try:
        return _replay.trace(strategy, cdo, fn, *how)
    except _user_errors.STEP_ERRORS as e:
        if not _user_errors.is_step_error(e):
            raise
        _user_errors.raise_for_step(fn, e)
