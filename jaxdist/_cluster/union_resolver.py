"""`UnionClusterResolver`: one cluster made of the clusters of several resolvers, as in TF.

TF exports the class as ``tf.distribute.cluster_resolver.UnionResolver`` (its ``__name__`` is
``UnionClusterResolver``); jaxdist provides both names for the same class.
"""

from __future__ import annotations

from typing import Any

from jaxdist._cluster.cluster_spec import ClusterSpec, invalid, parse_index
from jaxdist._cluster.resolvers import ClusterResolver, format_master

__all__ = ["UnionClusterResolver", "UnionResolver"]


def _merge_specs(specs: list[ClusterSpec]) -> ClusterSpec:
    """Merges cluster specs job by job, as TF's ``UnionClusterResolver.cluster_spec``.

    A job whose tasks are address lists in every spec gets the lists concatenated in order
    (duplicates kept). A job that is sparse (an index->address dict) in any spec is merged by
    task index, lists counting as ``{0: ..., 1: ...}``; an index given twice raises.
    """
    dicts = [spec.as_dict() for spec in specs]
    sparse = {job for d in dicts for job, tasks in d.items() if isinstance(tasks, dict)}
    merged: dict[str, Any] = {}
    for d in dicts:
        for job, tasks in d.items():
            if job not in sparse:
                merged.setdefault(job, []).extend(tasks)
                continue
            new = dict(enumerate(tasks)) if isinstance(tasks, list) else dict(tasks)
            done = merged.setdefault(job, {})
            clash = sorted(set(new) & set(done))
            if clash:
                keys = "{" + ", ".join(map(str, clash)) + "}"
                raise KeyError(f"Duplicate keys detected when merging two ClusterSpecs: {keys}")
            done.update(new)
    return ClusterSpec(merged)


def _check_optional(name: str, value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise invalid(name, "a string or None", value)
    return value


class UnionClusterResolver(ClusterResolver):
    """A `ClusterResolver` whose cluster is the union of other resolvers' clusters.

    As TF's ``UnionResolver``: `cluster_spec` merges the resolvers' clusters (lists of the same
    job are concatenated, duplicates included; sparse jobs are merged by task index). This
    process's task, ``rpc_layer``, `environment` and `num_accelerators` come from the first
    resolver, unless ``task_type``/``task_id``/``rpc_layer`` are given here or set on the union
    (which stores them on itself and leaves the resolvers untouched).

    Like TF, an unset value is any falsy one: a ``task_id`` of 0 (or a ``task_type`` or
    ``rpc_layer`` of ``""``) given to or set on the union reads back as the first resolver's.
    This is a TF bug kept for compatibility; give the first resolver the task instead.

    Args:
        *cluster_resolvers: the `ClusterResolver` instances to combine, at least one.
        task_type: this process's job, overriding the first resolver's.
        task_id: this process's task index, overriding the first resolver's (unless 0).
        rpc_layer: the protocol prefixed by ``master(task_type, task_id)``.

    Raises:
        ValueError: with no resolver, an unknown keyword argument or a bad ``task_id``.
        TypeError: if an argument is not a `ClusterResolver`.

    >>> from jaxdist.cluster_resolver import SimpleClusterResolver
    >>> workers = SimpleClusterResolver({"worker": ["a:1", "b:2"]}, task_type="worker", task_id=1)
    >>> chief = SimpleClusterResolver({"chief": ["c:0"]}, task_type="chief", task_id=0)
    >>> u = UnionClusterResolver(workers, chief)
    >>> u.cluster_spec().as_dict()
    {'worker': ['a:1', 'b:2'], 'chief': ['c:0']}
    >>> u.task_type, u.task_id, u.master("chief", 0), u.master("worker", 1, rpc_layer="grpc")
    ('worker', 1, 'c:0', 'grpc://b:2')
    >>> u.task_id = 0  # TF treats 0 as unset: the first resolver's id shows through
    >>> u.task_id
    1
    >>> UnionResolver is UnionClusterResolver
    True
    """

    def __init__(
        self,
        *cluster_resolvers: ClusterResolver,
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
        **kwargs: Any,
    ) -> None:
        if kwargs:
            raise ValueError(f"Unexpected kwargs provided {kwargs!r}")
        if not cluster_resolvers:
            raise ValueError("At least one ClusterResolver is required.")
        for resolver in cluster_resolvers:
            if not isinstance(resolver, ClusterResolver):
                raise TypeError("All arguments must be a sub-class of `ClusterResolver.`")
        self._resolvers = tuple(cluster_resolvers)
        self.task_type = task_type
        self.task_id = task_id
        self.rpc_layer = rpc_layer

    @property
    def task_type(self) -> str | None:
        """This process's job: the union's own if set (non-empty), else the first resolver's."""
        return self._task_type or self._resolvers[0].task_type

    @task_type.setter
    def task_type(self, task_type: str | None) -> None:
        self._task_type = _check_optional("task_type", task_type)

    @property
    def task_id(self) -> int | None:
        """This process's task index: the union's own if set and non-zero, else the first's."""
        return self._task_id or self._resolvers[0].task_id

    @task_id.setter
    def task_id(self, task_id: int | None) -> None:
        self._task_id = None if task_id is None else parse_index(task_id, "task_id")

    @property
    def rpc_layer(self) -> str | None:
        """The union's own ``rpc_layer`` if set (non-empty), else the first resolver's."""
        return self._rpc_layer or self._resolvers[0].rpc_layer

    @rpc_layer.setter
    def rpc_layer(self, rpc_layer: str | None) -> None:
        self._rpc_layer = _check_optional("rpc_layer", rpc_layer)

    def cluster_spec(self) -> ClusterSpec:
        """Returns the merged cluster of all the resolvers (asked again on every call).

        Raises:
            KeyError: if a sparse job gets the same task index from two resolvers.
        """
        return _merge_specs([r.cluster_spec() for r in self._resolvers])

    def master(
        self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None
    ) -> str:
        """Returns a task's address in the merged cluster, or the first resolver's master.

        With both ``task_type`` and ``task_id``, the address is prefixed with ``rpc_layer`` or
        the union's *own* ``rpc_layer`` only (not the first resolver's, as in TF). Otherwise
        this is ``first_resolver.master(rpc_layer=rpc_layer)``.

        Raises:
            ValueError: if the merged cluster has no such job or task.
        """
        if task_type is None or task_id is None:
            return self._resolvers[0].master(rpc_layer=rpc_layer)
        spec = self.cluster_spec()
        if task_type not in spec.jobs:
            raise ValueError(f"No such job in cluster: {task_type!r}")
        if task_id not in spec.task_indices(task_type):
            raise ValueError(f"No task with index {task_id!r} in job {task_type!r}")
        return format_master(spec.task_address(task_type, task_id), rpc_layer or self._rpc_layer)

    def num_accelerators(
        self, task_type: str | None = None, task_id: int | None = None, config_proto: Any = None
    ) -> dict[str, int]:
        """Returns the first resolver's answer (TF does not sum over resolvers)."""
        return self._resolvers[0].num_accelerators(task_type, task_id, config_proto)

    @property
    def environment(self) -> str | None:  # type: ignore[override]
        """The first resolver's environment."""
        return self._resolvers[0].environment


UnionResolver = UnionClusterResolver
