"""`jaxdist.errors`: the TF error classes (``tf.errors``) that jaxdist raises, and
`JaxInternalsError` (this JAX lacks something jaxdist reads beyond JAX's public API).

>>> import jaxdist as jd
>>> issubclass(jd.errors.OutOfRangeError, StopIteration)
True
"""

from jaxdist._base.errors import InvalidArgumentError as InvalidArgumentError
from jaxdist._base.errors import OutOfRangeError as OutOfRangeError
from jaxdist._base.jax_internals import JaxInternalsError as JaxInternalsError

__all__ = ["InvalidArgumentError", "JaxInternalsError", "OutOfRangeError"]
