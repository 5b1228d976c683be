"""`MirroredStrategy` and `OneDeviceStrategy`: synchronous replicas on this process's devices."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

from jaxdist._base import context as _context
from jaxdist._base.devices import (
    Replicas,
    check_one_platform,
    local_devices,
    resolve_device,
    resolve_devices,
)
from jaxdist._base.validate import check_callable
from jaxdist._cluster.host import maybe_tune
from jaxdist._collective.all_reduce import check_cross_device_ops
from jaxdist._collective.cross_device_ops import CrossDeviceOps, ReductionToOneDevice
from jaxdist._strategy.compat import StrategyV1
from jaxdist._strategy.extended import StrategyExtended
from jaxdist._values.trees import ValueContext


class MirroredStrategy(StrategyV1):
    """Synchronous data parallelism: one replica per device, all kept in sync.

    Cross-replica reductions (`reduce`, `extended.reduce_to`, `batch_reduce_to`,
    `broadcast_to`) use ``cross_device_ops``. Inside `run`,
    `ReplicaContext.all_reduce` is `lax.psum`/`lax.pmean` compiled into the step
    (a separate copy-to-one-device program in the middle of a traced step would
    cost a device round trip per call); a `ReductionToOneDevice` with an
    ``accumulation_fn`` is still honoured there, by all-gathering the values and
    combining them with that function, as TF does.

    >>> import jax.numpy as jnp, jaxdist as jd
    >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    >>> s.num_replicas_in_sync
    2
    >>> def step(x):
    ...     ctx = jd.get_replica_context()
    ...     return ctx.all_reduce(jd.ReduceOp.SUM, x * ctx.replica_id_in_sync_group)
    >>> out = s.run(step, args=(jnp.ones(3),))
    >>> s.reduce("MEAN", out, axis=None).tolist()
    [1.0, 1.0, 1.0]

    Args:
        devices: device strings (``"/cpu:0"``, ``"/device:GPU:1"``, ...) or
            `jax.Device` objects; None: every local device of the default backend.
        cross_device_ops: a `CrossDeviceOps` instance; None: `NcclAllReduce()`.

    Raises:
        ValueError: ``devices`` name no device here, repeat one, or span several
            platforms (``["/gpu:0", "/cpu:0"]``: one replicated program runs on one).
    """

    def __init__(
        self,
        devices: Sequence[str | jax.Device] | None = None,
        cross_device_ops: CrossDeviceOps | None = None,
    ) -> None:
        resolved = resolve_devices(local_devices() if devices is None else devices)
        check_one_platform(resolved)
        cdo = check_cross_device_ops(cross_device_ops)
        super().__init__(StrategyExtended(self, Replicas.of(resolved), cdo))
        maybe_tune(resolved)


class OneDeviceStrategy(StrategyV1):
    """Runs everything on one device: the strategy API without distribution.

    >>> import jaxdist as jd
    >>> strategy = jd.OneDeviceStrategy(device="/cpu:0")
    >>> result = 0
    >>> for i in range(10):
    ...     result += strategy.run(lambda x: x * 2, args=(i,))
    >>> int(result)
    90

    Args:
        device: a device string such as ``"/cpu:0"`` or ``"/device:GPU:0"``, or a
            `jax.Device`.
    """

    def __init__(self, device: str | jax.Device) -> None:
        resolved = (resolve_device(device),)
        super().__init__(StrategyExtended(self, Replicas.of(resolved), ReductionToOneDevice()))
        maybe_tune(resolved)

    def experimental_distribute_values_from_function(
        self, value_fn: Callable[[ValueContext], Any]
    ) -> Any:
        """Calls ``value_fn(ValueContext())`` once; with one replica the value comes back
        as is (TF), its arrays committed to the strategy's device (as `run`'s outputs are,
        so a jitted step sees one signature from its first call on).

        >>> import jaxdist as jd
        >>> jd.OneDeviceStrategy("/cpu:0").experimental_distribute_values_from_function(
        ...     lambda ctx: ctx.replica_id_in_sync_group)
        0
        """
        _context.require_cross_replica(self, "experimental_distribute_values_from_function")
        check_callable(value_fn, "value_fn")
        device = self.extended.replicas.first_device
        return jax.tree.map(
            lambda x: jax.device_put(x, device) if isinstance(x, jax.Array) else x,
            value_fn(ValueContext(0, 1)),
        )
