"""One replica's Keras step under a strategy, with TF's rules for combining replicas
(see `jaxdist._keras.steps` for the program around it): the loss scaled by
``1 / num_replicas_in_sync``, one SUM all-reduce of gradients, metric updates and
aggregated non-trainable variables (`Layout.combine`), an empty replica contributing
nothing (`is_empty`, `replica_loss`, `kept_where_undefined`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import jax
import jax.numpy as jnp
import keras
import numpy as np

from jaxdist._base.reduce_op import ReduceOp
from jaxdist._keras.tfloss import tf_meaning
from jaxdist._state.aggregation import host_read
from jaxdist._strategy.nn import div_no_nan


def train_replica(
    model: Any, ctx: Any, layout: Layout, state: Any, data: tuple, tf_loss: bool = False
) -> tuple:
    """One replica's Keras train step: TF's loss scaling, one all-reduce, the update.

    ``tf_loss`` (a model that overrides ``compute_loss``): the loss is what the model computes
    with TF's meaning of Keras' losses in a replica (`jaxdist._keras.tfloss`: a Keras loss
    scaled by ``1 / replicas``, a mean written by hand not), and the loss tracker records it
    multiplied by the replicas, as TF's trainer does."""
    tv, ntv, ov, mv = state
    x, y, sw = data
    n = ctx.num_replicas_in_sync

    def loss_fn(tv: Any) -> tuple:
        loss, (unscaled, *aux) = model.compute_loss_and_updates(
            tv, ntv, mv, x, y, sw, training=True, optimizer_variables=ov
        )
        loss, unscaled = replica_loss(loss), replica_loss(unscaled)
        if tf_loss:  # Keras' losses scaled in it, its tracked loss unscaled (`tfloss`)
            return loss, (unscaled, *aux)
        return loss / n, (unscaled, *aux)  # TF: each replica's loss scaled by 1 / replicas

    with _meaning(ctx, x, tf_loss):
        (_, (unscaled, y_pred, new_ntv, new_mv)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            tv
        )
    # Private Keras API: the metric update of Keras' own JAX train_step.
    _, new_mv = model._update_metrics_variables(new_mv, unscaled, x, y, y_pred, sw)
    if is_empty(x):  # it still ran Keras' step: a synchronized layer's collectives need it
        grads, new_mv = jax.tree.map(jnp.zeros_like, grads), mv
        new_ntv = kept_where_undefined(ntv, new_ntv)
    grads, new_mv, new_ntv = layout.combine(ctx, mv, new_mv, new_ntv, grads)
    tv, ov = model.optimizer.stateless_apply(ov, grads, tv)
    logs = metrics_result(model, new_mv)
    state = (tv, new_ntv, ov, new_mv)
    return logs, state, layout.own_copies(state)


def test_replica(
    model: Any, ctx: Any, layout: Layout, state: Any, data: tuple, tf_loss: bool = False
) -> tuple:
    """One replica's Keras test step: metric updates summed over the replicas."""
    tv, ntv, mv = state
    x, y, sw = data
    with _meaning(ctx, x, tf_loss):
        _, (unscaled, y_pred, new_ntv, new_mv) = model.compute_loss_and_updates(
            tv, ntv, mv, x, y, sw, training=False
        )
    unscaled = replica_loss(unscaled)
    # Private Keras API: the metric update of Keras' own JAX test_step.
    _, new_mv = model._update_metrics_variables(new_mv, unscaled, x, y, y_pred, sw)
    if is_empty(x):
        new_mv, new_ntv = mv, kept_where_undefined(ntv, new_ntv)
    _, new_mv, new_ntv = layout.combine(ctx, mv, new_mv, new_ntv, None)
    state = (tv, new_ntv, new_mv)
    return metrics_result(model, new_mv), state, layout.own_copies(state)


def _meaning(ctx: Any, x: Any, tf_loss: bool) -> contextlib.AbstractContextManager:
    return tf_meaning(ctx, is_empty(x)) if tf_loss else contextlib.nullcontext()


def is_empty(x: Any) -> bool:
    """Whether this replica has no rows (static: each replica's shape is traced).

    An empty replica (``tf.distribute`` splits a partial batch into ``ceil(b / R)`` rows
    per replica, the last ones possibly 0) contributes nothing: its loss is 0
    (`replica_loss`), its gradient is 0 and its metric updates are none. Keras' own step
    still runs on it with 0 rows, as every replica must join a synchronized layer's
    all-reduce, and its non-trainable variables take what that step computed (a
    synchronized batch norm's global statistics, a seed's advance, as in TF) except
    where it divided 0 by 0 (`kept_where_undefined`): so it never turns into NaN.

    >>> import numpy as np
    >>> is_empty(np.zeros((0, 3))), is_empty((np.zeros((2, 3)),))
    (True, False)
    """
    leaves = jax.tree.leaves(x)
    return bool(leaves) and int(np.shape(leaves[0])[0]) == 0


def kept_where_undefined(old: Any, new: Any) -> Any:
    """An empty replica's non-trainable variables: ``new`` where finite, else ``old``.

    A per-replica batch norm on no rows takes the moments of nothing (0 / 0): TF's moving
    statistics of that replica turn NaN, and later every prediction it makes; here they
    stay as they were. Values its step computed from other replicas (synchronized
    moments) or without rows (a seed's advance) are kept.

    >>> import jax.numpy as jnp
    >>> [float(v) for v in kept_where_undefined([jnp.array(1.0)], [jnp.array(jnp.nan)])]
    [1.0]
    """

    def keep(o: Any, n: Any) -> Any:
        if not jnp.issubdtype(jnp.result_type(n), jnp.inexact):
            return n
        return jnp.where(jnp.isfinite(n), n, o)

    return jax.tree.map(keep, old, new)


def replica_loss(loss: Any) -> Any:
    """A replica's Keras loss as a scalar: 0 for a replica with no rows (`div_no_nan`).

    Keras' loss reduction returns a loss of static shape ``(0,)`` unreduced (TF's traces
    see ``(None,)`` and reduce it with ``divide_no_nan`` to 0): reduced here by the same
    rule, the empty replica adds 0 to the loss, its gradient and the loss tracker (which
    it updates with weight 0, its row count), as in TF.

    >>> import jax.numpy as jnp
    >>> float(replica_loss(jnp.zeros((0,)))), float(replica_loss(jnp.float32(0.5)))
    (0.0, 0.5)
    """
    if jnp.ndim(loss) == 0:
        return loss
    return div_no_nan(jnp.sum(loss), jnp.size(loss))


def metrics_result(model: Any, metrics_variables: Any) -> dict:
    """Keras' logs (``model.get_metrics_result()``) for the given metric state."""
    mapping = list(zip(model.metrics_variables, metrics_variables))
    with keras.StatelessScope(state_mapping=mapping):
        return model.get_metrics_result()


def restore_variables(model: Any, state: Any) -> None:
    """Keras' variables given ``state``'s values. Keras' JAX trainer empties them while it
    trains and fills them at the end of an epoch: a step that raised (a clear error while
    tracing) would leave the model without weights. Nothing is done where the state's arrays
    were given to a program that ran (donated)."""
    leaves = jax.tree.leaves(state)
    if any(isinstance(x, jax.Array) and x.is_deleted() for x in leaves):
        return
    groups = [model.trainable_variables, model.non_trainable_variables]
    if len(state) == 4 and model.optimizer is not None:
        groups.append(model.optimizer.variables)
    if len(state) >= 3:
        groups.append(model.metrics_variables)
    for variables, values in zip(groups, state):
        for v, x in zip(variables, values):
            v.assign(x)


class Layout:
    """Which variables are kept per replica (`slots`), and which non-trainable ones are
    all-reduced (``mean``, ``sum``) or replica 0's.

    A slot is ``(part, index)`` in Keras' state: the non-trainable variables of aggregation
    ``"none"`` (``own``: TF's mirrored variables each replica updates on its own device; the
    Keras variable holds replica 0's copy) and, for a model's own ``train_step``/``test_step``
    (``metrics``), every metric variable (TF's sync-on-read metric variables: each replica
    accumulates its own, a read outside the replicas combines them by their aggregation).
    """

    def __init__(self, model: Any, strategy: Any, metrics: int | None = None) -> None:
        aggregation = [v.aggregation for v in model.non_trainable_variables]
        self.own = tuple(i for i, a in enumerate(aggregation) if a == "none")
        self.mean = tuple(i for i, a in enumerate(aggregation) if a == "mean")
        self.sum = tuple(i for i, a in enumerate(aggregation) if a == "sum")
        self.sharding = variable_sharding(strategy)
        self.slots = tuple((1, i) for i in self.own)
        self.keys = tuple(("ntv", i) for i in self.own)  # the same in train and test functions
        self.reads = ("none",) * len(self.own)  # (how each is read: `host_read`)
        if metrics is not None:  # the part of Keras' state that holds the metric variables
            mv = model.metrics_variables
            self.slots += tuple((metrics, j) for j in range(len(mv)))
            self.keys += tuple(("metric", j) for j in range(len(mv)))
            self.reads += tuple(str(v.aggregation) for v in mv)

    def with_copies(self, state: Any, copies: tuple, ctx: Any) -> Any:
        """The replica's state: its own copies of the per-replica variables."""
        if not self.slots:
            return state
        rid = ctx.replica_id_in_sync_group
        state = [list(part) for part in state]
        for (p, i), c in zip(self.slots, copies):
            state[p][i] = jax.lax.dynamic_index_in_dim(c, rid, keepdims=False)
        return tuple(state)

    def own_copies(self, state: Any) -> tuple:
        """This replica's values of the slots (``state``: Keras' state after its step)."""
        return tuple(state[p][i][None] for p, i in self.slots)

    def primary(self, k: int, copies: Any) -> Any:
        """Slot ``k``'s value as Keras reads it outside the replicas, from every copy (TF's
        rule, `host_read`: replica 0's for aggregation ``"none"``, TF's primary)."""
        return host_read(copies, self.reads[k])

    def spread(self, k: int, value: Any, n: int) -> Any:
        """Every replica's copy of slot ``k`` from a value Keras holds (set from outside: a
        metric reset): a sum's value on replica 0 and zeros elsewhere, else the value."""
        if self.reads[k] == "sum":
            zeros = jnp.zeros((n - 1, *jnp.shape(value)), jnp.result_type(value))
            return jnp.concatenate([jnp.asarray(value)[None], zeros])
        return jnp.broadcast_to(value, (n, *jnp.shape(value)))

    def combine(self, ctx: Any, old_mv: Any, new_mv: Any, ntv: Any, grads: Any) -> tuple:
        """One SUM all-reduce: gradients, metric updates, mean/sum-aggregated variables
        (one replica: the values as they are, Keras' own, with no round trip through
        deltas that would round them differently)."""
        if ctx.num_replicas_in_sync == 1:
            return grads, new_mv, ntv
        deltas = [new - old for new, old in zip(new_mv, old_mv)]
        agg = [ntv[i] for i in self.mean + self.sum]
        grads, deltas, agg = ctx.all_reduce(ReduceOp.SUM, (grads, deltas, agg))
        new_mv = [old + d for old, d in zip(old_mv, deltas)]
        ntv = list(ntv)
        n = ctx.num_replicas_in_sync
        for k, i in enumerate(self.mean + self.sum):
            ntv[i] = agg[k] / n if k < len(self.mean) else agg[k]
        return grads, new_mv, ntv

    def place(self, state: Any) -> Any:
        """Keras' state as mirrored arrays (replicated on the replica devices)."""
        return jax.tree.map(lambda v: jax.lax.with_sharding_constraint(v, self.sharding), state)


def variable_sharding(strategy: Any) -> jax.sharding.Sharding:
    """Where a variable of ``strategy`` lives: replicated on every replica device."""
    devices = list(strategy.extended.replicas.devices)
    mesh = jax.sharding.Mesh(np.array(devices), ("batch",))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
