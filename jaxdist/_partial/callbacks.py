"""The host callbacks of a partial-batch step, run once per replica.

`jaxdist._partial.lockstep` runs a group of same-shaped replicas under `jax.vmap`. A host
callback there (`jax.debug.print`, `jax.debug.callback`, ``io_callback``: an equation with
a host effect, `jaxdist._base.jax_internals.host_effects`) would run once for the whole
group where none of its inputs varies (a collective's result, the replica id of a group of
one), and not at all where nothing uses its outputs. TF's ``tf.print`` in a replica step
prints on every replica, so each such equation runs here once per member, on the member's
own values, whether its outputs are used or not; inside a ``cond`` branch (``when``), on
the members that take the branch.

>>> import jax, jax.numpy as jnp
>>> seen = []
>>> eqn = jax.make_jaxpr(lambda x: jax.debug.callback(seen.append, x))(1.0).jaxpr.eqns[0]
>>> env = {eqn.invars[0]: (jnp.arange(3.0), True)}  # a group of 3 members, one value each
>>> each_member(eqn, env, 3, when=(jnp.array([True, False, True]), True))
>>> jax.effects_barrier(); [float(x) for x in seen]
[0.0, 2.0]
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from jax import lax
from jax.extend import core

Value = tuple[Any, bool]  # an array, and whether it has the group's members along axis 0


def each_member(eqn: Any, env: dict, size: int, when: Value | None) -> None:
    """An equation with a host effect, run once for each member on its own values (as a
    replica of a full batch runs it): under `jax.vmap` it would run once for the whole
    group where no input varies (a collective's result), and an ordered effect cannot be
    batched. In a ``cond`` branch (``when``), it runs on the members that take it."""
    ins = list(dict.fromkeys(v for v in eqn.invars if not isinstance(v, core.Literal)))
    outs = [v for v in eqn.outvars if not isinstance(v, core.DropVar)]
    info = core.DebugInfo("partial-batch callback", "", tuple(map(str, ins)), tuple(map(str, outs)))
    jaxpr = core.Jaxpr([], ins, outs, [eqn], eqn.effects, info)
    fn = core.jaxpr_as_fun(core.ClosedJaxpr(jaxpr, []))
    skip = lambda *_: [jnp.zeros(v.aval.shape, v.aval.dtype) for v in outs]  # noqa: E731
    values = [env[v] for v in ins]
    per: list = []
    for j in range(size):
        xs = [x[j] if batched else x for x, batched in values]
        if when is None:
            per.append(fn(*xs))
        else:
            flag, batched = when
            per.append(lax.cond(flag[j] if batched else flag, fn, skip, *xs))
    env.update((v, (jnp.stack([p[k] for p in per]), True)) for k, v in enumerate(outs))


def taken(hit: Any, batched: bool, when: Value | None) -> Value:
    """The members that take a branch: ``hit`` (per member where ``batched``) and ``when``."""
    if when is None:
        return hit, batched
    return jnp.logical_and(hit, when[0]), batched or when[1]
