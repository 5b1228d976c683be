"""``keras.layers.BatchNormalization(synchronized=True)`` on the JAX backend, TF's way.

Keras' JAX backend refuses ``synchronized=True`` (the constructor raises, and
``ops.moments(..., synchronized=True)`` raises ``NotImplementedError``): without
``tf.distribute`` there is no replica context to reduce over. Inside a jaxdist
replica there is, so this module gives the layer TF's synchronized moments
(``keras/src/backend/tensorflow/nn.py``, ``_compute_moments_sync``): the replicas'
sums, sums of squares and counts are all-reduced with SUM, ``mean = sum / count``
and ``variance = max(E[x^2] - mean^2, 0)``, so every replica normalizes with the
global batch's statistics. Outside a replica (the default replica context, one
replica) that is the plain batch's statistics, as in TF.

Private Keras API (pinned with the rest, see `jaxdist._keras.distribution`): the backend
function ``keras.src.backend.nn.moments`` is replaced by `moments`, and the
``BatchNormalization`` constructor's backend check is skipped for ``synchronized``.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import keras

from jaxdist._base.reduce_op import ReduceOp
from jaxdist._strategy.default import get_replica_context
from jaxdist._strategy.nn import div_no_nan

_ORIGINAL: dict[str, Any] = {}


def install() -> None:
    """Makes ``synchronized=True`` work (once; idempotent)."""
    if _ORIGINAL:
        return
    backend_nn = keras.src.backend.nn
    _ORIGINAL["moments"] = backend_nn.moments
    _ORIGINAL["init"] = init = keras.layers.BatchNormalization.__init__
    backend_nn.moments = moments

    def __init__(self: Any, *args: Any, synchronized: bool = False, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.synchronized = bool(synchronized)

    __init__.__doc__ = init.__doc__
    keras.layers.BatchNormalization.__init__ = __init__


def moments(x: Any, axes: Any, keepdims: bool = False, synchronized: bool = False) -> tuple:
    """Keras' ``moments``; ``synchronized=True`` reduces over the replicas (TF's rule).

    >>> import jax.numpy as jnp, jaxdist as jd
    >>> install()
    >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    >>> x = s.experimental_distribute_values_from_function(
    ...     lambda ctx: jnp.array([[1.0], [3.0]]) + 4.0 * ctx.replica_id_in_sync_group)
    >>> out = s.run(lambda x: moments(x, axes=[0], synchronized=True), args=(x,))
    >>> [float(m[0]) for m in s.experimental_local_results(out[0])]   # mean of 1, 3, 5, 7
    [4.0, 4.0]
    >>> [float(m[0]) for m in s.experimental_local_results(out[1])]   # their variance
    [5.0, 5.0]
    """
    ctx = get_replica_context()
    if not synchronized or ctx is None:  # TF: no replica context (cross-replica) -> local
        return _ORIGINAL["moments"](x, axes, keepdims)
    dtype = x.dtype
    x = x.astype(jnp.float32) if dtype in (jnp.float16, jnp.bfloat16) else x
    local = (
        jnp.sum(x, axes, keepdims=True),
        jnp.sum(jnp.square(x), axes, keepdims=True),
        jnp.sum(jnp.ones_like(x), axes, keepdims=True),
    )
    total, squares, count = ctx.all_reduce(ReduceOp.SUM, local)
    mean = div_no_nan(total, count)  # no rows anywhere: 0 (an empty replica adds 0 to each sum)
    variance = jnp.maximum(div_no_nan(squares, count) - jnp.square(mean), 0.0)
    if not keepdims:
        mean, variance = jnp.squeeze(mean, axes), jnp.squeeze(variance, axes)
    return mean.astype(dtype), variance.astype(dtype)
