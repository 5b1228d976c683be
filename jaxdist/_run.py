"""`Strategy.run`: one step function traced once for all replicas, lowered through `jax.pmap`.

Arguments are classified leaf by leaf: distributed values are mapped over the
replicas (their stacked arrays split one row per replica); arrays and Python
numbers are broadcast and traced (as `jax.jit` traces them: one compile for every
value); other Python values (bools, strings, None, hashable objects) are static
and part of the compile key. To make a number static, close over it
(``functools.partial(step, n=3)``, created once).

Two paths share one step body:

* eager (no JAX trace active): the pmapped step is cached weakly on ``fn`` (one
  entry per argument signature = one trace), and dispatched through
  `jaxdist._compile.dispatch` (within the in-flight bound);
* traced (inside `jax.jit`, a `lax` loop or any other trace): the step is
  pmapped afresh and called inline, so the user's trace owns it and nothing
  about the trace (no tracer) is kept anywhere.

Ragged inputs (a partial batch) go to `jaxdist._ragged`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import jax
import numpy as np
from jax import lax

from jaxdist import _compile, _context, _ragged
from jaxdist._devices import AXIS, Replicas
from jaxdist._layout import is_tracer, shard_rows
from jaxdist._replica_context import compiled_collectives, make_replica_context
from jaxdist._stage import Staged, example
from jaxdist._validate import describe, hashable_arg, is_number
from jaxdist._values import check_components, from_stacked, is_distributed
from jaxdist._values import stack as stack_value

MAPPED, BROADCAST, STATIC = "m", "b", "s"


def _classify(leaf: Any, one: bool) -> str:
    if is_distributed(leaf):
        return BROADCAST if one else MAPPED
    if isinstance(leaf, (jax.Array, np.ndarray)) or is_number(leaf):
        return BROADCAST
    return STATIC


def _signature(x: Any) -> Hashable:
    if isinstance(x, jax.Array):
        return (x.shape, x.dtype, getattr(x, "weak_type", False))  # typed keys have none
    if isinstance(x, np.ndarray):
        return (x.shape, x.dtype)
    return type(x).__name__


def _static_key(value: Any, index: int) -> Hashable:
    return (type(value), hashable_arg(value, index))


def _plain(leaf: Any, index: int, replicas: Replicas) -> Any:
    """A broadcast argument; with one replica, a distributed value's one component (so a
    `PerReplica` and the plain arrays `run` returns for one replica share a step)."""
    if not is_distributed(leaf):
        return leaf
    check_components(leaf, replicas, f"strategy.run (argument leaf {index})")
    x = stack_value(leaf, replicas)
    return x.reshape(x.shape[1:])


def _mapped(leaf: Any, replicas: Replicas, index: int) -> Any:
    """A distributed argument as an array stacked on the replicas, or None when ragged."""
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
        leaves = [next(st)[1] if k == STATIC else next(it) for k in kinds]
        args, kwargs = jax.tree.unflatten(treedef, leaves)
        collectives, invariant = compiled_collectives(strategy, cdo, n)
        ctx = make_replica_context(strategy, collectives)
        trace = _compile.current_trace()
        with _context.enter(_context.replica_state(strategy, ctx)):
            out = get_fn()(*args, **kwargs)
        leaves, info["treedef"] = jax.tree.flatten(out)
        traced = [
            _compile.is_inner_tracer(x, trace) or (fake and isinstance(x, jax.Array))
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


def _wrap(info: dict, outs: list, n: int, in_trace: bool, arrays: list, state: Any = None) -> Any:
    """The step's outputs: stacked leaves as `PerReplica` (plain for one replica).

    ``state`` (eager) gives an untraced output as the step's state holds it now.
    """
    it = iter(outs)
    leaves = []
    for kind, what in info["layout"]:
        if kind in ("const", "arg"):
            if kind == "arg":
                leaves.append(arrays[what])
            else:
                leaves.append(what if state is None else state(what))
            continue
        a = next(it)
        if n == 1 or what:  # one replica, or a merge_call result: one value
            leaves.append(a[0] if in_trace else shard_rows(a)[0])
        else:
            leaves.append(from_stacked(a))
    return jax.tree.unflatten(info["treedef"], leaves)


def run(strategy: Any, replicas: Replicas, cdo: Any, fn: Callable, args: tuple, kwargs: dict):
    """Runs ``fn`` on every replica of ``strategy`` (see the module docstring)."""
    _context.check_can_run(strategy)
    one = replicas.num == 1 and not replicas.multi_process
    leaves, treedef = jax.tree.flatten((tuple(args), dict(kwargs)), is_leaf=is_distributed)
    kinds = tuple(_classify(x, one) for x in leaves)
    arrays, statics, sigs = [], [], []
    for i, (kind, leaf) in enumerate(zip(kinds, leaves)):
        if kind == STATIC:
            statics.append(_static_key(leaf, i))
            continue
        x = _mapped(leaf, replicas, i) if kind == MAPPED else _plain(leaf, i, replicas)
        if x is None:
            return _ragged.run(strategy, replicas, cdo, fn, tuple(args), dict(kwargs))
        arrays.append(x)
        sigs.append(_signature(x))
    sig = (treedef, kinds, tuple(statics))
    in_axes = tuple(0 if k == MAPPED else None for k in kinds if k != STATIC)
    if _compile.tracing() or any(is_tracer(x) for x in arrays):
        return _run_traced(strategy, replicas, cdo, fn, sig, in_axes, arrays)
    key = (sig, tuple(sigs), program_key(strategy, cdo), replicas.devices, _compile.is_fake_pmap())
    if MAPPED not in kinds:
        in_axes = (0, *in_axes)
    ids = [_compile.replica_ids(replicas, False)] if MAPPED not in kinds else []

    def build() -> tuple:
        info: dict = {}
        body = make_body(strategy, cdo, replicas.num, _compile.weak_callable(fn), sig, info)
        examples = [example(x, ax == 0) for x, ax in zip([*ids, *arrays], in_axes)]
        staged = Staged(
            fn,
            body,
            examples,
            [(AXIS, replicas.num)],
            lambda: [x for _, x in info["layout"]],
            numbers=True,
        )
        axes = (*in_axes, *[None] * staged.num_inputs)
        return _compile.pmap(staged.evaluate, replicas, axes), info, staged

    place = None if replicas.multi_process else replicas.replicate
    (program, info, staged), extra = _compile.steps.get(
        fn, key, build, lambda entry: entry[2].inputs(fn, place)
    )
    what = f"strategy.run({describe(fn)})"
    outs = _compile.dispatch(program, replicas, *ids, *arrays, *extra, what=what)
    staged.write_back(fn, outs)  # Python numbers the step changed in its state
    return _wrap(info, outs, replicas.num, False, arrays, lambda x: staged.output(fn, x))


def program_key(strategy: Any, cdo: Any) -> Hashable:
    """What of a strategy decides its compiled steps: equal strategies share them."""
    ops: Hashable
    try:
        ops = (type(cdo), tuple(sorted(vars(cdo).items())))
        hash(ops)
    except TypeError:
        ops = (type(cdo), cdo)
    return (type(strategy), ops)


def _run_traced(strategy, replicas, cdo, fn, sig, in_axes, arrays) -> Any:
    """Inside a JAX trace: a fresh pmap called inline (nothing about the trace is kept)."""
    info: dict = {}
    body = make_body(strategy, cdo, replicas.num, lambda: fn, sig, info)
    call_axes, call_args = in_axes, arrays
    if MAPPED not in sig[1]:  # a pmap needs one mapped argument
        call_axes, call_args = (0, *in_axes), [_compile.replica_ids(replicas, True), *arrays]
    mapped = _compile.spmd if replicas.multi_process else _compile.pmap
    outs = mapped(body, replicas, tuple(call_axes))(*call_args)
    return _wrap(info, outs, replicas.num, True, arrays)
