"""`jaxdist.nn`: the distribution-aware loss helpers TF keeps under `tf.nn`.

>>> import jax.numpy as jnp, jaxdist as jd
>>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
>>> def step(x):
...     per_example = x * x
...     return jd.nn.compute_average_loss(per_example) + jd.nn.scale_regularization_loss(0.5)
>>> out = s.run(step, args=(jnp.array([1.0, 3.0]),))
>>> [float(v) for v in s.experimental_local_results(out)]
[2.75, 2.75]
>>> float(s.reduce("SUM", out, axis=None))
5.5
"""

from jaxdist._strategy.nn import compute_average_loss as compute_average_loss
from jaxdist._strategy.nn import scale_regularization_loss as scale_regularization_loss

__all__ = ["compute_average_loss", "scale_regularization_loss"]
