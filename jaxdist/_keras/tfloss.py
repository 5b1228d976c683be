"""What Keras' TF backend does differently inside a replica of ``tf.distribute``, for code
jaxdist runs as the user wrote it (a model's own ``train_step``, ``test_step``, ``compute_loss``).

On the TF backend, Keras knows the replicas: every Keras loss reduced over the batch is scaled by
``1 / num_replicas_in_sync`` (``keras.src.losses.loss.scale_loss_for_distribution``, also applied
to the model's added losses by the TF trainer's ``_aggregate_additional_loss``), a loss recorded
"unscaled" is multiplied back (``unscale_loss_for_distribution``), and the optimizer, applied in
a replica, sums the replicas' gradients (an all-reduce in ``_backend_update_step``, after each
replica clipped its own). A replica with no rows reduces its losses to 0 (TF's shapes are dynamic:
``divide_no_nan`` of 0 by 0), where Keras on JAX sees the static shape ``(0,)`` and leaves it
unreduced; the TF trainer's loss tracker records the loss unscaled again. On the JAX backend
all of these are no-ops; `tf_meaning` gives them TF's meaning for the length of one replica's
trace (`ReplicaTrace`, a context variable that the wrappers consult: outside it they are Keras'
own functions).

The optimizer's ``stateless_apply`` inside it records the arrays it returns (`ReplicaTrace.made`),
so that a step's caller can tell the weights the optimizer updated (the same on every replica:
its gradients were summed) from ones the step changed by itself, and each optimizer's new
variables (`ReplicaTrace.applied`), which the caller keeps for an optimizer whose variables are
not in Keras' state (a GAN's second optimizer: TF keeps its moments from step to step).

Private Keras API wrapped (once, by `install`): ``keras.src.losses.loss`` (``reduce_values``,
``scale_loss_for_distribution``, ``unscale_loss_for_distribution``), ``Trainer.
_aggregate_additional_loss``, ``JAXTrainer.compute_loss_and_updates``, ``BaseOptimizer.
stateless_apply`` and ``_backend_update_step``.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from keras.src.backend.jax.trainer import JAXTrainer
from keras.src.losses import loss as loss_module
from keras.src.optimizers import base_optimizer
from keras.src.trainers import trainer as trainer_module

from jaxdist._base.reduce_op import ReduceOp

_PATCHED: dict[str, Any] = {}
_TRACE: contextvars.ContextVar[ReplicaTrace | None] = contextvars.ContextVar(
    "keras_tf_meaning", default=None
)


class ReplicaTrace:
    """One replica's step being traced with TF's meaning: its replica context, whether it has
    rows, and what its optimizers returned."""

    def __init__(self, ctx: Any, empty: bool, carried: Sequence[Any] | None = None) -> None:
        self.ctx = ctx
        self.n = ctx.num_replicas_in_sync
        self.empty = empty
        self.made: dict[int, Any] = {}
        self.applying = 0
        self.summed = 0
        # the optimizers whose state the step's caller carries (None: not checked), and the
        # optimizer variables each one's last ``stateless_apply`` returned, by ``id``
        self.carried = None if carried is None else {id(o) for o in carried}
        self.applied: dict[int, list] = {}

    def check_carried(self, optimizer: Any) -> None:
        """Raises unless the step's caller keeps ``optimizer``'s state from step to step."""
        if self.carried is None or id(optimizer) in self.carried:
            return
        raise ValueError(
            f"A model's own train_step applied a {type(optimizer).__name__} "
            f"({getattr(optimizer, 'name', '?')!r}) whose state fit does not keep: it is "
            "neither model.optimizer nor a built optimizer the model holds. Under a jaxdist "
            "strategy fit keeps the state (iterations, moments) of those, as TF keeps every "
            "optimizer's. Assign it to the model (self.g_optimizer = ...) and build it in the "
            "strategy's scope (optimizer.build(<the variables it updates>)) before fit."
        )

    def made_here(self, value: Any) -> bool:
        """Whether ``value`` is an array an optimizer's ``stateless_apply`` returned."""
        return self.made.get(id(value)) is value

    def sum_grads(self, grads: Any) -> list:
        """The gradients summed over the replicas (TF's optimizer in a replica); an empty
        replica's count as zeros (it has no rows: a mean over none would be NaN)."""
        self.summed += 1
        grads = list(grads)
        if self.empty:
            grads = [jnp.zeros_like(g) for g in grads]
        if self.n == 1:
            return grads
        return list(self.ctx.all_reduce(ReduceOp.SUM, grads))


@contextlib.contextmanager
def tf_meaning(
    ctx: Any, empty: bool, carried: Sequence[Any] | None = None
) -> Iterator[ReplicaTrace]:
    """Keras' losses and optimizers with TF's replica meaning while the block traces
    (``carried``: the optimizers a model's own step may apply, `ReplicaTrace.check_carried`)."""
    trace = ReplicaTrace(ctx, empty, carried)
    token = _TRACE.set(trace)
    try:
        yield trace
    finally:
        _TRACE.reset(token)


def install() -> None:
    """Wraps the Keras functions named in the module docstring, once."""
    if _PATCHED:
        return
    _PATCHED["scale"] = loss_module.scale_loss_for_distribution
    _PATCHED["unscale"] = loss_module.unscale_loss_for_distribution
    _PATCHED["reduce"] = loss_module.reduce_values
    _PATCHED["aggregate"] = trainer_module.Trainer._aggregate_additional_loss
    _PATCHED["apply"] = base_optimizer.BaseOptimizer.stateless_apply
    _PATCHED["update"] = base_optimizer.BaseOptimizer._backend_update_step
    _PATCHED["losses"] = JAXTrainer.compute_loss_and_updates
    loss_module.scale_loss_for_distribution = scaled
    loss_module.unscale_loss_for_distribution = unscaled
    loss_module.reduce_values = _reduce_values
    trainer_module.Trainer._aggregate_additional_loss = _aggregate_additional_loss
    base_optimizer.BaseOptimizer.stateless_apply = _stateless_apply
    base_optimizer.BaseOptimizer._backend_update_step = _backend_update_step
    JAXTrainer.compute_loss_and_updates = _compute_loss_and_updates


def scaled(value: Any) -> Any:
    """A loss scaled by ``1 / num_replicas_in_sync`` in a replica traced with TF's meaning."""
    trace = _TRACE.get()
    if trace is None or trace.n == 1:
        return _PATCHED["scale"](value)
    return value * jnp.asarray(1.0 / trace.n, jnp.result_type(value))


def unscaled(value: Any) -> Any:
    """A scaled loss multiplied back by ``num_replicas_in_sync`` (TF's loss trackers)."""
    trace = _TRACE.get()
    if trace is None or trace.n == 1:
        return _PATCHED["unscale"](value)
    return value * jnp.asarray(trace.n, jnp.result_type(value))


def _reduce_values(values: Any, sample_weight: Any = None, reduction: Any = "sum_over_batch_size"):
    if _TRACE.get() is not None and reduction not in (None, "none") and values.shape == (0,):
        return jnp.sum(values)  # TF: the sum of no rows, divided by no rows without NaN
    return _PATCHED["reduce"](values, sample_weight, reduction)


def _compute_loss_and_updates(self: Any, *args: Any, **kwargs: Any) -> tuple:
    """Keras' JAX step's loss and the one it tracks: unscaled as TF's trainer tracks it (so
    that Keras' own ``train_step``, called by an override, records the replicas' loss)."""
    loss, (unscaled_loss, *rest) = _PATCHED["losses"](self, *args, **kwargs)
    if _TRACE.get() is not None:
        unscaled_loss = unscaled(unscaled_loss)
    return loss, (unscaled_loss, *rest)


def _aggregate_additional_loss(self: Any, loss: Any) -> Any:
    return scaled(_PATCHED["aggregate"](self, loss))


def _stateless_apply(self: Any, optimizer_variables: Any, grads: Any, trainable_variables: Any):
    trace = _TRACE.get()
    if trace is None:
        return _PATCHED["apply"](self, optimizer_variables, grads, trainable_variables)
    if self.gradient_accumulation_steps:
        raise NotImplementedError(
            f"{type(self).__name__}(gradient_accumulation_steps="
            f"{self.gradient_accumulation_steps}) in a model's own train_step under a jaxdist "
            "strategy: TF accumulates each replica's gradients on its own, which jaxdist does "
            "not reproduce. Use gradient_accumulation_steps=None, or write the loop yourself."
        )
    trace.check_carried(self)
    trace.applying += 1
    before = trace.summed
    try:
        tv, ov = _PATCHED["apply"](self, optimizer_variables, grads, trainable_variables)
    finally:
        trace.applying -= 1
    if trace.summed == before and jax.tree.leaves(grads):
        raise NotImplementedError(
            f"{type(self).__name__}.stateless_apply did not reach Keras' "
            "_backend_update_step, where jaxdist sums the gradients over the replicas as TF's "
            "optimizer does: an optimizer that overrides it has no meaning under a jaxdist "
            "strategy here. Write the loop yourself (docs/guides/keras.md)."
        )
    trace.made.update((id(v), v) for v in (*tv, *ov))
    trace.applied[id(self)] = list(ov)
    return tv, ov


def _backend_update_step(self: Any, grads: Any, trainable_variables: Any, learning_rate: Any):
    trace = _TRACE.get()
    if trace is not None and trace.applying:
        grads = trace.sum_grads(grads)
    return _PATCHED["update"](self, grads, trainable_variables, learning_rate)
