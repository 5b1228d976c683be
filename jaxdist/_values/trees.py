"""Structures of distributed values, and the `ValueContext` of a value function.

`jaxdist._values.values` defines `PerReplica` and `Mirrored` one leaf at a time; what the
strategies do with whole structures of them is here: one check of their component counts
for every method (`check_components`), replica ``i``'s view of a structure (`select`), the
per-replica results of a step regrouped into one structure (`regroup`), one leaf's
per-replica values in the best layout (`combine_parts`). They use the classes' functions
only, never their fields (`jaxdist._values.layout`). `ValueContext` is what
``experimental_distribute_values_from_function`` passes its function.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jaxdist._base.devices import Replicas
from jaxdist._base.layout import (
    as_array,
    is_tracer,
    only_lengths_differ,
    pad_rows,
    stack_on_devices,
)
from jaxdist._values.layout import num_components
from jaxdist._values.values import (
    from_padded,
    from_parts,
    from_shaped,
    from_stacked,
    is_distributed,
)


def check_components(value: Any, replicas: Replicas, what: str, default: bool = False) -> None:
    """One rule for every method: a distributed value has one component per replica.

    (A multi-process value may hold this process's replicas only.) TF has no one
    rule: its ``reduce`` sums whatever components there are, its ``gather`` and
    ``run`` fail with an ``IndexError``. ``default``: the method is the default
    strategy's (no scope active), which the message then says, with the fix.

    Raises:
        ValueError: a distributed leaf of ``value`` has another number of components.
    """
    for i, leaf in enumerate(jax.tree.leaves(value, is_leaf=is_distributed)):
        if not is_distributed(leaf):
            continue
        n = num_components(leaf)
        if n != replicas.num and not (replicas.multi_process and n == len(replicas.local)):
            where = "" if is_distributed(value) else f" (leaf {i})"
            if default:
                raise ValueError(
                    f"{what}: no strategy scope is active, so this is the default strategy "
                    f"(1 replica), but the {type(leaf).__name__}{where} has {n} components: "
                    f"a strategy with {n} replicas made it. Call {what} of the strategy that "
                    "made the value, or call it inside `with strategy.scope():` (where "
                    "jd.get_strategy() is that strategy)."
                )
            raise ValueError(
                f"{what}: the {type(leaf).__name__}{where} has {n} components, but the strategy "
                f"has {replicas.num} replicas. A distributed value belongs to a strategy with "
                "as many replicas as it has components (values made by another strategy, or "
                "by hand with the wrong count, are not accepted)."
            )


def combine_parts(parts: Sequence[Any], replicas: Replicas | None) -> Any:
    """One leaf's per-replica values as one `PerReplica`, in the best layout.

    Same shapes: stacked; shapes that differ only in axis 0 (a partial batch):
    padded with the lengths; anything else: parts. ``replicas`` None means traced
    values (jax.numpy), else each value goes to its replica's device.
    """
    rows = [as_array(p) for p in parts]
    same = len({(r.shape, r.dtype) for r in rows}) == 1
    if replicas is None or any(is_tracer(r) for r in rows):
        if same:
            return from_stacked(jnp.stack(rows))
        if only_lengths_differ(rows):
            return from_padded(pad_rows(rows), [r.shape[0] for r in rows])
        return from_parts(rows)
    if same:
        return from_stacked(stack_on_devices(rows, replicas))
    if only_lengths_differ(rows):
        size = max(r.shape[0] for r in rows)
        pads = [[(0, size - r.shape[0])] + [(0, 0)] * (r.ndim - 1) for r in rows]
        with_pads = [jnp.pad(r, pad) for r, pad in zip(rows, pads)]
        return from_padded(stack_on_devices(with_pads, replicas), [r.shape[0] for r in rows])
    return from_shaped(rows, replicas)


def select(value: Any, index: int) -> Any:
    """Replica ``index``'s view of a structure holding distributed values."""
    return jax.tree.map(
        lambda x: x.values[index] if is_distributed(x) else x, value, is_leaf=is_distributed
    )


def regroup(outs: Sequence[Any], what: str, make_leaf: Callable[[list], Any]) -> Any:
    """Per-replica results of one structure as one structure of distributed leaves.

    ``make_leaf`` turns the list of one leaf's per-replica values into a value.

    Raises:
        ValueError: when the replicas' structures differ.
    """
    flat = [jax.tree.flatten(o) for o in outs]
    treedef: Any = flat[0][1]
    for i, (_, t) in enumerate(flat):
        if t != treedef:
            raise ValueError(
                f"{what} must return the same structure for every replica; replica 0 "
                f"returned {treedef} and replica {i} returned {t}."
            )
    leaves = [make_leaf([f[0][k] for f in flat]) for k in range(treedef.num_leaves)]
    return jax.tree.unflatten(treedef, leaves)


@dataclasses.dataclass(frozen=True)
class ValueContext:
    """What a ``value_fn`` of `experimental_distribute_values_from_function` sees.

    >>> import jaxdist as jd
    >>> c = jd.experimental.ValueContext(replica_id_in_sync_group=2, num_replicas_in_sync=4)
    >>> (c.replica_id_in_sync_group, c.num_replicas_in_sync)
    (2, 4)
    """

    replica_id_in_sync_group: int = 0
    num_replicas_in_sync: int = 1
