"""TF1 ``configure``'s cluster: a validated cluster spec as a `SimpleClusterResolver`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxdist._base.validate import is_int
from jaxdist._cluster.resolvers import SimpleClusterResolver


def cluster_resolver_for(cluster_spec: Any, task_type: Any, task_id: Any) -> Any:
    """TF1 ``configure``'s cluster: a `SimpleClusterResolver`, or None for no cluster.

    Raises:
        TypeError: on arguments of the wrong type.
        ValueError: when the cluster spec is malformed or does not contain the task.
    """
    if cluster_spec is None:
        return None
    spec = _cluster_dict(cluster_spec)
    if not spec:
        return None
    if not isinstance(task_type, str) or not task_type:
        raise TypeError(
            f"task_type must be this process's job name in cluster_spec (a str, one of "
            f"{sorted(spec)}); got {task_type!r}."
        )
    if not is_int(task_id):
        raise TypeError(f"task_id must be an int (this task's index); got {task_id!r}.")
    if task_type not in spec:
        raise ValueError(
            f"task_type {task_type!r} is not a job of cluster_spec (jobs: {sorted(spec)})."
        )
    tasks = spec[task_type]
    indices = list(tasks) if isinstance(tasks, Mapping) else list(range(len(tasks)))
    if int(task_id) not in indices:
        raise ValueError(
            f"task_id {task_id} is not a task of job {task_type!r}, whose task indices are "
            f"{indices}."
        )
    return SimpleClusterResolver(spec, task_type=task_type, task_id=int(task_id))


def _cluster_dict(cluster_spec: Any) -> dict[str, Any]:
    """``cluster_spec`` as a new ``{job: [addresses] | {index: address}}`` dict."""
    if not isinstance(cluster_spec, Mapping):
        as_dict = getattr(cluster_spec, "as_dict", None)
        if not callable(as_dict):
            raise TypeError(
                "cluster_spec must be a dict mapping job names to task addresses, or an object "
                f"with as_dict() (a ClusterSpec); got {type(cluster_spec).__name__}."
            )
        cluster_spec = as_dict()
        if not isinstance(cluster_spec, Mapping):
            raise TypeError(
                f"cluster_spec.as_dict() must return a dict; got {type(cluster_spec).__name__}."
            )
    spec: dict[str, Any] = {}
    for job, tasks in cluster_spec.items():
        if not isinstance(job, str) or not job:
            raise ValueError(f"cluster_spec job names must be non-empty strings; got {job!r}.")
        if isinstance(tasks, Mapping):
            ok = all(is_int(i) and i >= 0 and isinstance(a, str) for i, a in tasks.items())
            tasks = {int(i): a for i, a in tasks.items()}
        elif isinstance(tasks, (list, tuple)):
            ok = all(isinstance(a, str) for a in tasks)
            tasks = list(tasks)
        else:
            ok = False
        if not ok:
            raise ValueError(
                f"cluster_spec[{job!r}] must be a list of 'host:port' addresses or a dict from "
                f"task index to address; got {tasks!r}."
            )
        spec[job] = tasks
    return spec
