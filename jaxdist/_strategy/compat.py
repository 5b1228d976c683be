"""`StrategyV1`: the TF1-era `Strategy` methods, kept for code being ported.

As TF layers ``StrategyV1`` over the TF2 ``Strategy``, every jaxdist strategy
derives from `StrategyV1`. Each method does the real jaxdist equivalent of what
TF does; the ones TF deprecates warn (`deprecated`) with a `DeprecationWarning`
that names the modern replacement. The logical-device annotations of TPU model
parallelism are here too (their checks in `jaxdist._strategy.logical_devices`).

The TF1 methods that take or make input (``experimental_run``,
``make_dataset_iterator``, ``experimental_distribute_datasets_from_function``,
``experimental_make_numpy_dataset``) live in the input wing, in
`jaxdist._strategy.tf1_input`, as `StrategyV1`'s base class `InputMethodsV1` (with
`deprecated`); this module keeps the renamed TF2 methods, TF1's session
configuration and cluster, and the logical-device annotations.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

import jax

from jaxdist._base.devices import Replicas
from jaxdist._cluster.config import cluster_resolver_for
from jaxdist._cluster.join import is_single_worker, join_cluster
from jaxdist._collective.all_reduce import NcclAllReduce
from jaxdist._strategy import logical_devices as _logical_devices
from jaxdist._strategy.extended import StrategyExtended
from jaxdist._strategy.tf1_input import InputMethodsV1, deprecated


class StrategyV1(InputMethodsV1):
    """`Strategy` plus the TF1-era methods of the seed's `MirroredStrategy` listing.

    As TF layers ``StrategyV1`` over ``Strategy``, jaxdist's strategies derive
    from this class.

    They are the real equivalents of TF's methods: `experimental_run` and
    `experimental_run_v2` run a step like `run`, `unwrap` is
    `experimental_local_results`, `group` waits for values to be computed,
    `colocate_vars_with` places the values the strategy creates, and
    `configure`/`update_config_proto` handle TF1's session configuration.

    >>> import jaxdist as jd
    >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    >>> isinstance(s, jd.StrategyV1) and isinstance(s, jd.Strategy)
    True
    """

    @deprecated("run")
    def experimental_run_v2(
        self,
        fn: Callable,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        options: Any = None,
    ) -> Any:
        """The same as `run` (its name in TF 2.0 and 2.1).

        Deprecated (renamed in TF 2.2): use `run`.

        >>> import warnings, jax.numpy as jnp, jaxdist as jd
        >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore", DeprecationWarning)
        ...     out = s.experimental_run_v2(lambda x: x + 1.0, args=(jnp.zeros(()),))
        >>> [float(x) for x in s.experimental_local_results(out)]
        [1.0, 1.0]

        Args:
            fn: the step function.
            args: positional arguments.
            kwargs: keyword arguments.
            options: an optional `RunOptions`.
        """
        return self.run(fn, args, kwargs, options)

    @deprecated("experimental_local_results")
    def unwrap(self, value: Any) -> tuple:
        """The local replicas' components of ``value`` as a tuple; ``(value,)`` if plain.

        Deprecated (TF 1.x): use `experimental_local_results`, which this is.

        >>> import warnings, jaxdist as jd
        >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
        >>> v = s.experimental_distribute_values_from_function(
        ...     lambda ctx: ctx.replica_id_in_sync_group)
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore", DeprecationWarning)
        ...     print([int(x) for x in s.unwrap(v)], s.unwrap(4))
        [0, 1] (4,)

        Args:
            value: a distributed value (e.g. a `run` result), a structure of them, or
                a plain value.
        """
        return self.experimental_local_results(value)

    @deprecated("jax.block_until_ready(value)")
    def group(self, value: Any, name: str | None = None) -> None:
        """Waits until every array in ``value`` is computed on every device; returns None.

        Deprecated (TF 1.x, where it grouped the ops computing ``value``'s
        components into one op to run): JAX dispatches asynchronously, so the
        equivalent is waiting for the arrays: use `jax.block_until_ready`.
        ``value`` is any structure of arrays and distributed values. Inside a
        traced function there is nothing to wait for and it does nothing.

        >>> import warnings, jax.numpy as jnp, jaxdist as jd
        >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
        >>> out = s.run(lambda: jnp.ones(3))
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore", DeprecationWarning)
        ...     print(s.group({"out": out, "step": 1}))
        None

        Args:
            value: a structure whose leaves are arrays, distributed values or other
                Python objects (ignored).
            name: TF's op name; accepted (a str or None) and unused.

        Raises:
            TypeError: when ``name`` is neither a str nor None.
        """
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a str or None; got {type(name).__name__}.")
        leaves = jax.tree.leaves(value)
        if any(isinstance(x, jax.core.Tracer) for x in leaves):
            return None
        jax.block_until_ready([x for x in leaves if isinstance(x, jax.Array)])
        return None

    @deprecated("strategy.extended.colocate_vars_with")
    def colocate_vars_with(self, colocate_with_variable: Any) -> contextlib.AbstractContextManager:
        """A context placing the values the strategy creates on the given value's devices.

        Deprecated (TF 1.x): use ``strategy.extended.colocate_vars_with``.

        Inside the ``with`` block, `experimental_distribute_values_from_function`
        places replica ``i``'s value on the device of the given value's component
        ``i``, and `extended.broadcast_to` without ``destinations`` copies to
        those devices. The previous placement is restored on exit, also on error.

        >>> import warnings, jaxdist as jd
        >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
        >>> other = jd.MirroredStrategy(["/cpu:3", "/cpu:2"])
        >>> anchor = other.experimental_distribute_values_from_function(lambda ctx: 0.0)
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore", DeprecationWarning)
        ...     with s.colocate_vars_with(anchor):
        ...         v = s.experimental_distribute_values_from_function(lambda ctx: 1.0)
        >>> [x.devices().pop().id for x in v.values]
        [3, 2]

        Args:
            colocate_with_variable: a `DistributedValues` (`PerReplica`/`Mirrored`)
                or a `jax.Array` with one component on its own device per replica.

        Raises:
            TypeError: when the argument is neither a `DistributedValues` nor a `jax.Array`.
            ValueError: when it does not have one component per replica on distinct devices.
        """
        return self.extended.colocate_vars_with(colocate_with_variable)

    @deprecated("update_config_proto / MultiWorkerMirroredStrategy")
    def configure(
        self,
        session_config: Mapping[str, Any] | None = None,
        cluster_spec: Any = None,
        task_type: str | None = None,
        task_id: int | None = None,
    ) -> None:
        """TF1's strategy configuration; without a cluster spec a no-op that returns None.

        Deprecated (TF 1.x): use `update_config_proto` for the session config, and
        `MultiWorkerMirroredStrategy` with a cluster resolver for a cluster.

        A mutable ``session_config`` mapping is updated in place as
        `update_config_proto` would (TF copies the updated proto into it). A
        ``cluster_spec`` (a dict of job name to task addresses, or an object with
        ``as_dict()`` such as a `ClusterSpec`) with this process's ``task_type``
        and ``task_id`` is validated and becomes ``strategy.cluster_resolver`` (a
        `SimpleClusterResolver`). Then it takes the path of
        `MultiWorkerMirroredStrategy`: with several chief/worker tasks, a
        `SimpleClusterResolver` of them initializes `jax.distributed` (with the
        same fault guard; call it before any JAX computation, and note that
        creating the strategy already resolves devices, so use device objects or
        strings only) and the strategy's replicas become the devices of every
        worker, with `NcclAllReduce` collectives across them. A one-task cluster
        changes nothing but the stored config.

        >>> import warnings, jaxdist as jd
        >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
        >>> config = {"allow_soft_placement": True}
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore", DeprecationWarning)
        ...     print(s.configure(session_config=config))
        ...     s.configure(cluster_spec={"worker": ["localhost:2222"]},
        ...                 task_type="worker", task_id=0)
        None
        >>> r = s.cluster_resolver
        >>> config["isolate_session_state"], r.cluster_spec().as_dict(), r.task_type, r.task_id
        (True, {'worker': ['localhost:2222']}, 'worker', 0)
        >>> s.num_replicas_in_sync
        2

        Args:
            session_config: a session-config mapping, or None.
            cluster_spec: None, a dict ``{job: [addresses]}`` (or ``{job: {index:
                address}}``), or an object with ``as_dict()``.
            task_type: this process's job in ``cluster_spec``.
            task_id: this process's index in that job.

        Raises:
            TypeError: on arguments of the wrong type.
            ValueError: when the cluster spec is malformed or does not contain the task.
            RuntimeError: a multi-task cluster after JAX already ran a computation.
        """
        if session_config is not None:
            if not isinstance(session_config, Mapping):
                raise TypeError(
                    "session_config must be a dict (jaxdist's stand-in for tf.ConfigProto) or "
                    f"None; got {type(session_config).__name__}."
                )
            if isinstance(session_config, MutableMapping):
                session_config.update(_updated_config(session_config))
        resolver = cluster_resolver_for(cluster_spec, task_type, task_id)
        if resolver is None:
            return None  # TF: no (or an empty) cluster spec configures nothing.
        if not is_single_worker(resolver):
            devices, _ = join_cluster(resolver)
            self._extended = StrategyExtended(self, Replicas.of(devices), NcclAllReduce())
        self._cluster_resolver = resolver
        return None

    @deprecated("nothing (TF 2 and jaxdist have no session config)")
    def update_config_proto(self, config_proto: Mapping[str, Any]) -> dict[str, Any]:
        """A new config dict: ``config_proto``'s entries plus ``isolate_session_state=True``.

        Deprecated (TF 1.x; jaxdist has no sessions or ConfigProto): nothing
        replaces it in TF 2 or jaxdist. As TF does with its proto, the input is
        deep-copied and left untouched.

        >>> import warnings, jaxdist as jd
        >>> s = jd.MirroredStrategy(["/cpu:0"])
        >>> config = {"allow_soft_placement": True}
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore", DeprecationWarning)
        ...     new = s.update_config_proto(config)
        >>> new
        {'allow_soft_placement': True, 'isolate_session_state': True}
        >>> config
        {'allow_soft_placement': True}

        Args:
            config_proto: a dict (any `Mapping`) standing in for ``tf.ConfigProto``.

        Raises:
            TypeError: when ``config_proto`` is not a mapping.
        """
        if not isinstance(config_proto, Mapping):
            raise TypeError(
                "config_proto must be a dict or another Mapping (jaxdist's stand-in for "
                f"tf.ConfigProto); got {type(config_proto).__name__}."
            )
        return _updated_config(config_proto)

    @property
    def cluster_resolver(self) -> Any:
        """The cluster resolver: set by `configure` with a cluster spec (else None)."""
        return getattr(self, "_cluster_resolver", None)

    def experimental_assign_to_logical_device(self, tensor: Any, logical_device_id: int) -> Any:
        """Annotates ``tensor`` to be computed on logical device ``logical_device_id``.

        TPUStrategy's model parallelism splits a replica over several logical
        devices. A jaxdist replica has exactly one, so id 0 returns ``tensor``
        unchanged and any other id raises TF's `ValueError`, in `run` (traced) as
        outside it. Not deprecated; for model parallelism in JAX shard inside a
        replica with `jax.sharding` instead.

        >>> import jax.numpy as jnp, jaxdist as jd
        >>> s = jd.OneDeviceStrategy("/cpu:0")
        >>> s.experimental_assign_to_logical_device(jnp.ones(2), 0).tolist()
        [1.0, 1.0]
        >>> s.experimental_assign_to_logical_device(jnp.ones(2), 1)
        Traceback (most recent call last):
        ValueError: `logical_core_id` to assign must be lower than total number of logical ...

        Args:
            tensor: an array, or a distributed value.
            logical_device_id: the logical device's id within the replica.

        Raises:
            TypeError: when ``logical_device_id`` is not an int or ``tensor`` not an array.
            ValueError: when ``logical_device_id`` is not 0.
        """
        _logical_devices.check_assign(tensor, logical_device_id)
        return tensor

    def experimental_replicate_to_logical_devices(self, tensor: Any) -> Any:
        """Annotates ``tensor`` to be replicated to every logical device of its replica.

        A jaxdist replica has exactly one logical device, so this returns
        ``tensor`` unchanged (after checking it is an array or distributed value).
        Not deprecated; for model parallelism in JAX use `jax.sharding`.

        >>> import jax.numpy as jnp, jaxdist as jd
        >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
        >>> out = s.run(lambda: s.experimental_replicate_to_logical_devices(jnp.ones(2)))
        >>> [x.tolist() for x in s.experimental_local_results(out)]
        [[1.0, 1.0], [1.0, 1.0]]

        Args:
            tensor: an array, or a distributed value.

        Raises:
            TypeError: when ``tensor`` is not an array or a distributed value.
        """
        _logical_devices.component_shapes(tensor, "experimental_replicate_to_logical_devices")
        return tensor

    def experimental_split_to_logical_devices(
        self, tensor: Any, partition_dimensions: Sequence[int]
    ) -> Any:
        """Annotates ``tensor`` to be split over its replica's logical devices.

        ``partition_dimensions`` has one entry per dimension of ``tensor``: how
        many ways to split it. Their product must equal the number of logical
        devices per replica, which is 1 in jaxdist: all ones returns ``tensor``
        unchanged; anything else raises TF's `ValueError` with the numbers, in
        `run` (traced; shapes are static) as outside it. Not deprecated; for
        model parallelism in JAX use `jax.sharding`.

        >>> import jax.numpy as jnp, jaxdist as jd
        >>> s = jd.OneDeviceStrategy("/cpu:0")
        >>> s.experimental_split_to_logical_devices(jnp.ones((2, 2)), [1, 1]).shape
        (2, 2)
        >>> s.experimental_split_to_logical_devices(jnp.ones((2, 2)), [2, 1])
        Traceback (most recent call last):
        ValueError: The product of `partition_dimensions` should be the same as the number of ...

        Args:
            tensor: an array, or a distributed value (each component is checked).
            partition_dimensions: a list of ints, one per dimension of ``tensor``.

        Raises:
            TypeError: when ``partition_dimensions`` is not a list of ints.
            ValueError: when its length is not ``tensor``'s rank, a value is not
                positive or does not divide its dimension, or its product is not 1.
        """
        _logical_devices.check_partition_dimensions(tensor, partition_dimensions)
        return tensor


def _updated_config(config: Mapping[str, Any]) -> dict[str, Any]:
    updated = copy.deepcopy(dict(config))
    updated["isolate_session_state"] = True
    return updated
