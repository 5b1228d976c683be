"""TF's error classes that distributed iterators raise (`jaxdist.errors`).

Each subclasses the Python exception jaxdist raised before, so code written for
either keeps working: ``except StopIteration`` and ``except OutOfRangeError``
both catch the end of the data.
"""

from __future__ import annotations


class OutOfRangeError(StopIteration):
    """TF's ``tf.errors.OutOfRangeError``: ``iterator.get_next()`` past the end of the data.

    A `StopIteration`, so ``for`` loops and ``next(it, default)`` treat it as the end.

    >>> import numpy as np, jaxdist as jd
    >>> it = iter(jd.MirroredStrategy(["/cpu:0"]).experimental_distribute_dataset([]))
    >>> try:
    ...     it.get_next()
    ... except jd.errors.OutOfRangeError as e:
    ...     print("end of data:", isinstance(e, StopIteration))
    end of data: True
    """


class InvalidArgumentError(ValueError):
    """TF's ``tf.errors.InvalidArgumentError``: ``get_value()`` of an empty optional.

    A `ValueError`.

    >>> import jaxdist as jd
    >>> it = iter(jd.MirroredStrategy(["/cpu:0"]).experimental_distribute_dataset([]))
    >>> try:
    ...     it.get_next_as_optional().get_value()
    ... except jd.errors.InvalidArgumentError as e:
    ...     print(isinstance(e, ValueError))
    True
    """
