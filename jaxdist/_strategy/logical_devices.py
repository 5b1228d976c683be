"""The checks of the logical-device annotations (TPU model parallelism) of `StrategyV1`.

Every jaxdist replica has exactly one logical device, so these accept what is
consistent with that (the value is returned unchanged) and raise TF's
`ValueError`, with the numbers, for anything else, outside and inside `run`.
For model parallelism inside a replica, use `jax.sharding`.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdist._base.validate import is_int
from jaxdist._values.values import DistributedValues

NUM_LOGICAL_DEVICES_PER_REPLICA = 1
"""How many logical devices (model-parallel partitions) one jaxdist replica has."""

_ARRAY_TYPES = (jax.Array, np.ndarray, np.generic, bool, int, float, complex)


def component_shapes(tensor: Any, what: str) -> list[tuple[int, ...]]:
    """The static shape of ``tensor`` (of each component of a distributed value)."""
    if isinstance(tensor, DistributedValues):
        return [tuple(jnp.shape(v)) for v in tensor.values]
    if isinstance(tensor, _ARRAY_TYPES):
        return [tuple(jnp.shape(tensor))]
    raise TypeError(
        f"{what} takes an array (a jax.Array, a numpy array or a Python number) or a "
        f"distributed value; got {type(tensor).__name__}."
    )


def check_partition_dimensions(tensor: Any, partition_dimensions: Any) -> None:
    what = "experimental_split_to_logical_devices"
    shapes = component_shapes(tensor, what)
    if isinstance(partition_dimensions, np.ndarray) and partition_dimensions.ndim == 1:
        partition_dimensions = partition_dimensions.tolist()
    if not isinstance(partition_dimensions, (list, tuple)) or not all(
        is_int(d) for d in partition_dimensions
    ):
        raise TypeError(
            "partition_dimensions must be an unnested list of integers, one per dimension of "
            f"tensor; got {partition_dimensions!r}."
        )
    dims = [int(d) for d in partition_dimensions]
    for shape in shapes:
        if len(shape) != len(dims):
            raise ValueError(
                "Length of `partition_dimensions` must equal to the rank of `tensor.shape` "
                f"({len(shape)}). Received len(partition_dimensions)={len(dims)}."
            )
    if any(d < 1 for d in dims):
        raise ValueError(
            f"Every value of `partition_dimensions` must be a positive integer; received "
            f"`partition_dimensions`={dims}."
        )
    for shape in shapes:
        for index, (size, split) in enumerate(zip(shape, dims)):
            if size % split:
                raise ValueError(
                    f"Tensor shape at `partition_dimensions[{index}]` must be divisible by "
                    f"corresponding value specified by `partition_dimensions` ({split}). "
                    f"Received: {size}."
                )
    product = math.prod(dims)
    if product != NUM_LOGICAL_DEVICES_PER_REPLICA:
        raise ValueError(
            "The product of `partition_dimensions` should be the same as the number of logical "
            f"devices (={NUM_LOGICAL_DEVICES_PER_REPLICA}). Received `partition_dimensions`="
            f"{dims}, and their product is {product}. (Every jaxdist replica has exactly one "
            "logical device; shard inside a replica with jax.sharding instead.)"
        )


def check_assign(tensor: Any, logical_device_id: Any) -> None:
    """``experimental_assign_to_logical_device``'s checks: an array, and id 0 (TF's error)."""
    component_shapes(tensor, "experimental_assign_to_logical_device")
    if not is_int(logical_device_id):
        raise TypeError(f"logical_device_id must be an int; got {logical_device_id!r}.")
    n = NUM_LOGICAL_DEVICES_PER_REPLICA
    if not 0 <= logical_device_id < n:
        raise ValueError(
            "`logical_core_id` to assign must be lower than total number of logical devices "
            f"per replica. Received logical device id {logical_device_id} but there are only "
            f"total of {n} logical devices in replica."
        )
