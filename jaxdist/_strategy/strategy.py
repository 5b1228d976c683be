"""`Strategy`: the TF2 `tf.distribute.Strategy` surface, shared by every strategy.

The methods are thin: each checks its arguments and context, then calls the
layer that does the work (`_run.run`, `_collective.reduce`, `_input.datasets`, `StrategyExtended`).
The TF1-era methods are added by `StrategyV1` (`jaxdist._strategy.compat`), as in TF.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

from jaxdist._base import context as _context
from jaxdist._base.layout import as_array, is_array
from jaxdist._base.options import InputOptions, RunOptions
from jaxdist._base.reduce_op import ReduceOp, parse_reduce_op
from jaxdist._base.validate import (
    check_axis,
    check_callable,
    check_fn_args,
    check_optional,
    is_number,
)
from jaxdist._collective import reduce as _reduce
from jaxdist._input import datasets as _input
from jaxdist._input.datasets import DistributedDataset, InputContext
from jaxdist._run import run as _run
from jaxdist._strategy.extended import StrategyExtended
from jaxdist._values.trees import ValueContext, check_components, combine_parts, regroup
from jaxdist._values.values import is_distributed


class Strategy:
    """A way to run a step on several replicas: the base of every strategy.

    Use a subclass: `MirroredStrategy` (one replica per local device),
    `OneDeviceStrategy`, or `MultiWorkerMirroredStrategy`.

    >>> import jaxdist as jd
    >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    >>> isinstance(s, jd.Strategy), s.num_replicas_in_sync
    (True, 2)
    """

    _is_default = False  # the default strategy's (no scope active): its errors say so
    # a trace is of one strategy: another in its place (a global rebound) is a new trace
    __jaxdist_identity__ = True

    def __init__(self, extended: StrategyExtended) -> None:
        self._extended = extended

    @property
    def extended(self) -> StrategyExtended:
        """The `StrategyExtended` API: devices, `reduce_to`, `batch_reduce_to`, `broadcast_to`."""
        return self._extended

    @property
    def num_replicas_in_sync(self) -> int:
        """How many replicas run each step (and over which values are aggregated)."""
        return self._extended.replicas.num

    @property
    def cluster_resolver(self) -> Any:
        """The cluster resolver of a multi-worker strategy; None here."""
        return None

    def scope(self) -> _context.Scope:
        """Makes this strategy current (cross-replica context) for the ``with`` block.

        The returned object can be entered again, and nested in itself.
        Re-entering the same strategy's scope is a no-op; another strategy's
        scope inside it raises `RuntimeError`.

        >>> import jaxdist as jd
        >>> s = jd.OneDeviceStrategy("/cpu:0")
        >>> with s.scope():
        ...     print(jd.get_strategy() is s, jd.in_cross_replica_context())
        True True
        """
        return _context.Scope(self)

    def run(
        self,
        fn: Callable,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        options: RunOptions | None = None,
    ) -> Any:
        """Runs ``fn`` on every replica, traced once and lowered through `jax.pmap`.

        `PerReplica`/`Mirrored` leaves of ``args``/``kwargs`` are split over the
        replicas; arrays and Python numbers are given to every replica and traced
        (as `jax.jit` traces them: one compile for every value); other Python
        values (bools, strings, None) are static, and so is a number bound with
        ``functools.partial(fn, n=3)``; a number ``fn`` closes over (or reads from
        an object or a global) is re-read on every call, not baked in (the guide
        "State a step reads"). Inside ``fn``, `jaxdist.get_replica_context()` gives the
        replica's id and collectives. Returns ``fn``'s structure with
        `PerReplica` leaves (plain values for a one-replica strategy). Works the
        same inside `jax.jit` and `lax` loops; eagerly, compiled steps are cached
        per function (weakly) and argument signature.

        >>> import jax.numpy as jnp, jaxdist as jd
        >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
        >>> out = s.run(lambda x: x * jd.get_replica_context().replica_id_in_sync_group,
        ...             args=(jnp.ones(2),))
        >>> [x.tolist() for x in s.experimental_local_results(out)]
        [[0.0, 0.0], [1.0, 1.0]]

        Args:
            fn: the step function (written with `jax.numpy`/`jax.lax`).
            args: positional arguments.
            kwargs: keyword arguments.
            options: an optional `RunOptions`.
        """
        ext = self._extended
        replayed = False
        if kwargs is None and options is None and type(args) is tuple:  # (the common call)
            out = _run.replay(self, ext.cross_device_ops, fn, args)
            if out is not _run.MISS:
                return out
            replayed = True
        check_fn_args(fn, args, kwargs)
        check_optional(options, RunOptions, "options", "a jaxdist.RunOptions")
        args, kwargs = tuple(args), dict(kwargs or {})
        return _run.run(self, ext.replicas, ext.cross_device_ops, fn, args, kwargs, replayed)

    def reduce(self, reduce_op: ReduceOp | str, value: Any, axis: int | None = None) -> Any:
        """Reduces ``value`` across replicas (and along ``axis`` when given) to one array.

        With ``axis=None`` it combines the replicas' values element-wise. With an
        ``axis`` it also reduces along that axis of every replica's value; MEAN
        then divides by the true number of elements, also for uneven partial
        batches (a batch of 6 split ``[2, 2, 2, 0]`` has denominator 6).

        >>> import jax.numpy as jnp, jaxdist as jd
        >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
        >>> v = s.experimental_distribute_values_from_function(
        ...     lambda ctx: jnp.array([1.0, 2.0]) + 2 * ctx.replica_id_in_sync_group)
        >>> s.reduce("SUM", v, axis=None).tolist(), float(s.reduce("MEAN", v, axis=0))
        ([4.0, 6.0], 2.5)

        Args:
            reduce_op: `ReduceOp` or ``"SUM"``/``"MEAN"`` (any case).
            value: a `PerReplica` (or a nested structure of them), or an array.
            axis: the per-replica axis to reduce as well, or None.
        """
        _context.require_cross_replica(self, "strategy.reduce")
        op = parse_reduce_op(reduce_op)
        check_axis(axis, "axis", allow_none=True)
        replicas, cdo = self._extended.replicas, self._extended.cross_device_ops
        check_components(value, replicas, "strategy.reduce", self._is_default)

        def one(v: Any) -> Any:
            return _reduce.released(_reduce.reduce_value(replicas, cdo, op, v, axis), replicas)

        # a None in the structure is a value (TF reduces it as one), not an empty subtree
        return jax.tree.map(one, value, is_leaf=lambda v: v is None or is_distributed(v))

    def gather(self, value: Any, axis: int) -> Any:
        """Concatenates the replicas' values along ``axis`` onto one device.

        >>> import jax.numpy as jnp, jaxdist as jd
        >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
        >>> v = s.experimental_distribute_values_from_function(
        ...     lambda ctx: jnp.full(2, float(ctx.replica_id_in_sync_group)))
        >>> s.gather(v, axis=0).tolist()
        [0.0, 0.0, 1.0, 1.0]
        """
        _context.require_cross_replica(self, "strategy.gather")
        check_axis(axis, "axis")
        replicas = self._extended.replicas
        check_components(value, replicas, "strategy.gather", self._is_default)

        def one(v: Any) -> Any:
            return _reduce.released(_reduce.gather_value(replicas, v, axis), replicas)

        return jax.tree.map(one, value, is_leaf=is_distributed)

    def experimental_local_results(self, value: Any) -> tuple:
        """The local replicas' components of ``value`` as a tuple.

        A nested structure gives one structure per local replica (TF hands every
        replica the same plain structure); any other plain value gives ``(value,)``.

        >>> import jaxdist as jd
        >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
        >>> s.experimental_local_results(3), s.experimental_local_results({"a": 1.0})
        ((3,), ({'a': 1.0}, {'a': 1.0}))
        """
        check_components(
            value, self._extended.replicas, "experimental_local_results", self._is_default
        )
        return _reduce.local_results(value, len(self._extended.replicas.local))

    def experimental_distribute_values_from_function(
        self, value_fn: Callable[[ValueContext], Any]
    ) -> Any:
        """Builds per-replica values by calling ``value_fn(ValueContext)`` once per replica.

        ``value_fn`` may return any pytree (the same structure on every replica);
        each leaf becomes a `PerReplica`. Each replica's value is placed on its
        device; same-shaped values become one stacked, sharded array. With several
        workers ``value_fn`` is called for this worker's replicas only, with their
        global replica ids (as TF).

        With one replica the value comes back as is, its arrays committed to the
        replica's device: the form `run` gives on one replica (TF unwraps one replica's
        results there, and wraps this one; jaxdist gives both one form, so a
        ``lax.fori_loop`` carry that starts here keeps its structure through `run`,
        and a jitted step sees one signature from its first call on).

        >>> import jaxdist as jd
        >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
        >>> v = s.experimental_distribute_values_from_function(
        ...     lambda ctx: ctx.replica_id_in_sync_group * 10)
        >>> [int(x) for x in s.experimental_local_results(v)]
        [0, 10]
        """
        # Not "mixing" when another strategy is current: TF allows it here.
        _context.require_cross_replica(None, "experimental_distribute_values_from_function")
        check_callable(value_fn, "value_fn")
        placement = self._extended.placement
        n = self.num_replicas_in_sync
        if n == 1 and not placement.multi_process:
            return jax.tree.map(
                lambda x: _on_device(x, placement.first_device), value_fn(ValueContext(0, 1))
            )
        outs = [value_fn(ValueContext(i, n)) for i in placement.local]
        return regroup(outs, "value_fn", lambda parts: combine_parts(parts, placement))

    def experimental_distribute_dataset(
        self, dataset: Any, options: InputOptions | None = None
    ) -> DistributedDataset:
        """Splits every global batch of ``dataset`` over the replicas.

        ``dataset`` is an iterable of batches (a list, a `NumpyDataset`, a
        `tf.data.Dataset` through ``as_numpy_iterator``, a grain or torch loader),
        or a function returning a fresh one per epoch (for generators: a
        generator object gives one epoch, and iterating again raises
        `RuntimeError`). See `jaxdist._input.datasets.distribute_dataset` for the
        splitting rules: a batch of ``b`` gives each replica ``ceil(b / R)``
        rows, filled greedily as TF does (6 over 4 replicas is ``[2, 2, 2, 0]``);
        no row is dropped or repeated. Unbatched elements (scalars) are yielded
        unchanged on one replica and raise `ValueError` here on several (batch
        the dataset first).

        >>> import numpy as np, jaxdist as jd
        >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
        >>> dist = s.experimental_distribute_dataset([np.arange(4), np.arange(4, 7)])
        >>> [[x.tolist() for x in s.experimental_local_results(b)] for b in dist]
        [[[0, 1], [2, 3]], [[4, 5], [6]]]

        Args:
            dataset: an iterable of batches, or a function returning one.
            options: an `InputOptions`; ``PER_REPLICA`` mode is not supported here.
        """
        _context.require_cross_replica(self, "experimental_distribute_dataset")
        return _input.distribute_dataset(self._extended.replicas, dataset, options)

    def distribute_datasets_from_function(
        self, dataset_fn: Callable[[InputContext], Any], options: InputOptions | None = None
    ) -> DistributedDataset:
        """Builds the replicas' input from ``dataset_fn(InputContext)``.

        ``PER_WORKER`` (default): called once per worker; each local replica
        takes the next element (batched or not). ``PER_REPLICA``: called once per
        replica; replica r reads its own dataset. Unbatched elements (scalars)
        go whole to each replica; a last step that cannot give every replica
        one is dropped, as TF's eager iteration does. Across workers, a worker
        whose batches ran out gets empty ones while any worker has data, and
        the loop ends on every worker together (as TF). See
        `jaxdist._input.datasets.distribute_datasets_from_function`.

        >>> import numpy as np, jaxdist as jd
        >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
        >>> def dataset_fn(ctx):
        ...     b = ctx.get_per_replica_batch_size(4)
        ...     return [np.arange(i, i + b) for i in range(0, 6, b)]
        >>> dist = s.distribute_datasets_from_function(dataset_fn)
        >>> [[x.tolist() for x in s.experimental_local_results(e)] for e in dist]
        [[[0, 1], [2, 3]], [[4, 5], []]]

        Args:
            dataset_fn: a function of an `InputContext` returning an iterable of batches.
            options: an `InputOptions`.
        """
        _context.require_cross_replica(self, "distribute_datasets_from_function")
        return _input.distribute_datasets_from_function(
            self._extended.replicas, dataset_fn, options
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(devices={list(self._extended.replicas.strings())})"


def _on_device(x: Any, device: jax.Device) -> Any:
    """One replica's value from ``value_fn``: arrays and numbers as arrays committed to
    ``device`` (as with several replicas), anything else as it is."""
    if is_array(x) or is_number(x):
        return jax.device_put(as_array(x), device)
    return x
