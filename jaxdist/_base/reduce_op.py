"""`ReduceOp` and the one home of TF's MEAN rule (`finish`)."""

from __future__ import annotations

import enum
from typing import Any

import jax.numpy as jnp


class ReduceOp(enum.Enum):
    """How values from the replicas are combined, as `tf.distribute.ReduceOp`.

    Strategy and replica-context methods also accept the strings ``"SUM"`` and
    ``"MEAN"`` in any case; the enum constructor itself is exact, as in TF.

    >>> import jaxdist as jd
    >>> jd.ReduceOp("SUM") is jd.ReduceOp.SUM
    True
    >>> [op.value for op in jd.ReduceOp]
    ['SUM', 'MEAN']
    """

    SUM = "SUM"
    MEAN = "MEAN"


def parse_reduce_op(reduce_op: Any, *, allow_strings: bool = True) -> ReduceOp:
    """Returns the `ReduceOp` named by ``reduce_op``, or raises a clear error.

    Args:
        reduce_op: a `ReduceOp`, or (when ``allow_strings``) ``"SUM"``/``"MEAN"``
            in any case.
        allow_strings: whether strings are accepted (TF's `CrossDeviceOps`
            methods take only the enum).

    Raises:
        ValueError: for anything that does not name ``SUM`` or ``MEAN``.
    """
    if isinstance(reduce_op, ReduceOp):
        return reduce_op
    valid = "jaxdist.ReduceOp.SUM or jaxdist.ReduceOp.MEAN"
    if isinstance(reduce_op, str):
        if not allow_strings:
            raise ValueError(
                f"reduce_op must be a jaxdist.ReduceOp here ({valid}); got the "
                f"string {reduce_op!r}. CrossDeviceOps methods take the enum, as in TF."
            )
        try:
            return ReduceOp(reduce_op.upper())
        except ValueError:
            pass
        valid += ' (or the strings "SUM"/"MEAN", any case)'
    raise ValueError(f"reduce_op must be {valid}; got {reduce_op!r}.")


def finish(op: ReduceOp, total: Any, count: Any, elements: bool = False) -> Any:
    """TF's MEAN rule, used by every reduction: ``total / count``; SUM is ``total``.

    ``count`` is the true number of combined elements (replicas, or rows of a
    partial batch); integer totals give a floating-point mean, as in TF. The mean
    over one replica is that replica's value, dtype included (TF: a one-replica
    strategy's MEAN of an int32 is the int32); a mean along an axis (``elements``)
    is always a division, also of one element (TF: a float).

    >>> import jax.numpy as jnp
    >>> float(finish(ReduceOp.MEAN, jnp.int32(7), 2)), int(finish(ReduceOp.SUM, jnp.int32(7), 2))
    (3.5, 7)
    >>> one = jnp.int32(7)
    >>> finish(ReduceOp.MEAN, one, 1).dtype, finish(ReduceOp.MEAN, one, 1, elements=True).dtype
    (dtype('int32'), dtype('float32'))
    """
    if op is not ReduceOp.MEAN or (not elements and isinstance(count, int) and count == 1):
        return total
    return jnp.true_divide(total, count)
