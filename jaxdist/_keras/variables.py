"""Keras variables in a replica step: the optimizer sums the gradients over the replicas first,
and an assignment keeps no layout constraint of the scope's mesh.

TF's Keras optimizer, called in a replica context (``optimizer.apply_gradients(...)`` inside the
function given to ``strategy.run``, as TF's custom-training tutorial does), all-reduces the
gradients (SUM) before it updates its variables, so that every replica applies the global
batch's gradient (each replica's loss being scaled by the global batch size:
``compute_average_loss``). Keras 3's own ``apply`` does not know replicas; this module wraps
``keras.optimizers.Optimizer.apply`` (which ``apply_gradients`` calls) once, when jaxdist's Keras
integration loads: inside a jaxdist replica step of several replicas, the gradients given to
``apply`` are summed over the replicas first; anywhere else it is Keras' own. The variables it
then assigns (the model's weights, its own slots and iteration count) are the same on every
replica, and are written back as one value each (`jaxdist._state.replica`).

Inside a replica step, a Keras variable's assignment (``variable.assign``, which an optimizer
and a metric make) would constrain the new value to the variable's layout on the scope's mesh
(``jax.lax.with_sharding_constraint``, Keras' ``distribute_tensor``), which JAX refuses inside
the replicas' map (an Auto mesh in a Manual one); there the value is the replica's own, and
jaxdist places what the step assigned after the call. So ``distribute_tensor`` leaves a traced
value as it is inside a jaxdist replica step, and does what Keras does anywhere else.

``stateless_apply`` (Keras' JAX-style API, which jaxdist's own ``fit`` steps and the custom-loop
recipe use after their own all-reduce) is not changed: it runs ``apply`` inside a stateless scope,
which this wrapper leaves alone. Private Keras API used: ``keras.src.backend.common.
stateless_scope.in_stateless_scope`` and ``keras.src.backend.jax.distribution_lib.
distribute_tensor`` (covered by tests/keras_wing/test_replica_state_keras.py).
"""

from __future__ import annotations

from typing import Any

import jax
import keras
from keras.src.backend.common.stateless_scope import in_stateless_scope
from keras.src.backend.jax import distribution_lib

from jaxdist._base import context as _context
from jaxdist._strategy.default import get_replica_context

_PATCHED: dict[str, Any] = {}


def install() -> None:
    """Wraps ``keras.optimizers.Optimizer.apply`` once (see the module docstring)."""
    if _PATCHED:
        return
    _PATCHED["apply"] = original = keras.optimizers.Optimizer.apply

    def apply(self: Any, grads: Any, trainable_variables: Any = None) -> Any:
        if not self.built and (_in_replica_step() or _context.in_function()):
            _build_outside_trace(self, trainable_variables)
        return original(self, summed(grads), trainable_variables)

    apply.__doc__ = original.__doc__
    keras.optimizers.Optimizer.apply = apply  # type: ignore[method-assign]
    _PATCHED["distribute_tensor"] = layout = distribution_lib.distribute_tensor

    def distribute_tensor(tensor: Any, layout_: Any) -> Any:
        if _in_replica_step() and isinstance(tensor, jax.core.Tracer):
            return tensor
        return layout(tensor, layout_)

    distribution_lib.distribute_tensor = distribute_tensor


def _build_outside_trace(optimizer: Any, trainable_variables: Any) -> None:
    """Builds ``optimizer`` on its first ``apply`` inside a traced step where that adds no
    variable (SGD without momentum); raises where it would (Adam's slots: values created while
    the step is traced, which no later call could read), naming the fix. TF's ``tf.function``
    fails there too on 2+ replicas."""
    if trainable_variables is None:
        return
    variables = list(trainable_variables)
    before = len(optimizer._variables)
    optimizer.build(variables)
    if len(optimizer._variables) == before:
        return
    del optimizer._variables[before:]
    optimizer.built = False
    name = type(optimizer).__name__
    raise RuntimeError(
        f"The Keras optimizer {name} was built by its first apply_gradients inside a traced "
        "step (strategy.run or a jd.function): the slot variables it creates there are values "
        "of the trace, which no later call can read. Build it in the strategy's scope first: "
        "optimizer.build(model.trainable_variables) after creating the model (TF's tf.function "
        "fails there too, on 2 or more replicas)."
    )


def _in_replica_step() -> bool:
    return _context.current().mode is _context.Mode.REPLICA


def summed(grads: Any) -> Any:
    """``grads`` summed over the replicas inside a replica step of several replicas (TF's
    optimizer in a replica context); as they are anywhere else.

    >>> summed([1.0, None])  # outside a replica step
    [1.0, None]
    """
    if not _in_replica_step() or in_stateless_scope():
        return grads
    ctx = get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync == 1:
        return grads
    grads = list(grads)
    present = [i for i, g in enumerate(grads) if g is not None]
    for i, g in zip(present, ctx.all_reduce("SUM", [grads[i] for i in present])):
        grads[i] = g
    return grads
