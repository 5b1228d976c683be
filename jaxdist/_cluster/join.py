"""Joining a multi-worker cluster with `jax.distributed`, and failing clearly when it cannot.

`join` maps a cluster resolver to ``jax.distributed.initialize`` (coordinator: the chief,
or worker 0). In jaxlib every fatal multi-worker failure is a C++ abort (SIGABRT) with a
message that does not name the task, so an init watchdog thread names a missing task: when
the cluster has not formed after ``timeout_seconds`` (a task never started), it names the
missing task(s) on stderr and ends the process with ``os._exit(75)`` (jax's own abort would
come ~5 s after its longer init timeout). Each non-coordinator task listens on its own
TF_CONFIG address while it waits, so that the others can tell a started task from a missing
one. Once the cluster has formed, `jaxdist._cluster.guard` watches it. `join_cluster` also
checks that every worker brings the same number of devices. The one failure that cannot be
caught in-process is the coordinator dying while this task is idle: jaxlib aborts within
~0.2 s ("the leader task was preempted/died"). `exchange` is a small all-gather of ints
on the hosts, through the coordination service's key-value store (private JAX API, read in
`jaxdist._base.jax_internals`).
"""

from __future__ import annotations

import math
import socket
import threading
import time
from typing import Any

import jax

from jaxdist._base import inflight as _inflight
from jaxdist._base.jax_internals import backends_started, coordination_client
from jaxdist._base.options import CommunicationOptions
from jaxdist._cluster import guard as _cluster_guard
from jaxdist._cluster.guard import die
from jaxdist._cluster.resolvers import (
    SIDECAR_JOBS,
    ClusterResolver,
    jax_distributed_args,
    process_order,
)

DEFAULT_TIMEOUT_S = 300.0
"""``timeout_seconds`` when `CommunicationOptions` leaves it None (jax's init default)."""

_state: dict[str, Any] = {"joined": None}


def is_single_worker(resolver: Any) -> bool:
    """True when ``resolver`` describes no cluster, one task, or a sidecar task (evaluator)."""
    spec = resolver.cluster_spec()
    if not spec or resolver.task_type in SIDECAR_JOBS:
        return True
    return len(process_order(spec)) == 1


def _split(address: str) -> tuple[str, int] | None:
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    try:
        return host.strip("[]") or "127.0.0.1", int(port)
    except ValueError:
        return None


def _reachable(address: str) -> bool:
    where = _split(address)
    if where is None:
        return True  # cannot tell: do not accuse the task
    try:
        socket.create_connection(where, timeout=2).close()
        return True
    except OSError:
        return False


def _listen(address: str) -> socket.socket | None:
    """Accepts (and drops) connections on ``address``'s port, to show this task started."""
    where = _split(address)
    if where is None:
        return None
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("", where[1]))
        sock.listen(16)
    except OSError:
        sock.close()
        return None

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
                conn.close()
            except OSError:
                return

    threading.Thread(target=serve, name="jaxdist-listen", daemon=True).start()
    return sock


def _missing(names: list[str], addresses: list[str], me: int) -> list[str]:
    return [n for i, (n, a) in enumerate(zip(names, addresses)) if i != me and not _reachable(a)]


def _init_watchdog(done: threading.Event, names: list, addresses: list, pid: int, timeout: float):
    if done.wait(timeout):
        return
    me = f"{names[pid]} (JAX process {pid})"
    head = f"the cluster did not form within {timeout:g}s (CommunicationOptions.timeout_seconds)"
    if pid != 0 and not _reachable(addresses[0]):
        die(
            me,
            f"{head}: the coordinator, task {names[0]} at {addresses[0]}, is not reachable; "
            f"task {names[0]} did not start (or died)",
        )
    missing = _missing(names, addresses, pid)
    if missing:
        die(
            me,
            f"{head}: task(s) {missing} did not start (nothing listens at their "
            "TF_CONFIG addresses); start every task of the cluster",
        )
    die(
        me,
        f"{head}: not every task of {names} connected to the coordinator at "
        f"{addresses[0]}; check that they were all started with the same cluster",
    )


def join(resolver: Any, timeout_seconds: float | None) -> tuple[str, int, int]:
    """Initializes `jax.distributed` for ``resolver``'s cluster (once per process).

    Returns ``(this task's name, num_processes, process_id)``.

    Raises:
        ValueError: the resolver's cluster or task is invalid for jax.distributed.
        RuntimeError: JAX already ran a computation in this process (too late to join),
            or jax.distributed was initialized for another cluster shape.
    """
    coordinator, n, pid = jax_distributed_args(resolver)
    spec = resolver.cluster_spec()
    order = process_order(spec)
    names = [f"{job}:{i}" for job, i in order]
    addresses = [spec.task_address(job, i) for job, i in order]
    if _already_joined(n, pid, names):
        return names[pid], n, pid
    timeout = float(timeout_seconds or DEFAULT_TIMEOUT_S)
    _initialize_guarded(coordinator, n, pid, names, addresses, timeout)
    _state["abort"], _state["ended"] = _cluster_guard.start(names, pid, timeout)
    _state["joined"] = (names[pid], n, pid)
    _state["names"] = names
    _state["timeout"] = timeout
    return names[pid], n, pid


def _already_joined(n: int, pid: int, names: list[str]) -> bool:
    """True when jax.distributed already runs this cluster; raises when it is too late to join."""
    if jax.distributed.is_initialized():
        if (jax.process_count(), jax.process_index()) != (n, pid):
            raise RuntimeError(
                f"jax.distributed is already initialized as process {jax.process_index()} of "
                f"{jax.process_count()}, but the cluster resolver says process {pid} of {n} "
                f"({names[pid]})."
            )
        return True
    if backends_started():
        raise RuntimeError(
            "MultiWorkerMirroredStrategy (or configure(cluster_spec=...)) must be created "
            "before any JAX computation in this process: jax.distributed.initialize cannot run "
            "once the JAX backend has started. Create the strategy first thing in the program."
        )
    return False


def _initialize_guarded(
    coordinator: str, n: int, pid: int, names: list[str], addresses: list[str], timeout: float
) -> None:
    """`jax.distributed.initialize` with jaxdist's init watchdog naming a missing task."""
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_enable_recoverability", True)
    listener = _listen(addresses[pid]) if pid != 0 else None
    done = threading.Event()
    threading.Thread(
        target=_init_watchdog,
        args=(done, names, addresses, pid, timeout),
        name="jaxdist-init-watchdog",
        daemon=True,
    ).start()
    try:
        jax.distributed.initialize(
            coordinator,
            n,
            pid,
            cluster_detection_method="deactivate",
            initialization_timeout=int(math.ceil(timeout)) + 60,  # our watchdog comes first
            heartbeat_timeout_seconds=max(1, int(math.ceil(timeout))),
            shutdown_timeout_seconds=max(1, int(math.ceil(timeout))),
        )
    finally:
        done.set()
        if listener is not None:
            listener.close()


def join_cluster(
    resolver: ClusterResolver, options: CommunicationOptions | None = None
) -> tuple[tuple[jax.Device, ...], bool]:
    """Joins ``resolver``'s cluster; returns (the replicas' devices, whether this is the chief).

    One worker: the local devices, no jax.distributed. Several: `jax.distributed` is
    initialized (once per process) and the devices are every worker's, worker by worker.
    """
    if is_single_worker(resolver):
        return tuple(jax.local_devices()), True
    timeout = options.timeout_seconds if options is not None else None
    _, _, pid = join(resolver, timeout)
    _inflight.watch(float(timeout or DEFAULT_TIMEOUT_S), _state["abort"], _state["ended"])
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    _check_same_device_counts(devices)
    return tuple(devices), pid == 0


def _check_same_device_counts(devices: list) -> None:
    """Every worker must bring as many devices (TF: the same devices per worker); else
    jax's own check fails at the first step with a bare AssertionError."""
    counts = [0] * jax.process_count()
    for d in devices:
        counts[d.process_index] += 1
    if len(set(counts)) > 1:
        names = _state["names"]
        each = ", ".join(f"{names[i]} has {n}" for i, n in enumerate(counts))
        raise ValueError(
            "MultiWorkerMirroredStrategy: every worker must have the same number of devices "
            f"(each worker's replicas are its local devices); {each}. Give every worker the "
            "same devices (e.g. the same --xla_force_host_platform_device_count, or "
            "jax.config.update('jax_num_cpu_devices', n) before the strategy is created)."
        )


EXCHANGE_KEY = "jaxdist/exchange"


ORDER_RULE = "every worker must iterate its distributed datasets in the same order"


def exchange(local: dict[int, int], purpose: str, rule: str = ORDER_RULE) -> dict[int, int]:
    """Every worker's ``{replica id: int}``, merged: an all-gather on the hosts through the
    coordination service (key-value store), not a device program, so it does not wait for
    the steps in flight. Every worker must call it at the same point of its program, for
    the same ``purpose``; a worker that does not come within ``timeout_seconds``, or comes
    for another purpose, ends every worker, named, with ``rule`` (what every worker must do)."""
    client = coordination_client()
    if client is None:
        raise RuntimeError("exchange: this process has not joined a multi-worker cluster.")
    names, pid, timeout = _state["names"], _state["joined"][2], _state["timeout"]
    seq = _state["exchanges"] = _state.get("exchanges", 0) + 1
    text = ",".join(f"{r}:{v}" for r, v in local.items())
    client.key_value_set(f"{EXCHANGE_KEY}/{seq}/{pid}", f"{purpose}|{text}")
    merged = dict(local)
    for p in range(len(names)):
        if p != pid:
            merged.update(_received(client, seq, p, purpose, timeout, rule))
    if seq > 2:  # every worker has read exchange seq - 2 before posting seq - 1
        client.key_value_delete(f"{EXCHANGE_KEY}/{seq - 2}/{pid}")
    return merged


AWAIT_SLICE_S = 0.5


def _await(client: Any, key: str, task: str, timeout: float) -> tuple[str | None, bool]:
    """Waits for ``key`` up to ``timeout``; gives up early once ``task`` ended its program.
    Returns (the value or None, whether ``task`` ended)."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            return client.blocking_key_value_get(
                key, max(1, int(min(left, AWAIT_SLICE_S) * 1000))
            ), False
        except jax.errors.JaxRuntimeError:
            pass
        if task in _state["ended"]():
            try:
                return client.key_value_try_get(key), True  # posted just before it ended
            except jax.errors.JaxRuntimeError:
                return None, True
        if left <= AWAIT_SLICE_S:
            return None, False


def _received(
    client: Any, seq: int, p: int, purpose: str, timeout: float, rule: str
) -> dict[int, int]:
    names = _state["names"]
    got, ended = _await(client, f"{EXCHANGE_KEY}/{seq}/{p}", names[p], timeout)
    theirs, _, text = (got or "").partition("|")
    if got is None or theirs != purpose:
        came = f"came for {theirs}" if got is not None else f"did not come within {timeout:g}s"
        if ended:
            came = "finished its program without coming (a task that ended joins no exchange)"
        message = (
            f"exchange #{seq} across workers (for {purpose}): task {names[p]} {came}; {rule}; "
            "aborting"
        )
        _state["abort"](message)
        raise RuntimeError(message)
    return {int(r): int(v) for r, v in (item.split(":") for item in text.split(","))}
