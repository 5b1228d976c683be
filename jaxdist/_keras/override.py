"""A model's own ``train_step`` / ``test_step`` / ``predict_step`` under a strategy, run on
every replica with TF's meaning (``tf.distribute.MirroredStrategy``'s ``fit`` runs
``strategy.run(train_step)``; see `jaxdist._keras.steps` for the program around it).

* Losses and optimizers inside the step mean what they mean on Keras' TF backend
  (`jaxdist._keras.tfloss`): a Keras loss is scaled by ``1 / num_replicas_in_sync``, and every
  optimizer's ``stateless_apply`` (``self.optimizer``, a GAN's ``d_optimizer`` and
  ``g_optimizer``) applies the gradients summed over the replicas.
* Every optimizer the model holds keeps its state from step to step, as TF's do: one outside
  Keras' state (a GAN's second) is read through a ``keras.StatelessScope`` and its new
  variables, which the step cannot return, are taken from its ``stateless_apply``
  (`other_optimizers`; on Keras' own JAX backend its moments would start again every step).
  An optimizer the model does not hold is an error (jaxdist could not keep its state).
* Trainable and optimizer variables are TF's mirrored variables, which a replica updates through
  its optimizer: each value the step returns for them is the optimizer's output (or the value it
  was given), the same on every replica; any other is an error naming the variable (jaxdist could
  only keep one replica's).
* Metric variables are TF's sync-on-read ones: each replica accumulates its own (kept per replica,
  `jaxdist._keras.replica.Layout`), and Keras reads their sum (``get_metrics_result``: History
  and ``evaluate`` when the step returns ``self.metrics``' names); the logs the step returns are
  the mean over the replicas of each replica's logs (TF's ``reduce_per_replica``, ``"auto"``).
* Non-trainable variables follow their ``aggregation`` as in Keras' own step (per replica,
  all-reduced or replica 0's); a replica with no rows keeps the ones its step left undefined.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import jax
import keras

from jaxdist._base.reduce_op import ReduceOp
from jaxdist._keras.replica import Layout, is_empty, kept_where_undefined
from jaxdist._keras.tfloss import ReplicaTrace, tf_meaning


def overrides(model: Any, kind: str) -> bool:
    """Whether ``model`` overrides Keras' ``<kind>_step``."""
    name = f"{kind}_step"
    return getattr(type(model), name) is not getattr(keras.Model, name)


def own_loss(model: Any) -> bool:
    """Whether ``model`` overrides ``compute_loss`` (Keras' own step then has TF's meaning of
    it: `jaxdist._keras.replica.train_replica` with ``tf_loss``)."""
    return type(model).compute_loss is not keras.Model.compute_loss


def metrics_part(kind: str) -> int | None:
    """Where Keras' state for ``kind`` holds the metric variables (None: it has none)."""
    return {"train": 3, "test": 2}.get(kind)


def other_optimizers(model: Any) -> list:
    """The built optimizers the model holds besides ``model.optimizer`` (a GAN's
    ``g_optimizer``): attributes, or items of a list, tuple or dict attribute, each once."""
    found: dict[int, Any] = {id(model.optimizer): None}
    for value in vars(model).values():
        if isinstance(value, dict):
            items = list(value.values())
        else:
            items = list(value) if isinstance(value, (list, tuple)) else [value]
        for v in items:
            if isinstance(v, keras.optimizers.Optimizer) and id(v) not in found:
                found[id(v)] = v
    return [v for v in found.values() if v is not None and v.built]


def optimizer_variables(optimizers: Sequence) -> list:
    """Their variables, in order."""
    return [v for opt in optimizers for v in opt.variables]


def replica_step(
    model: Any,
    ctx: Any,
    layout: Layout,
    kind: str,
    state: Any,
    data: Any,
    others: Sequence = (),
):
    """One replica's own step: ``(outputs, Keras' state, the per-replica copies)``. With
    ``others`` (`other_optimizers`), ``state`` ends with their variables' values, read by the
    step through a ``keras.StatelessScope`` and returned as their last ``stateless_apply`` (or
    an assignment in the step) left them: TF's optimizers keep their state."""
    empty = is_empty(data)
    extra, state = (list(state[-1]), tuple(state[:-1])) if others else ([], state)
    carried = [model.optimizer, *others] if kind == "train" else None
    mapping = list(zip(optimizer_variables(others), extra))
    # the scope only where there are such optimizers: an empty one would keep (and drop) any
    # other assignment the step makes, where Keras' own JAX step leaves it to fail loudly
    reading = keras.StatelessScope(mapping) if others else contextlib.nullcontext()
    with tf_meaning(ctx, empty, carried) as trace, reading as scope:
        out, new = getattr(model, f"{kind}_step")(state, data)
    if others:
        _refuse_dropped(model, kind, scope, mapping)
        extra = _others_after(others, trace, scope)
    if kind == "predict":
        new = (state[0], _kept(state[1], new, empty))
        return out, new, layout.own_copies(new)
    new = [list(part) for part in new]
    _check_mirrored(model, kind, trace, state[0], new[0], _names(model.trainable_variables))
    if kind == "train":
        names = _names(model.optimizer.variables) if model.optimizer is not None else []
        _check_mirrored(model, kind, trace, state[2], new[2], names)
    new[1] = _aggregated(ctx, layout, _kept(state[1], new[1], empty))
    new_state = (*new, extra) if others else tuple(new)
    return _mean_logs(ctx, out), new_state, layout.own_copies(new_state)


def _refuse_dropped(model: Any, kind: str, scope: Any, mapping: list) -> None:
    """Raises where the step assigned a variable other than a second optimizer's inside the
    scope that reads those (``self.some_variable.assign(...)``): the scope keeps the value,
    and nothing would write it back (TF assigns it; Keras' own JAX step fails on it)."""
    ours = {id(v) for v, _ in mapping}
    others = [k for k in scope.state_mapping if k not in ours]
    if not others:
        return
    known = {id(v): v for v in model.variables}
    names = [_names([known[k]])[0] if k in known else "a variable" for k in others]
    raise ValueError(
        f"The model's own {kind}_step assigned {', '.join(names)} (`.assign`) while a second "
        "optimizer's variables are read for it: the assignment would be dropped. Return the "
        "new value in the step's state (Keras' stateless step), or update it through an "
        "optimizer."
    )


def _others_after(others: Sequence, trace: ReplicaTrace, scope: Any) -> list:
    """Each optimizer's variables after the step: its last ``stateless_apply``'s, else as
    the step assigned them in the scope, else as they were."""
    out = []
    for opt in others:
        applied = trace.applied.get(id(opt))
        if applied is not None:
            out += applied
        else:
            out += [scope.get_current_value(v) for v in opt.variables]
    return out


def _names(variables: Sequence) -> list[str]:
    return [getattr(v, "path", getattr(v, "name", "?")) for v in variables]


def _kept(old: Any, new: Any, empty: bool) -> list:
    return list(kept_where_undefined(list(old), list(new))) if empty else list(new)


def _check_mirrored(
    model: Any, kind: str, trace: ReplicaTrace, old: Any, new: list, names: list[str]
) -> None:
    """Raises unless every value is the one given or an optimizer's output."""
    if len(new) != len(old):
        raise ValueError(
            f"{type(model).__name__}.{kind}_step returned {len(new)} values where Keras' state "
            f"holds {len(old)} ({names[:3]}...)."
        )
    for i, (o, v) in enumerate(zip(old, new)):
        if v is o or (kind == "train" and trace.made_here(v)):
            continue
        name = names[i] if i < len(names) else f"#{i}"
        raise NotImplementedError(
            f"{type(model).__name__}.{kind}_step under a jaxdist strategy returned a new value "
            f"for the variable {name!r} that no optimizer's stateless_apply computed. TF updates "
            "a mirrored variable in a replica only through an optimizer (which sums the "
            "replicas' gradients first); jaxdist cannot tell that this value is the same on "
            "every replica, and will not keep one replica's. Update it with "
            "optimizer.stateless_apply, or write the loop yourself (docs/guides/keras.md)."
        )


def _aggregated(ctx: Any, layout: Layout, ntv: list) -> list:
    """Non-trainable variables of aggregation ``mean``/``sum`` all-reduced (TF's mirrored
    variables assigned in a replica)."""
    agg = layout.mean + layout.sum
    if not agg or ctx.num_replicas_in_sync == 1:
        return ntv
    values = ctx.all_reduce(ReduceOp.SUM, [ntv[i] for i in agg])
    n = ctx.num_replicas_in_sync
    for k, i in enumerate(agg):
        ntv[i] = values[k] / n if k < len(layout.mean) else values[k]
    return ntv


def _mean_logs(ctx: Any, logs: Any) -> Any:
    """The logs' floating-point values averaged over the replicas (TF's ``reduce_per_replica``
    with ``"auto"``: the mean, for a ``MirroredStrategy``); other values replica 0's."""
    if ctx.num_replicas_in_sync == 1:
        return logs
    leaves, treedef = jax.tree.flatten(logs)
    at = [i for i, v in enumerate(leaves) if _is_float(v)]
    if at:
        means = ctx.all_reduce(ReduceOp.MEAN, [leaves[i] for i in at])
        for i, v in zip(at, means):
            leaves[i] = v
    return jax.tree.unflatten(treedef, leaves)


def _is_float(value: Any) -> bool:
    return isinstance(value, jax.Array) and jax.numpy.issubdtype(value.dtype, jax.numpy.inexact)
