"""`jaxdist.errors`: the TF error classes (``tf.errors``) that jaxdist raises.

>>> import jaxdist as jd
>>> issubclass(jd.errors.OutOfRangeError, StopIteration)
True
"""

from jaxdist._errors import InvalidArgumentError as InvalidArgumentError
from jaxdist._errors import OutOfRangeError as OutOfRangeError

__all__ = ["InvalidArgumentError", "OutOfRangeError"]
