"""`MultiWorkerMirroredStrategy`: synchronous data parallelism over several JAX processes."""

from __future__ import annotations

from jaxdist._base.devices import Replicas
from jaxdist._base.options import CommunicationOptions
from jaxdist._base.validate import check_optional
from jaxdist._cluster.host import maybe_tune
from jaxdist._cluster.join import join_cluster
from jaxdist._cluster.resolvers import ClusterResolver, TFConfigClusterResolver
from jaxdist._collective.all_reduce import NcclAllReduce
from jaxdist._strategy.compat import StrategyV1
from jaxdist._strategy.extended import MULTI_WORKER, StrategyExtended


class MultiWorkerMirroredStrategy(StrategyV1):
    """Synchronous data parallelism over the devices of several workers (JAX processes).

    Start the same program once per worker, each with its own ``TF_CONFIG`` (or
    ``cluster_resolver``). The constructor calls `jax.distributed.initialize`: the
    coordinator is the chief task (or worker 0), process ids are the chief then
    the workers by index; CPU collectives use gloo. Create the strategy before any
    other JAX computation in the program. It then behaves like `MirroredStrategy`
    over every worker's devices: ``num_replicas_in_sync`` counts all of them, `run`
    feeds this worker's replicas and its collectives span the workers, `reduce` and
    `gather` return the same result on every worker, and
    `experimental_local_results` gives this worker's replicas. Every worker must
    make the same strategy calls in the same order (SPMD), as in TF.

    Without a cluster (TF_CONFIG unset, one task, or an evaluator task) it is a
    single worker over the local devices, and jax.distributed is not started:

    >>> import os, jaxdist as jd
    >>> _ = os.environ.pop("TF_CONFIG", None)
    >>> s = jd.MultiWorkerMirroredStrategy()
    >>> s.num_replicas_in_sync == len(s.extended.worker_devices)
    True
    >>> s.cluster_resolver.cluster_spec().as_dict()
    {}

    Faults: ``communication_options.timeout_seconds`` (default 300) bounds the
    cluster's formation and is the heartbeat timeout that detects a dead worker.
    When a task never starts or dies, the other tasks print
    ``jaxdist: task <job:index> ...: task(s) [...] ...`` naming it on stderr and
    exit with status 75 (`os._exit`) within about ``timeout_seconds + 1`` s,
    where jax would otherwise abort (SIGABRT) without naming it or hang. If the
    coordinator dies while a worker is idle, jaxlib aborts that worker at once.

    Args:
        cluster_resolver: a `jaxdist.cluster_resolver.ClusterResolver`; None: a
            `TFConfigClusterResolver` (reads ``TF_CONFIG``).
        communication_options: an `experimental.CommunicationOptions`.

    Raises:
        ValueError: an invalid TF_CONFIG or cluster (e.g. a ``ps`` job).
        RuntimeError: JAX already ran a computation in this process.
    """

    def __init__(
        self,
        cluster_resolver: ClusterResolver | None = None,
        communication_options: CommunicationOptions | None = None,
    ) -> None:
        resolver_kind = (
            "a jaxdist.cluster_resolver.ClusterResolver (e.g. TFConfigClusterResolver())"
        )
        check_optional(cluster_resolver, ClusterResolver, "cluster_resolver", resolver_kind)
        options_kind = "a jaxdist.experimental.CommunicationOptions"
        check_optional(
            communication_options, CommunicationOptions, "communication_options", options_kind
        )
        cluster_resolver = cluster_resolver or TFConfigClusterResolver()
        communication_options = communication_options or CommunicationOptions()
        self._cluster_resolver = cluster_resolver
        self._communication_options = communication_options
        devices, is_chief = join_cluster(cluster_resolver, communication_options)
        replicas = Replicas.of(devices)
        super().__init__(StrategyExtended(self, replicas, NcclAllReduce(), MULTI_WORKER, is_chief))
        maybe_tune(devices)

    @property
    def cluster_resolver(self) -> ClusterResolver:
        """The cluster resolver: ``task_type``, ``task_id``, ``cluster_spec()``."""
        return self._cluster_resolver
