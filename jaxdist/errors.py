"""`jaxdist.errors`: the TF error classes (``tf.errors``) that jaxdist raises, and
`JaxInternalsError` (this JAX lacks something jaxdist reads beyond JAX's public API).

>>> import jaxdist as jd
>>> issubclass(jd.errors.OutOfRangeError, StopIteration)
True
"""

from jaxdist._errors import InvalidArgumentError as InvalidArgumentError
from jaxdist._errors import OutOfRangeError as OutOfRangeError
from jaxdist._jax_internals import JaxInternalsError as JaxInternalsError

__all__ = ["InvalidArgumentError", "JaxInternalsError", "OutOfRangeError"]
