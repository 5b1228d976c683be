"""Cluster discovery for multi-worker jaxdist.

Mirrors ``tf.distribute.cluster_resolver``: a cluster (a `ClusterSpec`, described in
`jaxdist._cluster.cluster_spec`) is a set of *tasks* grouped into *jobs* (``"chief"``,
``"worker"``), and a resolver tells a process which cluster it belongs to and which task it is.
`jax_distributed_args` turns that into the arguments of ``jax.distributed.initialize``. Nothing
in this module starts the JAX backend.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from jaxdist._base.jax_internals import backends_started
from jaxdist._cluster.cluster_spec import ClusterLike, ClusterSpec, invalid, parse_index

__all__ = ["ClusterResolver", "SimpleClusterResolver", "TFConfigClusterResolver"]

_TF_CONFIG_ENV = "TF_CONFIG"
# Jobs whose tasks become JAX processes, in process-id order.
COLLECTIVE_JOBS = ("chief", "worker")
# Jobs that may appear in a cluster but never join the JAX collective.
SIDECAR_JOBS = ("evaluator",)


def format_master(address: str, rpc_layer: str | None) -> str:
    return f"{rpc_layer}://{address}" if rpc_layer else address


def _local_accelerator_counts() -> dict[str, int]:
    """Counts this process's non-CPU JAX devices by type, without starting the JAX backend.

    Returns ``{}`` while the backend is not started: starting it before
    ``jax.distributed.initialize`` would make that call fail.
    """
    import jax

    if not backends_started():  # private JAX API: the only way to ask without starting it
        return {}

    counts: dict[str, int] = {}
    for device in jax.local_devices():
        kind = "GPU" if device.platform in ("gpu", "cuda", "rocm") else device.platform.upper()
        if kind != "CPU":
            counts[kind] = counts.get(kind, 0) + 1
    return counts


class ClusterResolver:
    """Base class of cluster resolvers: tells a process its cluster and its own task in it.

    Subclasses implement `cluster_spec` and `master`; ``task_type``, ``task_id`` and
    ``rpc_layer`` are plain attributes (``None`` unless set).

    >>> r = ClusterResolver()
    >>> r.task_type, r.task_id, r.environment, r.num_accelerators()
    (None, None, '', {})
    """

    task_type: str | None = None
    task_id: int | None = None
    rpc_layer: str | None = None

    def cluster_spec(self) -> ClusterSpec:
        """Returns the `ClusterSpec` of the cluster this process belongs to."""
        raise NotImplementedError(f"{type(self).__name__} must implement cluster_spec().")

    def master(
        self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None
    ) -> str:
        """Returns the address of the given task (or of the session master)."""
        raise NotImplementedError(f"{type(self).__name__} must implement master().")

    def num_accelerators(
        self, task_type: str | None = None, task_id: int | None = None, config_proto: Any = None
    ) -> dict[str, int]:
        """Returns ``{device_type: count}`` of this process's accelerators; ``{}`` on CPU."""
        del task_type, task_id, config_proto
        return _local_accelerator_counts()

    @property
    def environment(self) -> str:
        """The environment the cluster runs in; ``""`` when unspecified."""
        return ""


class SimpleClusterResolver(ClusterResolver):
    """A `ClusterResolver` over a fixed, given cluster.

    >>> spec = ClusterSpec({"worker": ["h0:1", "h1:2"]})
    >>> r = SimpleClusterResolver(spec, task_type="worker", task_id=1, rpc_layer="grpc")
    >>> r.task_type, r.task_id, r.master("worker", 0)
    ('worker', 1, 'grpc://h0:1')
    >>> r.num_accelerators()
    {}
    """

    def __init__(
        self,
        cluster_spec: ClusterLike,
        master: str = "",
        task_type: str | None = None,
        task_id: int | None = None,
        environment: str = "",
        num_accelerators: dict[str, int] | None = None,
        rpc_layer: str | None = None,
    ) -> None:
        if not isinstance(master, str):
            raise invalid("master", "a string address", master)
        if num_accelerators is not None and not isinstance(num_accelerators, Mapping):
            raise invalid("num_accelerators", "a dict from device type to count", num_accelerators)
        self._cluster_spec = ClusterSpec(cluster_spec)
        self._master = master
        self.task_type = task_type
        self.task_id = None if task_id is None else parse_index(task_id, "task_id")
        self._environment = environment
        self._num_accelerators = None if num_accelerators is None else dict(num_accelerators)
        self.rpc_layer = rpc_layer

    def cluster_spec(self) -> ClusterSpec:
        return self._cluster_spec

    def master(
        self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None
    ) -> str:
        """Returns the given task's address if both are given, else the ``master`` given."""
        rpc_layer = rpc_layer if rpc_layer is not None else self.rpc_layer
        if task_type is not None and task_id is not None:
            return format_master(self._cluster_spec.task_address(task_type, task_id), rpc_layer)
        return format_master(self._master, rpc_layer) if self._master else ""

    def num_accelerators(
        self, task_type: str | None = None, task_id: int | None = None, config_proto: Any = None
    ) -> dict[str, int]:
        if self._num_accelerators is not None:
            return dict(self._num_accelerators)
        return super().num_accelerators(task_type, task_id, config_proto)

    @property
    def environment(self) -> str:
        return self._environment


def _load_tf_config() -> dict[str, Any]:
    """Parses ``$TF_CONFIG``; unset or blank gives ``{}``."""
    raw = os.environ.get(_TF_CONFIG_ENV, "")
    if not raw.strip():
        return {}
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"TF_CONFIG is not valid JSON ({e}); got {raw!r}.") from None
    if not isinstance(config, dict):
        raise invalid("TF_CONFIG", "a JSON object with 'cluster' and 'task' keys", raw)
    return config


def _check_task(spec: ClusterSpec, task_type: str | None, task_id: int | None) -> None:
    """Raises unless (task_type, task_id) names a task of the non-empty ``spec``."""
    if task_type is None or task_id is None:
        expected = "given, as {'type': <job>, 'index': <int>}, when there is a 'cluster'"
        raise invalid("TF_CONFIG 'task'", expected, {"type": task_type, "index": task_id})
    if task_type in SIDECAR_JOBS and task_type not in spec.jobs:
        return  # TF convention: the evaluator is usually not listed in the cluster.
    if task_type not in spec.jobs:
        raise invalid("TF_CONFIG task type", f"a job of the cluster, one of {spec.jobs}", task_type)
    if task_id not in spec.task_indices(task_type):
        indices = spec.task_indices(task_type)
        raise invalid(
            "TF_CONFIG task index", f"in range for job {task_type!r}, one of {indices}", task_id
        )


class TFConfigClusterResolver(ClusterResolver):
    """A `ClusterResolver` reading the ``TF_CONFIG`` environment variable, as in TF.

    ``TF_CONFIG`` is read and validated when the resolver is created; when it is unset the
    cluster is empty (a single process). The arguments override what it says.

    Raises:
        ValueError: if TF_CONFIG is not valid JSON, has a cluster but no task, or names a
            task type that is not a job of the cluster or a task index out of range.

    >>> import json, os
    >>> os.environ["TF_CONFIG"] = json.dumps({
    ...     "cluster": {"worker": ["localhost:12345", "localhost:23456"]},
    ...     "task": {"type": "worker", "index": 1}})
    >>> r = TFConfigClusterResolver()
    >>> r.task_type, r.task_id, r.cluster_spec().num_tasks("worker")
    ('worker', 1, 2)
    >>> del os.environ["TF_CONFIG"]
    >>> bool(TFConfigClusterResolver().cluster_spec())
    False
    """

    def __init__(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
        environment: str | None = None,
    ) -> None:
        config = _load_tf_config()
        self._cluster_spec = ClusterSpec(config.get("cluster") or {})
        task = config.get("task") or {}
        if not isinstance(task, dict):
            raise invalid("TF_CONFIG 'task'", "an object like {'type': 'worker', 'index': 0}", task)
        task_type = task_type if task_type is not None else task.get("type")
        self.task_type = None if task_type is None else str(task_type)
        raw_id = task_id if task_id is not None else task.get("index")
        self.task_id = None if raw_id is None else parse_index(raw_id, "TF_CONFIG task index")
        if self._cluster_spec:
            _check_task(self._cluster_spec, self.task_type, self.task_id)
        self.rpc_layer = rpc_layer if rpc_layer is not None else config.get("rpc_layer")
        self._environment = environment if environment is not None else config.get("environment")
        self._session_master = config.get("session_master")

    def cluster_spec(self) -> ClusterSpec:
        return self._cluster_spec

    def master(
        self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None
    ) -> str:
        """Returns the given (default: this process's) task's address; ``""`` if it is alone."""
        if self._session_master is not None:
            return self._session_master
        spec = self._cluster_spec
        if not spec or (len(spec.jobs) == 1 and spec.num_tasks(spec.jobs[0]) == 1):
            return ""
        task_type = task_type if task_type is not None else self.task_type
        task_id = task_id if task_id is not None else self.task_id
        rpc_layer = rpc_layer if rpc_layer is not None else self.rpc_layer
        if task_type is None or task_id is None:
            raise ValueError(
                "master() needs a task: pass task_type and task_id, or set them on the resolver "
                f"(got task_type={task_type!r}, task_id={task_id!r})."
            )
        return format_master(spec.task_address(task_type, task_id), rpc_layer)

    @property
    def environment(self) -> str | None:  # type: ignore[override]
        """TF_CONFIG's ``environment``; None when it has none (as TF's)."""
        return self._environment


def process_order(spec: ClusterSpec) -> list[tuple[str, int]]:
    """Returns the (job, task index) of every JAX process, in process-id order."""
    unsupported = [j for j in spec.jobs if j not in COLLECTIVE_JOBS + SIDECAR_JOBS]
    if unsupported:
        raise ValueError(
            f"jaxdist multi-worker supports only the jobs {list(COLLECTIVE_JOBS)} (plus an "
            f"'evaluator', which does not join); the cluster has unsupported jobs {unsupported} "
            "('ps' parameter servers are not supported)."
        )
    if "chief" in spec.jobs and spec.task_indices("chief") != [0]:
        raise invalid("cluster job 'chief'", "one task, of index 0", spec.as_dict()["chief"])
    order: list[tuple[str, int]] = []
    for job in (j for j in COLLECTIVE_JOBS if j in spec.jobs):
        indices = spec.task_indices(job)
        if indices != list(range(len(indices))):
            raise invalid(f"the task indices of job {job!r}", "dense (0..n-1)", indices)
        order.extend((job, i) for i in indices)
    if not order:
        raise invalid("the cluster", "to have 'chief' or 'worker' tasks", spec)
    return order


def jax_distributed_args(resolver: ClusterResolver) -> tuple[str, int, int]:
    """Maps a resolver to ``(coordinator_address, num_processes, process_id)``.

    The coordinator is the chief task if the cluster has a ``"chief"`` job, else worker 0;
    process ids are the chief first, then the workers by index.

    Raises:
        ValueError: if the cluster is empty or has unsupported jobs (e.g. ``"ps"``), or this
            process's task is unset or not a chief/worker task of the cluster.

    >>> r = SimpleClusterResolver({"chief": ["c:1"], "worker": ["w0:2"]}, "", "worker", 0)
    >>> jax_distributed_args(r)
    ('c:1', 2, 1)
    """
    spec = resolver.cluster_spec()
    if not spec:
        raise invalid("the cluster spec", "non-empty (jax.distributed is for multi-worker)", spec)
    order = process_order(spec)
    task = (resolver.task_type, resolver.task_id)
    if task not in order:
        expected = f"a chief/worker task of the cluster, one of {[f'{j}:{i}' for j, i in order]}"
        raise invalid("this process's (task_type, task_id)", expected, task)
    coordinator = spec.task_address(*order[0])
    coordinator = coordinator.split("://", 1)[-1]  # an address may carry a "grpc://" prefix
    return coordinator, len(order), order.index(task)
