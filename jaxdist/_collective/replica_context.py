"""`ReplicaContext`: the API a step function uses inside `Strategy.run`.

A `ReplicaContext` is a thin front over a `Collectives` record of functions,
one record per execution path:

* compiled (`compiled_collectives`): the step is traced once for all replicas
  under `jax.pmap` (also inside `jax.jit` and `lax` loops), so
  `replica_id_in_sync_group` is `lax.axis_index`, `all_reduce` is `lax.psum`
  (or an all-gather combined by a `ReductionToOneDevice` ``accumulation_fn``),
  and `merge_call` gathers its arguments and runs ``merge_fn`` once, in the
  trace, identically on every replica;
* default (`default_collectives`): one replica, outside any strategy;
* ragged (`jaxdist._partial.ragged`): each replica traced on its own slice of a partial batch.

Every path reduces through TF's rules in `jaxdist._collective.cross_device_ops` and
`jaxdist._base.reduce_op.finish`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxdist._base import context as _context
from jaxdist._base.devices import AXIS
from jaxdist._base.layout import as_array, is_tracer
from jaxdist._base.options import check_communication_options
from jaxdist._base.reduce_op import ReduceOp, finish, parse_reduce_op
from jaxdist._base.validate import check_fn_args, check_instance
from jaxdist._collective.cross_device_ops import accumulation_for
from jaxdist._values.layout import stack
from jaxdist._values.values import from_stacked, is_distributed


class Collectives(NamedTuple):
    """The functions behind a `ReplicaContext` on one execution path."""

    replica_id: Callable[[], Any]
    all_reduce: Callable[[ReduceOp, Any], Any]
    all_gather: Callable[[Any, int], Any]
    merge_call: Callable[[Callable, tuple, dict], Any]
    devices: Callable[[], tuple]


def default_collectives(strategy: Any, replica_id: Any = 0) -> Collectives:
    """One replica (the default strategy, or a context built with the public constructor)."""

    def all_reduce(op: ReduceOp, value: Any) -> Any:
        return jax.tree.map(lambda x: finish(op, as_array(x), 1), value)

    def merge_call(merge_fn: Callable, args: tuple, kwargs: dict) -> Any:
        # TF: in merge_fn of the default replica context no strategy is current
        # (has_strategy() is False) but the mode is cross-replica.
        with _context.enter(_context.merge_state(None)):
            return merge_fn(strategy, *args, **kwargs)

    return Collectives(
        replica_id=lambda: replica_id,
        all_reduce=all_reduce,
        all_gather=lambda value, axis: jax.tree.map(as_array, value),
        merge_call=merge_call,
        devices=lambda: strategy.extended.replicas.strings()[:1],
    )


def gather_leaf(x: Any, axis: int, gather: Callable[[Any], Any], single: bool = False) -> Any:
    """TF's all_gather of one leaf: Python numbers give a value per replica; no scalars
    unless there is a ``single`` replica (then the scalar itself, as TF)."""
    if not isinstance(x, (jax.Array, np.ndarray)):
        return jnp.asarray(x)  # TF returns a Python number as a tensor per replica
    x = as_array(x)
    if x.ndim == 0 and single:
        return x  # TF: one replica gathers a scalar as it is
    if x.ndim == 0:
        raise ValueError(
            "all_gather needs values with at least one dimension to concatenate "
            f"along axis={axis}; got a scalar. Reshape it with x[None] first."
        )
    return gather(x)


def compiled_collectives(strategy: Any, cdo: Any, num_replicas: int) -> tuple:
    """Collectives of a step traced under `jax.pmap`; also returns merge results' ids.

    A value returned as it is from ``merge_fn`` is the same on every replica (TF
    hands every replica the same object), so `Strategy.run` returns it as one value.
    """
    invariant: dict[int, Any] = {}

    def all_reduce(op: ReduceOp, value: Any) -> Any:
        def one(x: Any) -> Any:
            x = as_array(x)
            fn = accumulation_for(cdo, x)
            if fn is None:
                return finish(op, lax.psum(x, AXIS), num_replicas)
            rows = lax.all_gather(x, AXIS)
            return finish(op, fn([rows[i] for i in range(num_replicas)]), num_replicas)

        return jax.tree.map(one, value)

    def all_gather(value: Any, axis: int) -> Any:
        def gather(x: Any) -> Any:
            if x.size == 0:  # XLA rejects a zero-size all-gather; the result is empty too
                shape = list(x.shape)
                shape[axis % max(x.ndim, 1)] *= num_replicas
                return jnp.zeros(shape, x.dtype)
            return lax.all_gather(x, AXIS, axis=axis, tiled=True)

        return jax.tree.map(lambda x: gather_leaf(x, axis, gather, num_replicas == 1), value)

    def merge_call(merge_fn: Callable, args: tuple, kwargs: dict) -> Any:
        def gather(x: Any) -> Any:
            return from_stacked(lax.all_gather(x, AXIS)) if isinstance(x, jax.Array) else x

        gargs, gkwargs = jax.tree.map(gather, (args, kwargs))
        outer = _context.current().replica_context
        with _context.enter(_context.merge_state(strategy, outer)):
            result = merge_fn(strategy, *gargs, **gkwargs)
        index = lax.axis_index(AXIS)

        def unpack(x: Any) -> Any:
            if not is_distributed(x):
                if is_tracer(x):
                    invariant[id(x)] = x
                return x
            return lax.dynamic_index_in_dim(stack(x), index, keepdims=False)

        return jax.tree.map(unpack, result, is_leaf=is_distributed)

    collectives = Collectives(
        replica_id=lambda: lax.axis_index(AXIS),
        all_reduce=all_reduce,
        all_gather=all_gather,
        merge_call=merge_call,
        devices=lambda: strategy.extended.replicas.strings(),
    )
    return collectives, invariant


class ReplicaContext:
    """The replica's view inside `Strategy.run`: its id, and collectives.

    Get it with `jaxdist.get_replica_context()` inside the step function.

    >>> import jax.numpy as jnp, jaxdist as jd
    >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    >>> def step():
    ...     ctx = jd.get_replica_context()
    ...     return ctx.all_reduce(jd.ReduceOp.SUM, jnp.float32(1.0))
    >>> [float(x) for x in s.experimental_local_results(s.run(step))]
    [2.0, 2.0]

    A context works only inside the step it belongs to: one kept after its `run`,
    or built with this constructor, raises `RuntimeError` for its collectives
    (``all_reduce``, ``all_gather``, ``merge_call``), as TF's do; a hand-built one
    still answers the id it was given.

    >>> kept = []
    >>> _ = s.run(lambda: kept.append(jd.get_replica_context()))
    >>> try:
    ...     kept[0].all_reduce("SUM", jnp.float32(1.0))
    ... except RuntimeError as e:
    ...     print(str(e)[:74])
    ReplicaContext.all_reduce was called on a replica context that is not the

    Args:
        strategy: the `Strategy` this context belongs to.
        replica_id_in_sync_group: the replica's id (an int, or a traced int32).
    """

    def __init__(self, strategy: Any, replica_id_in_sync_group: Any = 0) -> None:
        self._strategy = strategy
        self._collectives = default_collectives(strategy, replica_id_in_sync_group)
        self._standalone = True  # built by hand: not the context of any run
        self._default = False

    def _require_current(self, what: str) -> None:
        """TF's `require_replica_context`: collectives only from the current context.

        A context kept past the `Strategy.run` that made it, or built by hand with
        the constructor, is not the current one (TF raises the same way).
        """
        state = _context.current()
        if state.replica_context is self and state.mode is _context.Mode.REPLICA:
            return
        if self._default and state.mode is _context.Mode.DEFAULT:
            return
        kind = "built with ReplicaContext(...)" if self._standalone else "kept after its run"
        raise RuntimeError(
            f"ReplicaContext.{what} was called on a replica context that is not the current "
            f"one ({kind}). A ReplicaContext works only inside the strategy.run (or "
            "call_for_each_replica) step that it belongs to: call "
            "jaxdist.get_replica_context() inside the step function and use that."
        )

    @property
    def strategy(self) -> Any:
        """The `Strategy` this replica belongs to."""
        return self._strategy

    @property
    def num_replicas_in_sync(self) -> int:
        """The number of replicas kept in sync (a Python int)."""
        return self._strategy.num_replicas_in_sync

    @property
    def replica_id_in_sync_group(self) -> Any:
        """This replica's id in ``[0, num_replicas_in_sync)``: a traced int32 inside `run`."""
        if not self._standalone:
            self._require_current("replica_id_in_sync_group")
        return self._collectives.replica_id()

    @property
    def devices(self) -> tuple[str, ...]:
        """(Deprecated in TF) The devices of this replica, as TF-style strings.

        Inside a compiled step the step is traced once for all replicas, so this
        is the tuple of every replica's device; outside, the default device.
        """
        return self._collectives.devices()

    def all_reduce(self, reduce_op: ReduceOp | str, value: Any, options: Any = None) -> Any:
        """All-reduces ``value`` (any pytree of arrays) across replicas.

        SUM maps to `lax.psum`; MEAN divides the sum by the number of replicas
        (integers give a float mean, as TF). With a `ReductionToOneDevice` that
        has an ``accumulation_fn``, the values are all-gathered and that function
        combines them, as TF does (not for int32 values).

        >>> import jax.numpy as jnp, jaxdist as jd
        >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
        >>> out = s.run(lambda: jd.get_replica_context().all_reduce("SUM", [1.0, 2.0]))
        >>> [[float(a), float(b)] for a, b in s.experimental_local_results(out)]
        [[2.0, 4.0], [2.0, 4.0]]

        Args:
            reduce_op: `ReduceOp.SUM`/`MEAN` or the strings ``"SUM"``/``"MEAN"``.
            value: a nested structure of arrays; same structure on every replica.
            options: an optional `experimental.CommunicationOptions` (validated).
        """
        op = parse_reduce_op(reduce_op)
        check_communication_options(options)
        self._require_current("all_reduce")
        if any(is_distributed(x) for x in jax.tree.leaves(value, is_leaf=is_distributed)):
            raise TypeError(
                "all_reduce takes plain arrays inside strategy.run; got a distributed value. "
                "Use strategy.reduce or strategy.extended.reduce_to in cross-replica context."
            )
        return self._collectives.all_reduce(op, value)

    def all_gather(self, value: Any, axis: int, options: Any = None) -> Any:
        """Concatenates every replica's ``value`` along ``axis`` (`lax.all_gather`, tiled).

        >>> import jax.numpy as jnp, jaxdist as jd
        >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
        >>> out = s.run(lambda: jd.get_replica_context().all_gather(jnp.ones(1), axis=0))
        >>> s.experimental_local_results(out)[0].tolist()
        [1.0, 1.0]

        Args:
            value: a nested structure of arrays with at least one dimension.
            axis: the dimension to concatenate along (>= 0, as in TF).
            options: an optional `experimental.CommunicationOptions` (validated).
        """
        check_instance(axis, int, "axis", "an int")
        if axis < 0:
            raise ValueError(f"all_gather needs axis >= 0 (as in TF); got {axis}.")
        check_communication_options(options)
        self._require_current("all_gather")
        return self._collectives.all_gather(value, axis)

    def merge_call(self, merge_fn: Callable, args: tuple = (), kwargs: dict | None = None) -> Any:
        """Runs ``merge_fn(strategy, *args, **kwargs)`` once, in cross-replica context.

        Array arguments arrive in ``merge_fn`` as `PerReplica` values holding every
        replica's value; ``merge_fn`` may call `Strategy.reduce`,
        `experimental_local_results` and the `extended` API. Its result goes back
        to every replica, with `PerReplica`/`Mirrored` values unpacked to the
        replica's own component.

        Args:
            merge_fn: a function taking the strategy, then ``args`` and ``kwargs``.
            args: positional arguments (a tuple or list).
            kwargs: keyword arguments (a dict).
        """
        check_fn_args(merge_fn, args, kwargs, "merge_fn")
        self._require_current("merge_call")
        return self._collectives.merge_call(merge_fn, tuple(args), dict(kwargs or {}))

    def __repr__(self) -> str:
        return f"ReplicaContext(strategy={self._strategy!r})"


def make_replica_context(strategy: Any, collectives: Collectives) -> ReplicaContext:
    """A `ReplicaContext` over the given execution path's collectives."""
    ctx = object.__new__(ReplicaContext)
    ctx._strategy = strategy
    ctx._collectives = collectives
    ctx._standalone = False
    ctx._default = False
    return ctx


def call_in_merge(strategy: Any, ctx: ReplicaContext, fn: Callable, args: Any, kwargs: Any) -> Any:
    """``extended.call_for_each_replica`` inside the ``merge_fn`` of a compiled step.

    ``merge_fn`` runs in every replica's trace (identically), so each replica
    calls ``fn`` on its own components of ``args``, in replica context (its
    collectives work); the results come back as `PerReplica` values holding
    every replica's result, as TF's do. An exception of ``fn`` reaches the
    caller as it is.
    """
    check_fn_args(fn, args, kwargs)
    index = ctx._collectives.replica_id()

    def own(x: Any) -> Any:
        return lax.dynamic_index_in_dim(stack(x), index, keepdims=False) if is_distributed(x) else x

    own_args, own_kwargs = jax.tree.map(
        own, (tuple(args), dict(kwargs or {})), is_leaf=is_distributed
    )
    with _context.enter(_context.replica_again_state(strategy, ctx)):
        out = fn(*own_args, **own_kwargs)

    def gather(x: Any) -> Any:
        return from_stacked(lax.all_gather(x, AXIS)) if isinstance(x, jax.Array) else x

    return jax.tree.map(gather, out)


def default_replica_context(strategy: Any) -> ReplicaContext:
    """The default strategy's replica context: current whenever no strategy is."""
    ctx = ReplicaContext(strategy, 0)
    ctx._default = True
    return ctx
