"""Joining a multi-worker cluster with `jax.distributed`, and failing clearly when it breaks.

`join` maps a cluster resolver to ``jax.distributed.initialize`` (coordinator: the chief,
or worker 0) and guards the cluster with two daemon threads, because in jaxlib every fatal
multi-worker failure is a C++ abort (SIGABRT) with a message that does not name the task:

* an init watchdog: when the cluster has not formed after ``timeout_seconds`` (a task never
  started), it names the missing task(s) on stderr and ends the process with
  ``os._exit(75)`` (jax's own abort would come ~5 s after its longer init timeout). Each
  non-coordinator task listens on its own TF_CONFIG address while it waits, so that the
  others can tell a started task from a missing one.
* a liveness monitor: with ``jax_enable_recoverability`` the coordination service keeps
  running when a task dies; the monitor polls its live tasks every `POLL_S` seconds and,
  when one stopped sending heartbeats (``heartbeat_timeout = timeout_seconds``), names it
  on stderr and ends the process with ``os._exit(75)``.

At interpreter exit the tasks meet at a barrier (recoverable tasks skip jax's own
shutdown barrier), then `jax.distributed.shutdown` runs, on the coordinator last (its
service must outlive the other tasks' disconnects, or they abort). The one failure that cannot be
caught in-process is the coordinator dying while this task is idle: jaxlib aborts within
~0.2 s ("the leader task was preempted/died"). Everything here that reaches into
``jax._src.distributed`` (the coordination client) is private jax API, kept in this module.
"""

from __future__ import annotations

import atexit
import math
import os
import socket
import sys
import threading
import time
from typing import Any

import jax

from jaxdist import _inflight
from jaxdist._cluster_resolver import (
    SIDECAR_JOBS,
    ClusterResolver,
    jax_distributed_args,
    process_order,
)
from jaxdist._options import CommunicationOptions

EXIT_CODE = 75
"""The exit status of a task that the guard ends because the cluster broke (EX_TEMPFAIL)."""
POLL_S = 0.5
DEFAULT_TIMEOUT_S = 300.0
"""``timeout_seconds`` when `CommunicationOptions` leaves it None (jax's init default)."""

_state: dict[str, Any] = {"joined": None}


def is_single_worker(resolver: Any) -> bool:
    """True when ``resolver`` describes no cluster, one task, or a sidecar task (evaluator)."""
    spec = resolver.cluster_spec()
    if not spec or resolver.task_type in SIDECAR_JOBS:
        return True
    return len(process_order(spec)) == 1


def _backend_started() -> bool:
    try:
        from jax._src import xla_bridge

        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):  # pragma: no cover - jax moved it
        return False


def _die(me: str, message: str) -> None:
    sys.stderr.write(f"jaxdist: task {me}: {message}\n")
    sys.stderr.flush()
    os._exit(EXIT_CODE)


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
        _die(
            me,
            f"{head}: the coordinator, task {names[0]} at {addresses[0]}, is not reachable; "
            f"task {names[0]} did not start (or died)",
        )
    missing = _missing(names, addresses, pid)
    if missing:
        _die(
            me,
            f"{head}: task(s) {missing} did not start (nothing listens at their "
            "TF_CONFIG addresses); start every task of the cluster",
        )
    _die(
        me,
        f"{head}: not every task of {names} connected to the coordinator at "
        f"{addresses[0]}; check that they were all started with the same cluster",
    )


ABORT_KEY = "jaxdist/abort"
ACK_WAIT_S = 5.0


_EXIT_LOCK = threading.Lock()


def _claim_exit() -> None:
    """Makes this thread the one that reports and ends the process; any other thread that
    gets here later waits for that (one report per task, the last line it prints)."""
    with _EXIT_LOCK:
        first = not _state.get("aborting")
        _state["aborting"] = True
    if not first:
        time.sleep(ACK_WAIT_S + 2)
        os._exit(EXIT_CODE)


def _say(names: list, pid: int, message: str) -> None:
    """Prints jaxdist's line about the cluster (kept, to repeat it as the last line)."""
    line = f"jaxdist: task {names[pid]} (JAX process {pid}): {message}\n"
    _state["said"] = line
    sys.stderr.write(line)
    sys.stderr.flush()


def _abort_cluster(client: Any, names: list, pid: int, message: str, code: int = EXIT_CODE) -> None:
    """This task found the cluster stuck (or failed): it tells every task (each prints the
    reason and exits 75), then exits with ``code``. The coordinator leaves last: a task
    whose coordinator is gone is aborted by jaxlib without a word."""
    _claim_exit()
    _say(names, pid, message)
    try:
        own = message.startswith(f"task {names[pid]} ")  # already names this task
        client.key_value_set(
            ABORT_KEY, message if own else f"task {names[pid]} reported: {message}"
        )
    except Exception:  # noqa: BLE001 - another task reported first
        pass
    _leave(client, names, pid, code)


def _leave(client: Any, names: list, pid: int, code: int = EXIT_CODE) -> None:
    try:
        client.key_value_set(f"{ABORT_KEY}/ack/{pid}", "1")
    except Exception:  # noqa: BLE001
        pass
    deadline = time.monotonic() + ACK_WAIT_S
    others = [i for i in range(len(names)) if i != pid]
    while pid == 0 and others and time.monotonic() < deadline:
        try:
            live = set(client.get_live_nodes(list(range(len(names)))))
        except Exception:  # noqa: BLE001
            break
        others = [i for i in others if i in live and not _has_key(client, f"{ABORT_KEY}/ack/{i}")]
        time.sleep(0.05)
    os._exit(code)


def _has_key(client: Any, key: str) -> bool:
    try:
        client.key_value_try_get(key)
        return True
    except Exception:  # noqa: BLE001 - NOT_FOUND
        return False


def _check_abort(client: Any, names: list, pid: int) -> None:
    """Ends this task when another one reported the cluster stuck (see `_abort_cluster`)."""
    if _state.get("aborting"):
        return
    try:
        reason = client.key_value_try_get(ABORT_KEY)
    except Exception:  # noqa: BLE001 - NOT_FOUND: nothing reported
        return
    _claim_exit()
    _say(names, pid, reason)
    _leave(client, names, pid)


def _monitor(client: Any, names: list, pid: int, timeout: float, stop: threading.Event) -> None:
    me = f"{names[pid]} (JAX process {pid})"
    ids = list(range(len(names)))
    while not stop.wait(POLL_S):
        _check_abort(client, names, pid)
        try:
            live = set(client.get_live_nodes(ids))
        except Exception as e:  # noqa: BLE001 - any failure means the coordinator is gone
            if stop.is_set():
                return
            _die(
                me,
                f"lost the coordinator, task {names[0]} ({type(e).__name__}: "
                f"{str(e)[:160]}); the cluster is broken, aborting",
            )
        dead = [names[i] for i in ids if i not in live]
        if dead and _state.get("finishing") and stop.wait(2 * POLL_S):
            return  # the other tasks' exit after the shutdown barrier, not a death
        if dead and not stop.is_set():
            _check_abort(client, names, pid)  # a fault another task reported comes first
            left = [n for n in _finished(client, names) if n in dead]
            if left:
                ended = ", ".join(f"task {n} finished its program" for n in left)
                _abort_cluster(
                    client,
                    names,
                    pid,
                    f"{ended} and left while this task still runs its program: a task that "
                    "ended joins no further step (did the workers run different numbers of "
                    "steps?); aborting",
                )
            _abort_cluster(
                client,
                names,
                pid,
                f"task(s) {dead} stopped responding (no heartbeat for {timeout:g}s, "
                "CommunicationOptions.timeout_seconds): a worker died; aborting",
            )


FINISHED_KEY = "jaxdist/finished"


def _finished(client: Any, names: list) -> list[str]:
    """The tasks that reached the end of their program (see `_shutdown`)."""
    return [n for i, n in enumerate(names) if _has_key(client, f"{FINISHED_KEY}/{i}")]


def _shutdown(client: Any, names: list, pid: int, timeout: float, stop: threading.Event):
    """At exit: the tasks meet at a barrier; the liveness monitor keeps watching until every
    task is there (it ends this task if another one reports a fault meanwhile)."""
    _state["finishing"] = True
    try:
        client.key_value_set(f"{FINISHED_KEY}/{pid}", "1")
    except Exception:  # noqa: BLE001 - the coordinator is gone: the barrier says so
        pass
    try:
        client.wait_at_barrier("jaxdist_shutdown", int(timeout * 1000))
    except Exception as e:  # noqa: BLE001
        if not _state.get("aborting"):
            _abort_cluster(client, names, pid, _laggards(client, names, pid, timeout, e))
        time.sleep(ACK_WAIT_S + 2)  # the monitor reported and ends the process
        os._exit(EXIT_CODE)
    stop.set()
    if pid == 0:  # the coordinator's service must outlive the other tasks' disconnects
        deadline = time.monotonic() + min(timeout, 10.0)
        while time.monotonic() < deadline:
            try:
                if set(client.get_live_nodes(list(range(len(names))))) <= {0}:
                    break
            except Exception:  # noqa: BLE001
                break
            time.sleep(0.05)
    try:
        jax.distributed.shutdown()
    except Exception:  # noqa: BLE001 - the process is exiting anyway
        pass


def _laggards(client: Any, names: list, pid: int, timeout: float, error: Exception) -> str:
    try:
        live = set(client.get_live_nodes(list(range(len(names)))))
    except Exception:  # noqa: BLE001
        live = set(range(len(names)))
    done = set(_finished(client, names))
    dead = [n for i, n in enumerate(names) if i not in live]
    waiting = [n for i, n in enumerate(names) if i in live and n not in done]
    if dead:
        return f"task(s) {dead} died before the end of the program; aborting"
    return (
        f"task {names[pid]} finished its program, but task(s) {waiting} did not reach its end "
        f"within {timeout:g}s (CommunicationOptions.timeout_seconds): they wait for a step "
        "this task never ran (did the workers run different numbers of steps?); aborting "
        f"({type(error).__name__})"
    )


def _stalled(client: Any, names: list, pid: int, message: str) -> None:
    """The in-flight watchdog's report, naming the tasks that already ended their program."""
    done = [n for n in _finished(client, names) if n != names[pid]]
    if done:
        ended = ", ".join(f"task {n} finished its program" for n in done)
        message = f"{ended} while {message}"
    _abort_cluster(client, names, pid, message)


def _on_uncaught(client: Any, names: list, pid: int, timeout: float, error: BaseException):
    """An uncaught exception ends every task, naming this one and its exception.

    A runtime error of a collective (a peer closed the connection) is usually the effect of
    another task's fault: the reason that task reported (or the liveness monitor's) is
    awaited for up to ``timeout`` + 2 s and printed instead.
    """
    if isinstance(error, jax.errors.JaxRuntimeError):
        deadline = time.monotonic() + timeout + 2
        while time.monotonic() < deadline and not _state.get("aborting"):
            _check_abort(client, names, pid)
            time.sleep(POLL_S / 5)
    if _state.get("aborting"):  # reported (by the monitor): its line stays the last one
        said = _state.get("said")
        if said:
            sys.stderr.write(said)
            sys.stderr.flush()
        time.sleep(ACK_WAIT_S + 2)  # the reporting thread ends the process
        os._exit(EXIT_CODE)
    text = str(error).strip().splitlines()
    first = text[0] if text else ""
    _abort_cluster(
        client,
        names,
        pid,
        f"task {names[pid]} failed with {type(error).__name__}: {first}; ending every worker",
        code=1,
    )


def _install_excepthook(client: Any, names: list, pid: int, timeout: float) -> None:
    previous = sys.excepthook

    def hook(etype: type, error: BaseException, tb: Any) -> None:
        previous(etype, error, tb)
        if not isinstance(error, KeyboardInterrupt):
            _on_uncaught(client, names, pid, timeout, error)

    sys.excepthook = hook


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
    _start_liveness_monitor(names, pid, timeout)
    _state["joined"] = (names[pid], n, pid)
    _state["names"] = names
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
    if _backend_started():
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


def _start_liveness_monitor(names: list[str], pid: int, timeout: float) -> None:
    """Watches the other tasks' heartbeats; shuts down in order at exit."""
    from jax._src import distributed

    client = distributed.global_state.client
    stop = threading.Event()
    threading.Thread(
        target=_monitor,
        args=(client, names, pid, timeout, stop),
        name="jaxdist-liveness",
        daemon=True,
    ).start()
    atexit.register(_shutdown, client, names, pid, timeout, stop)  # runs before jax's own
    _install_excepthook(client, names, pid, timeout)
    _state["abort"] = lambda message: _stalled(client, names, pid, message)


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
    _inflight.watch(float(timeout or DEFAULT_TIMEOUT_S), _state["abort"])
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
