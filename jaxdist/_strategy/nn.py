"""TF's distribution-aware loss helpers: `tf.nn.compute_average_loss` and its companion.

Both read the context as TF's do: inside ``strategy.run`` (eager or in `jax.jit`,
even batch or partial) the replica context gives ``num_replicas_in_sync``; with no
strategy it is 1; in cross-replica context they raise TF's `RuntimeError`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdist._base.layout import is_tracer
from jaxdist._base.validate import is_int
from jaxdist._strategy.default import get_replica_context, has_strategy, in_cross_replica_context


def _numeric(value: Any, name: str) -> jax.Array:
    """``value`` as an array of numbers; `TypeError` naming ``name`` otherwise."""
    try:
        array = value if isinstance(value, jax.Array) else jnp.asarray(value)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} must be an array of numbers; got {type(value).__name__}.") from e
    if not jnp.issubdtype(array.dtype, jnp.number):
        raise TypeError(f"{name} must be an array of numbers; got dtype {array.dtype}.")
    return array


def _float_dtype(dtype: Any) -> Any:
    """TF's result dtype: a float input keeps its dtype; integers give the default float."""
    return dtype if jnp.issubdtype(dtype, jnp.inexact) else jax.dtypes.canonicalize_dtype(float)


def _num_replicas(caller: str) -> int:
    """``num_replicas_in_sync`` of the replica context (1 with no strategy), as TF reads it."""
    if has_strategy() and in_cross_replica_context():
        raise RuntimeError(
            f"You are calling `{caller}` in cross replica context, "
            "while it was expected to be called in replica context."
        )
    ctx = get_replica_context()
    return 1 if ctx is None else ctx.num_replicas_in_sync


def _check_global_batch_size(gbs: Any) -> None:
    """TF's checks: an integer scalar (`TypeError`, `ValueError`), non-negative when concrete."""
    dtype = getattr(gbs, "dtype", None)
    if not is_int(gbs) and (dtype is None or not jnp.issubdtype(dtype, jnp.integer)):
        kind = f"dtype {dtype}" if dtype is not None else f"{type(gbs).__name__} {gbs!r}"
        raise TypeError(f"global_batch_size must be an integer; got {kind}.")
    if np.ndim(gbs) != 0:
        raise ValueError(f"global_batch_size must be a scalar; got shape {np.shape(gbs)}.")
    if not is_tracer(gbs) and int(gbs) < 0:
        raise ValueError(f"global_batch_size must be non-negative; got {int(gbs)}.")


def _weights(loss: jax.Array, sample_weight: Any) -> jax.Array:
    """``sample_weight`` squeezed or expanded by one trailing axis to meet ``loss``, as TF does."""
    w = _numeric(sample_weight, "sample_weight")
    if w.ndim and w.ndim == loss.ndim + 1 and w.shape[-1] == 1:
        w = w[..., 0]
    elif w.ndim and w.ndim == loss.ndim - 1:
        w = w[..., None]
    pairs = zip(loss.shape[::-1], w.shape[::-1])
    if w.ndim > loss.ndim or any(a != b and 1 not in (a, b) for a, b in pairs):
        raise ValueError(
            f"sample_weight must broadcast against per_example_loss of shape {loss.shape} "
            f"(a scalar, or one weight per example); got shape {np.shape(sample_weight)}."
        )
    return w


def compute_average_loss(
    per_example_loss: Any, sample_weight: Any = None, global_batch_size: Any = None
) -> jax.Array:
    """Sums the (weighted) per-example losses and divides by the global batch size.

    Call it in each replica: the replicas' sum is the mean over the global batch.
    ``global_batch_size`` defaults to ``per_example_loss.shape[0] * num_replicas_in_sync``;
    zero (or an empty loss) gives 0. Losses of rank >= 2 are summed over all elements.

    >>> import jax.numpy as jnp, jaxdist as jd
    >>> float(jd.nn.compute_average_loss(jnp.array([1.0, 2.0, 3.0, 4.0])))
    2.5
    >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    >>> out = s.run(lambda: jd.nn.compute_average_loss(jnp.array([1.0, 2.0, 3.0, 4.0])))
    >>> [float(x) for x in s.experimental_local_results(out)]
    [1.25, 1.25]

    Args:
        per_example_loss: the losses, of rank >= 1 (axis 0: the examples).
        sample_weight: a scalar, or weights that broadcast against the losses (TF's
            rule: shape ``(B,)`` weights the rows of a rank-2 loss; ``(B, 1)`` a rank-1 one).
        global_batch_size: an integer (Python, NumPy or JAX); None for the default.

    Returns:
        A scalar of the loss's dtype; integer losses give the default float dtype
        (float32, or float64 with ``jax_enable_x64``: TF gives float64).

    Raises:
        ValueError: a rank-0 loss; weights that do not fit; a negative
            ``global_batch_size`` (checked only when concrete, not a tracer).
        TypeError: a non-integer ``global_batch_size``; non-numeric inputs.
        RuntimeError: in cross-replica context with ``global_batch_size`` None.
    """
    loss = _numeric(per_example_loss, "per_example_loss")
    if loss.ndim == 0:
        raise ValueError(
            "Invalid value passed for `per_example_loss`. Expected a tensor with at least "
            f"rank 1. Received per_example_loss={loss} with rank 0"
        )
    if global_batch_size is not None:
        _check_global_batch_size(global_batch_size)
    w = None if sample_weight is None else _weights(loss, sample_weight)
    if global_batch_size is None:
        shape = loss.shape if w is None else np.broadcast_shapes(loss.shape, w.shape)
        global_batch_size = shape[0] * _num_replicas("compute_average_loss")
    if w is not None:  # TF multiplies in float32 (float64 here stays float64), then casts back
        compute = jnp.promote_types(loss.dtype, jnp.float32)
        loss = (loss.astype(compute) * w.astype(compute)).astype(loss.dtype)
    dtype = _float_dtype(loss.dtype)
    total = jnp.sum(loss.astype(dtype))
    return div_no_nan(total, jnp.asarray(global_batch_size, dtype))


def div_no_nan(total: Any, count: Any) -> jax.Array:
    """TF's ``tf.math.divide_no_nan``: ``total / count``, and 0 where ``count`` is 0.

    jaxdist's one rule for a replica with no rows (the empty replicas of a partial
    batch, ``tf.distribute``'s split): a mean over its rows is 0, so it adds nothing to
    the replicas' sum, and the divisor is made safe so that its gradient is 0, not NaN.
    `compute_average_loss`, Keras' per-replica loss (`jaxdist._keras.steps`) and the
    synchronized batch-norm moments (`jaxdist._keras.syncbn`) divide through it.

    >>> import jax, jax.numpy as jnp
    >>> float(div_no_nan(jnp.sum(jnp.zeros((0,))), 0))
    0.0
    >>> float(div_no_nan(6.0, 4))
    1.5
    >>> float(jax.grad(lambda t: div_no_nan(t, 0.0))(1.0))
    0.0
    """
    total = jnp.asarray(total)
    zero = jnp.asarray(count) == 0
    safe = jnp.where(zero, jnp.ones_like(count), count)
    return jnp.where(zero, jnp.zeros_like(total), total / safe)


def scale_regularization_loss(regularization_loss: Any) -> jax.Array:
    """The sum of ``regularization_loss`` divided by ``num_replicas_in_sync``.

    Call it in each replica, so that the replicas' sum counts the loss once.

    >>> import jax.numpy as jnp, jaxdist as jd
    >>> float(jd.nn.scale_regularization_loss(jnp.array([1.0, 2.0])))
    3.0
    >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    >>> out = s.run(lambda: jd.nn.scale_regularization_loss(2.0))
    >>> [float(x) for x in s.experimental_local_results(out)]
    [1.0, 1.0]

    Args:
        regularization_loss: a scalar, an array or a list of same-shaped arrays.

    Returns:
        A scalar of the loss's dtype (integers: the default float dtype; TF: float64).

    Raises:
        RuntimeError: in cross-replica context (in ``strategy.scope()``, outside ``run``).
        TypeError: a non-numeric ``regularization_loss``.
    """
    loss = _numeric(regularization_loss, "regularization_loss")
    n = _num_replicas("scale_regularization_loss")
    return jnp.sum(loss.astype(_float_dtype(loss.dtype))) / n
