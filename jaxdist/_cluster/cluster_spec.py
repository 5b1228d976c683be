"""`ClusterSpec`: a cluster as a set of tasks grouped into jobs, as ``tf.train.ClusterSpec``.

Apart from the resolvers (`jaxdist._cluster.resolvers`), which say which cluster a process
belongs to: a spec is only the description (job names, task indices, addresses) and its
checks, shared by every resolver and by `UnionClusterResolver`'s merge. Also the error
helper and the task-index parsing the resolvers use on their own arguments.

>>> ClusterSpec({"worker": ["h0:2222"]}).job_tasks("worker")
['h0:2222']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Union

__all__ = ["ClusterSpec"]

ClusterLike = Union["ClusterSpec", Mapping[str, Any]]


def invalid(name: str, expected: str, got: Any) -> ValueError:
    """The error for argument ``name``, which should have been ``expected`` but was ``got``."""
    return ValueError(f"{name} must be {expected}; got {got!r}.")


def parse_index(value: Any, what: str) -> int:
    """Converts a task index (an int, or a digit string as JSON keys are) to an int."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise invalid(what, "a non-negative integer", value)
    try:
        index = int(value)
    except ValueError:
        raise invalid(what, "a non-negative integer", value) from None
    if index < 0:
        raise invalid(what, "a non-negative integer", index)
    return index


def _job_tasks_from(job: str, tasks: Any) -> dict[int, str]:
    """Normalizes one job's tasks (an address list or an index->address dict) to a dict."""
    if isinstance(tasks, Mapping):
        items = [(parse_index(i, f"task index {i!r} of job {job!r}"), a) for i, a in tasks.items()]
    elif isinstance(tasks, Sequence) and not isinstance(tasks, (str, bytes)):
        items = list(enumerate(tasks))
    else:
        expected = "a list of 'host:port' addresses or a dict from task index to address"
        raise invalid(f"cluster[{job!r}]", expected, tasks)
    for i, address in items:
        if not isinstance(address, str) or not address:
            raise invalid(
                f"the address of task {i} of job {job!r}", "a 'host:port' string", address
            )
    return dict(sorted(items))


class ClusterSpec:
    """A cluster as a set of tasks organized into jobs, as ``tf.train.ClusterSpec``.

    Args:
        cluster: a dict mapping job names to either a list of ``"host:port"`` addresses (task
            ``i`` is entry ``i``) or a dict from task index to address (a sparse job); or
            another `ClusterSpec`.

    Raises:
        ValueError: if ``cluster`` is not of that form.

    >>> spec = ClusterSpec({"worker": ["h0:2222", "h1:2222"], "chief": ["c0:2222"]})
    >>> spec.jobs
    ['worker', 'chief']
    >>> spec.num_tasks("worker"), spec.task_address("worker", 1)
    (2, 'h1:2222')
    >>> ClusterSpec({"worker": {1: "h1:2222"}}).as_dict()
    {'worker': {1: 'h1:2222'}}
    >>> bool(ClusterSpec({}))
    False
    """

    def __init__(self, cluster: ClusterLike) -> None:
        if isinstance(cluster, ClusterSpec):
            cluster = cluster.as_dict()
        if not isinstance(cluster, Mapping):
            expected = (
                "a dict mapping job names to lists of 'host:port' addresses, or a ClusterSpec"
            )
            raise invalid("cluster", expected, cluster)
        self._spec: dict[str, dict[int, str]] = {}
        for job, tasks in cluster.items():
            if not isinstance(job, str) or not job:
                raise invalid("a cluster job name", "a non-empty string", job)
            self._spec[job] = _job_tasks_from(job, tasks)

    def __bool__(self) -> bool:
        return bool(self._spec)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            try:
                other = ClusterSpec(other)
            except ValueError:
                return False
        if not isinstance(other, ClusterSpec):
            return NotImplemented
        return self._spec == other._spec

    __hash__ = None  # type: ignore[assignment]  # compares like a dict, so unhashable like one

    def __repr__(self) -> str:
        d = self.as_dict()
        return "ClusterSpec({" + ", ".join(f"{k!r}: {d[k]!r}" for k in sorted(d)) + "})"

    def as_dict(self) -> dict[str, list[str] | dict[int, str]]:
        """Returns job name -> address list (dense jobs) or index->address dict (sparse jobs)."""
        out: dict[str, list[str] | dict[int, str]] = {}
        for job, tasks in self._spec.items():
            dense = bool(tasks) and max(tasks) + 1 == len(tasks)
            out[job] = list(tasks.values()) if dense else dict(tasks)
        return out

    @property
    def jobs(self) -> list[str]:
        """The job names in this cluster, in the order they were given."""
        return list(self._spec)

    def _job(self, job_name: str) -> dict[int, str]:
        try:
            return self._spec[job_name]
        except (KeyError, TypeError):
            raise invalid(
                "job_name", f"a job of the cluster, one of {self.jobs}", job_name
            ) from None

    def num_tasks(self, job_name: str) -> int:
        """Returns the number of tasks defined in job ``job_name``."""
        return len(self._job(job_name))

    def task_indices(self, job_name: str) -> list[int]:
        """Returns the sorted task indices defined in job ``job_name``."""
        return list(self._job(job_name))

    def task_address(self, job_name: str, task_index: int) -> str:
        """Returns the address of task ``task_index`` of job ``job_name``."""
        job = self._job(job_name)
        if task_index not in job:
            raise invalid(
                "task_index", f"a task index of job {job_name!r}: {list(job)}", task_index
            )
        return job[task_index]

    def job_tasks(self, job_name: str) -> list[str | None]:
        """Returns the job's addresses ordered by task index; ``None`` fills sparse gaps."""
        job = self._job(job_name)
        out: list[str | None] = [None] * (max(job) + 1 if job else 0)
        for i, address in job.items():
            out[i] = address
        return out
