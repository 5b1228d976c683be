"""Which values of a replica step differ from one replica to the next, read from its jaxpr.

TF tells a mirrored variable (one value, the same on every replica) from a per-replica one by
the variable's type; a value a step computes is mirrored when it is computed from mirrored
values and the results of all-reduces. JAX's ``shard_map`` can type values with the mesh axes
they vary over (``check_vma``), but not on every JAX jaxdist supports, and not in a jaxpr traced
with an axis environment. `varying` reads the same fact off the step's jaxpr instead: a value
varies over the replica axis when it depends on a mapped input or on ``axis_index``, and stops
varying where an all-reduce over that axis (``psum``, ``pmax``, ``pmin``, ``all_gather``)
combines it. Where the jaxpr holds something this module does not know (a primitive with
sub-programs of another kind), the answer is "varies" when any input does: a value is then
kept per replica, never wrongly taken as one.

>>> import jax, jax.numpy as jnp
>>> def step(x, w):
...     return w + jax.lax.psum(x, "r"), x * w
>>> closed = jax.make_jaxpr(step, axis_env=[("r", 2)])(jnp.ones(3), jnp.ones(3))
>>> varying(closed.jaxpr, [True, False], "r")
[False, True]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_COMBINE = frozenset({"psum", "pmax", "pmin", "all_gather", "psum_invariant", "psum2"})
_SPLIT = frozenset({"axis_index", "ppermute", "all_to_all", "reduce_scatter", "psum_scatter"})
_CAST = frozenset({"pvary", "pbroadcast"})  # a type change only: the same value


def _axes(params: dict) -> tuple:
    names = params.get("axes", params.get("axis_name", ()))
    return names if isinstance(names, tuple) else (names,)


def _jaxpr(x: Any) -> Any:
    """The open jaxpr of ``x`` (a ``Jaxpr`` or a ``ClosedJaxpr``), or None."""
    inner = getattr(x, "jaxpr", None)
    if inner is not None and hasattr(inner, "eqns"):
        return inner
    return x if hasattr(x, "eqns") and hasattr(x, "invars") else None


def _subjaxprs(params: dict) -> list:
    found = []
    for value in params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            j = _jaxpr(item)
            if j is not None:
                found.append(j)
    return found


def varying(jaxpr: Any, inputs: Sequence[bool], axis: str) -> list[bool]:
    """For each output of ``jaxpr``, whether it can differ across ``axis``'s replicas,
    given which of its inputs do (``inputs``; its constants do not)."""
    env: dict[Any, bool] = dict(zip(jaxpr.invars, inputs))

    def read(v: Any) -> bool:
        return env.get(v, False) if hasattr(v, "aval") and not hasattr(v, "val") else False

    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        outs = _eqn(eqn, ins, axis)
        for v, t in zip(eqn.outvars, outs):
            env[v] = t
    return [read(v) for v in jaxpr.outvars]


def _eqn(eqn: Any, ins: list[bool], axis: str) -> list[bool]:
    name, params, n = eqn.primitive.name, eqn.params, len(eqn.outvars)
    if name in _COMBINE and axis in _axes(params):
        grouped = params.get("axis_index_groups") is not None
        return [grouped and any(ins)] * n
    if name in _SPLIT and axis in _axes(params):
        return [True] * n
    if name in _CAST:
        return list(ins[:n]) + [any(ins)] * (n - len(ins[:n]))
    subs = _subjaxprs(params)
    if not subs:
        return [any(ins)] * n
    try:
        if name == "cond":
            return _cond(subs, ins, axis, n)
        if name == "while":
            return _while(params, ins, axis, n)
        if name == "scan":
            return _scan(params, ins, axis, n)
    except (KeyError, IndexError, TypeError):  # another JAX's parameters: the safe answer
        return [any(ins) or any(_splits(j, axis) for j in subs)] * n
    one = subs[0]
    if len(subs) == 1 and len(one.invars) == len(ins) and len(one.outvars) == n:
        return varying(one, ins, axis)  # a call: jit, remat, custom_jvp/vjp, shard_map
    return [any(ins) or any(_splits(j, axis) for j in subs)] * n


def _splits(jaxpr: Any, axis: str) -> bool:
    """Whether ``jaxpr`` (at any depth) makes values differ across ``axis`` by itself."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in _SPLIT and axis in _axes(eqn.params):
            return True
        if any(_splits(j, axis) for j in _subjaxprs(eqn.params)):
            return True
    return False


def _cond(branches: list, ins: list[bool], axis: str, n: int) -> list[bool]:
    if ins[0]:  # replicas may take different branches
        return [True] * n
    outs = [False] * n
    for branch in branches:
        outs = [a or b for a, b in zip(outs, varying(branch, ins[1:], axis))]
    return outs


def _while(params: dict, ins: list[bool], axis: str, n: int) -> list[bool]:
    cond, body = _jaxpr(params["cond_jaxpr"]), _jaxpr(params["body_jaxpr"])
    nc, nb = params["cond_nconsts"], params["body_nconsts"]
    cconsts, bconsts, carry = ins[:nc], ins[nc : nc + nb], list(ins[nc + nb :])
    while True:
        if varying(cond, cconsts + carry, axis)[0]:  # replicas may loop a different number
            return [True] * n
        new = [a or b for a, b in zip(carry, varying(body, bconsts + carry, axis))]
        if new == carry:
            return carry
        carry = new


def _scan(params: dict, ins: list[bool], axis: str, n: int) -> list[bool]:
    body = _jaxpr(params["jaxpr"])
    nc, ncarry = params["num_consts"], params["num_carry"]
    consts, carry, xs = ins[:nc], list(ins[nc : nc + ncarry]), ins[nc + ncarry :]
    while True:
        outs = varying(body, consts + carry + xs, axis)
        new = [a or b for a, b in zip(carry, outs[:ncarry])]
        if new == carry:
            return carry + outs[ncarry:]
        carry = new


def of_map(jaxpr: Any, axis: str) -> list[bool] | None:
    """For each output of the first map over ``axis`` in ``jaxpr`` (a ``shard_map``, which
    `jax.pmap` is since JAX 0.8, at any depth of calls), whether it can differ across the
    replicas; None when there is no such map."""
    for eqn in jaxpr.eqns:
        params = eqn.params
        if eqn.primitive.name == "shard_map" and axis in _spec_axes(params.get("in_specs", ())):
            inner = _jaxpr(params["jaxpr"])
            flags = [axis in _spec_axes((spec,)) for spec in params["in_specs"]]
            return varying(inner, flags, axis)
        for sub in _subjaxprs(params):
            found = of_map(sub, axis)
            if found is not None:
                return found
    return None


def _spec_axes(specs: Any) -> set:
    names: set = set()
    for spec in specs:
        for part in spec or ():
            names.update(part if isinstance(part, tuple) else (part,))
    return names


def slices(closed: Any, outputs: Sequence[int], axis: str, inputs: Sequence[Any]) -> list:
    """For each output index of ``closed`` (a ``ClosedJaxpr``), what it is computed from,
    as a value that two replicas' jaxprs (of a partial batch: one per size) share only where the
    output is the same function of the same values: its inputs (named by ``inputs``),
    constants (by identity), literals (by value), the results of all-reduces over ``axis``
    (by their order: every replica runs the same collectives in the same order) and the
    operations between them. Two replicas' values of an output that does not vary in
    either's jaxpr are equal where these agree; a shape read as a number (``x.shape[0]``)
    makes them differ."""
    jaxpr = closed.jaxpr
    made: dict[Any, tuple] = {}
    order = 0
    for eqn in jaxpr.eqns:
        for i, v in enumerate(eqn.outvars):
            made[v] = (eqn, i, order)
        if eqn.primitive.name in _COMBINE and axis in _axes(eqn.params):
            order += 1
    names = dict(zip(jaxpr.invars, inputs))
    consts = {v: ("const", id(c)) for v, c in zip(jaxpr.constvars, closed.consts)}
    memo: dict[Any, Any] = {}

    def of(v: Any) -> Any:
        if hasattr(v, "val"):  # a literal
            return ("literal", str(v.val), str(v.aval))
        if v in memo:
            return memo[v]
        if v in names:
            found: Any = ("input", names[v])
        elif v not in made:
            found = consts.get(v, ("const", str(v)))
        else:
            eqn, i, k = made[v]
            if eqn.primitive.name in _COMBINE and axis in _axes(eqn.params):
                found = ("all-reduce", k, i, str(v.aval))
            else:
                params = str(sorted(eqn.params.items(), key=lambda kv: kv[0]))
                found = (eqn.primitive.name, params, i, tuple(of(x) for x in eqn.invars))
        memo[v] = found
        return found

    try:
        return [of(jaxpr.outvars[j]) for j in outputs]
    except RecursionError:  # a very long computation: taken as differing
        return [object() for _ in outputs]
