"""`StrategyExtended`: a strategy's devices, and its reduce / broadcast / colocation API.

One class for every strategy: what differs between the default strategy, a
local strategy and a multi-worker one is a field (``kind``), not a subclass.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax

from jaxdist._base import context as _context
from jaxdist._base.devices import Replicas
from jaxdist._base.layout import as_array, is_tracer, stacked_devices
from jaxdist._base.reduce_op import ReduceOp, parse_reduce_op
from jaxdist._collective.cross_device_ops import (
    CrossDeviceOps,
    ReductionToOneDevice,
    as_distributed,
    check_mirrored_sum,
    check_pairs,
    check_plain_sum,
    destination_devices,
    effective_ops,
    is_int32,
    place,
)
from jaxdist._collective.replica_context import call_in_merge
from jaxdist._values.layout import component_devices, is_traced
from jaxdist._values.trees import check_components
from jaxdist._values.values import DistributedValues, is_distributed

LOCAL, DEFAULT, MULTI_WORKER = "local", "default", "multi_worker"


class StrategyExtended:
    """Additional strategy API (``strategy.extended``), as `tf.distribute.StrategyExtended`.

    >>> import jaxdist as jd
    >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    >>> s.extended.worker_devices
    ('/job:localhost/replica:0/task:0/device:CPU:0', '/job:localhost/replica:0/task:0/device:CPU:1')
    """

    # a trace is of one strategy: another in its place (a global rebound) is a new trace
    __jaxdist_identity__ = True

    def __init__(
        self,
        strategy: Any,
        replicas: Replicas,
        cross_device_ops: CrossDeviceOps,
        kind: str = LOCAL,
        is_chief: bool = True,
    ) -> None:
        self._strategy = strategy
        self._replicas = replicas
        self._cross_device_ops = cross_device_ops
        self._kind = kind
        self._is_chief = is_chief
        self._colocation: Replicas | None = None

    @property
    def replicas(self) -> Replicas:
        """(jaxdist) The replicas' topology: devices, local ones, sharding, first device."""
        return self._replicas

    @property
    def cross_device_ops(self) -> CrossDeviceOps:
        """(jaxdist) The cross-device ops reductions outside the step use."""
        return self._cross_device_ops

    @property
    def placement(self) -> Replicas:
        """(jaxdist) Where values the strategy creates go: its replicas, or under
        `colocate_vars_with` the devices of the value given there."""
        return self._colocation or self._replicas

    @property
    def worker_devices(self) -> tuple[str, ...]:
        """The devices of this worker's replicas, as TF-style strings."""
        if self._kind == DEFAULT:
            raise RuntimeError(
                "worker_devices is not supported by the default strategy (outside any scope); "
                "create a MirroredStrategy or OneDeviceStrategy and use its extended API."
            )
        return self._replicas.strings(local_only=True)

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        """The devices that hold (mirrored) parameters: this worker's replicas' devices."""
        if self._kind == DEFAULT:
            raise RuntimeError(
                "parameter_devices is not supported by the default strategy (outside any scope)."
            )
        return self.worker_devices

    @property
    def experimental_between_graph(self) -> bool:
        """Whether workers run separate programs (TF's between-graph replication)."""
        return self._kind == MULTI_WORKER

    @property
    def experimental_require_static_shapes(self) -> bool:
        """Whether steps need static shapes: False, as TF's Mirrored and multi-worker
        strategies (a partial batch compiles its own program)."""
        return False

    @property
    def experimental_should_init(self) -> bool:
        """Whether this worker should initialize state (True)."""
        return True

    @property
    def should_checkpoint(self) -> bool:
        """Whether this worker should save checkpoints (True; the chief in multi-worker)."""
        return self._is_chief

    @property
    def should_save_summary(self) -> bool:
        """Whether this worker should write summaries (True; the chief in multi-worker)."""
        return self._is_chief

    # -- reduce / broadcast ----------------------------------------------------

    def _replica_ctx_all_reduce(
        self, reduce_op: ReduceOp | str, value: Any, options: Any = None
    ) -> Any:
        """All-reduces ``value`` across the replicas from inside a replica step: an alias of
        the replica context's `ReplicaContext.all_reduce` (``jd.get_replica_context().
        all_reduce(reduce_op, value, options)``).

        Private in TF 2.21, and kept because TF Model Garden's ``grad_utils`` calls it
        (``strategy.extended._replica_ctx_all_reduce(op, grads, options)``). As TF's, it must
        be called in a replica step (an `AssertionError` elsewhere).

        >>> import jaxdist as jd
        >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
        >>> out = s.run(lambda: s.extended._replica_ctx_all_reduce("SUM", 1.0))
        >>> [float(v) for v in s.experimental_local_results(out)]
        [2.0, 2.0]
        """
        state = _context.current()
        ctx = state.replica_context if state.mode is _context.Mode.REPLICA else None
        if ctx is None:
            raise AssertionError(
                "`StrategyExtended._replica_ctx_all_reduce` must be called in a replica context"
            )
        return ctx.all_reduce(reduce_op, value, options)

    def reduce_to(
        self, reduce_op: ReduceOp | str, value: Any, destinations: Any, options: Any = None
    ) -> Any:
        """Combines ``value`` across replicas and places the result on ``destinations``.

        Uses the strategy's cross-device ops (TF's rules decide which op really
        runs). ``destinations=value`` is an all-reduce whose `Mirrored` result
        stays on the replicas' devices.

        Args:
            reduce_op: `ReduceOp` or ``"SUM"``/``"MEAN"`` (any case).
            value: a `DistributedValues` or an array.
            destinations: a device string, `jax.Device`, `DistributedValues` or array.
            options: an optional `experimental.CommunicationOptions`.
        """
        _context.require_cross_replica(self._strategy, "strategy.extended.reduce_to")
        op = parse_reduce_op(reduce_op)
        check_components(
            value, self._replicas, "strategy.extended.reduce_to", self._kind == DEFAULT
        )
        devices = destination_devices(destinations)
        if not is_distributed(value):
            check_plain_sum(op, self._replicas.num)
            return place(as_distributed(value).values[0], _first(devices))
        if check_mirrored_sum(op, value):
            return value
        return effective_ops(self._cross_device_ops, value, devices).reduce(
            op, value, destinations, options
        )

    def batch_reduce_to(
        self, reduce_op: ReduceOp | str, value_destination_pairs: Sequence, options: Any = None
    ) -> list:
        """`reduce_to` for many ``(value, destinations)`` pairs at once (packed)."""
        _context.require_cross_replica(self._strategy, "strategy.extended.batch_reduce_to")
        op = parse_reduce_op(reduce_op)
        pairs = check_pairs(value_destination_pairs)
        for value, _ in pairs:
            check_components(
                value, self._replicas, "strategy.extended.batch_reduce_to", self._kind == DEFAULT
            )
        cdo = self._cross_device_ops
        if isinstance(cdo, ReductionToOneDevice) and cdo.accumulation_fn is not None:
            ints = {is_int32(v) for v, _ in pairs}
            if ints == {True, False}:
                raise ValueError(
                    "batch_reduce_to cannot mix int32 and other values with a "
                    "ReductionToOneDevice accumulation_fn (TF reduces int32 on the host); "
                    "call it once per kind."
                )
            if ints == {True}:
                cdo = ReductionToOneDevice(reduce_to_device=cdo.reduce_to_device)
        return cdo.batch_reduce(op, pairs, options)

    def broadcast_to(self, tensor: Any, destinations: Any = None) -> Any:
        """Copies ``tensor`` (any pytree of arrays) to ``destinations``.

        ``destinations=None``: the replicas' devices, or under `colocate_vars_with`
        the devices of the value given there. Several devices give `Mirrored` leaves.

        >>> import jax.numpy as jnp, jaxdist as jd
        >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
        >>> m = s.extended.broadcast_to({"w": jnp.ones(2)})
        >>> type(m["w"]).__name__, [x.tolist() for x in m["w"].values]
        ('Mirrored', [[1.0, 1.0], [1.0, 1.0]])
        """
        _context.require_cross_replica(self._strategy, "strategy.extended.broadcast_to")
        if destinations is None:
            devices: Any = self.placement.devices
            return jax.tree.map(lambda t: place(as_array(t), devices), tensor)
        return self._cross_device_ops.broadcast(tensor, destinations)

    def colocate_vars_with(self, colocate_with_variable: Any) -> contextlib.AbstractContextManager:
        """A context under which values the strategy creates go on the given value's devices.

        >>> import jaxdist as jd
        >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
        >>> anchor = jd.MirroredStrategy(["/cpu:5", "/cpu:4"]).extended.broadcast_to(1.0)
        >>> with s.extended.colocate_vars_with(anchor):
        ...     v = s.extended.broadcast_to(2.0)
        >>> [x.devices().pop().id for x in v.values]
        [5, 4]

        Args:
            colocate_with_variable: a `DistributedValues` or a `jax.Array` with one
                component on its own device per replica.

        Raises:
            TypeError: when the argument is neither a `DistributedValues` nor a `jax.Array`.
            ValueError: when it does not have one component per replica on distinct devices.
        """
        devices = _colocation_devices(
            self._replicas.num, colocate_with_variable, self._replicas.devices
        )
        return self._colocate(devices)

    @contextlib.contextmanager
    def _colocate(self, devices: tuple) -> Iterator[None]:
        previous = self._colocation
        self._colocation = Replicas.of(devices)
        try:
            yield
        finally:
            self._colocation = previous

    def call_for_each_replica(
        self, fn: Callable, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        """Runs ``fn`` once per replica, as `Strategy.run`.

        Inside a ``merge_fn`` (from `ReplicaContext.merge_call` in a step) it runs
        ``fn`` on every replica in replica context, as TF does, and returns
        `PerReplica` results; ``fn``'s exceptions reach the caller as they are.

        >>> import jaxdist as jd
        >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
        >>> def merge_fn(strategy):
        ...     return strategy.extended.call_for_each_replica(
        ...         lambda: jd.get_replica_context().replica_id_in_sync_group * 10)
        >>> out = s.run(lambda: jd.get_replica_context().merge_call(merge_fn))
        >>> [int(x) for x in s.experimental_local_results(out)]
        [0, 10]
        """
        state = _context.current()
        if state.mode is _context.Mode.MERGE and state.strategy is self._strategy:
            if state.merge_from is None:
                raise RuntimeError(
                    "extended.call_for_each_replica inside a merge_fn works in full-batch steps; "
                    "this merge_fn runs in a partial-batch step (replicas with different batch "
                    "sizes), where merge_fn runs once outside the replicas' traces. Return the "
                    "values from merge_fn and compute per replica after merge_call instead."
                )
            return call_in_merge(self._strategy, state.merge_from, fn, args, kwargs)
        return self._strategy.run(fn, args, kwargs)

    def __repr__(self) -> str:
        return f"StrategyExtended(devices={list(self._replicas.strings())})"


def _first(devices: tuple | int) -> tuple | int:
    return devices if isinstance(devices, int) else devices[:1]


def _colocation_devices(n: int, value: Any, own: tuple) -> tuple[jax.Device, ...]:
    """The devices, one per replica, on which ``value``'s components live.

    A distributed value with one component per replica that are not each on their
    own device (e.g. built by the user from arrays on the default device) stands
    for the strategy's own replicas, as a TF variable created in the scope would.
    """
    if isinstance(value, DistributedValues):
        if is_traced(value):
            raise ValueError(
                "colocate_vars_with needs a concrete value, not one traced inside a "
                "transformation; call it in cross-replica context."
            )
        devices = component_devices(value)
        if len(devices) == n and (None in devices or len(set(devices)) != n):
            return own
    elif is_tracer(value):
        raise ValueError(
            "colocate_vars_with needs a concrete value; got an array traced inside a "
            "transformation. Call it in cross-replica context."
        )
    elif isinstance(value, jax.Array):
        devices = stacked_devices(value) if value.ndim else tuple(value.devices())
    else:
        raise TypeError(
            "colocate_vars_with takes a distributed value (a PerReplica or Mirrored, e.g. from "
            "Strategy.run or experimental_distribute_values_from_function) or a jax.Array; "
            f"got {type(value).__name__}."
        )
    if len(devices) != n or len(set(devices)) != len(devices):
        raise ValueError(
            f"colocate_vars_with needs a value with one component on its own device per "
            f"replica ({n} replica(s)), since values created through the strategy have one "
            f"component per replica; got a value on the devices {[str(d) for d in devices]}."
        )
    return tuple(devices)
