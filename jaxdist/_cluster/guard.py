"""The guard of a joined multi-worker cluster: every fault ends every task, named.

In jaxlib every fatal multi-worker failure is a C++ abort (SIGABRT) or a raw gloo error
that does not name the task, so jaxdist watches the cluster itself (`start`, called once
the cluster has formed) and, on any fault, prints one line naming the task and the cause as
the last line of every task, then ends it (``os._exit``; status `EXIT_CODE`, 1 on the task
whose own program failed):

* a liveness monitor: with ``jax_enable_recoverability`` the coordination service keeps
  running when a task dies; the monitor polls its live tasks every `POLL_S` seconds and,
  when one stopped sending heartbeats (``heartbeat_timeout = timeout_seconds``), names it
  (or, if it had announced the end of its program, says that it finished);
* the abort protocol: the task that finds a fault writes the reason under `ABORT_KEY` in the
  coordination service; every other task's abort watch (its own thread: the liveness poll is a
  barrier of the live tasks and can block for a heartbeat timeout) prints it and leaves; the
  coordinator leaves last, after the others' acknowledgements (a task whose coordinator is
  gone is aborted by jaxlib without a word);
* an uncaught exception (sys.excepthook) ends every task, naming this one and its exception
  (a collective's runtime error waits for the reason another task reported first);
* the collective watchdog of `jaxdist._base.inflight` reports a collective without progress
  through the function `start` returns.

At interpreter exit the tasks announce the end of their program (with how many collective
programs they dispatched, so a task waiting in a later one aborts at once: `finished_programs`)
and meet at a barrier
(recoverable tasks skip jax's own shutdown barrier), with the monitor still watching; then
`jax.distributed.shutdown` runs, on the coordinator last (its service must outlive the other
tasks' disconnects). A task that is still waiting at the barrier after ``timeout_seconds``
names the tasks that never reached it. The coordination client is
private JAX API, read in `jaxdist._base.jax_internals`.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import jax

from jaxdist._base import inflight as _inflight
from jaxdist._base.jax_internals import coordination_client

EXIT_CODE = 75
"""The exit status of a task that the guard ends because the cluster broke (EX_TEMPFAIL)."""
POLL_S = 0.5

_state: dict[str, Any] = {}


def die(me: str, message: str) -> None:
    sys.stderr.write(f"jaxdist: task {me}: {message}\n")
    sys.stderr.flush()
    os._exit(EXIT_CODE)


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


def _abort_cluster(
    client: Any,
    names: list,
    pid: int,
    message: str,
    code: int = EXIT_CODE,
    gone: frozenset = frozenset(),
) -> None:
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
    _leave(client, names, pid, code, gone)


def _leave(
    client: Any, names: list, pid: int, code: int = EXIT_CODE, gone: frozenset = frozenset()
) -> None:
    """Acknowledges the report and exits; the coordinator first waits (up to `ACK_WAIT_S`)
    for every other task's acknowledgement, but not for the tasks in ``gone`` (dead).

    Only keys are read here: ``get_live_nodes`` is a barrier of the live tasks, which blocks
    until a task that already left is declared dead (a heartbeat timeout later).
    """
    try:
        client.key_value_set(f"{ABORT_KEY}/ack/{pid}", "1")
    except Exception:  # noqa: BLE001
        pass
    deadline = time.monotonic() + ACK_WAIT_S
    others = [i for i in range(len(names)) if i != pid and i not in gone]
    while pid == 0 and others and time.monotonic() < deadline:
        others = [i for i in others if not _has_key(client, f"{ABORT_KEY}/ack/{i}")]
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


def _watch_aborts(client: Any, names: list, pid: int, stop: threading.Event) -> None:
    """Ends this task soon after another one reported a fault. Its own thread: the liveness
    poll (``get_live_nodes``) is a barrier of the live tasks and can block for a heartbeat
    timeout when a task stopped polling."""
    while not stop.wait(POLL_S / 5):
        _check_abort(client, names, pid)


def _monitor(client: Any, names: list, pid: int, timeout: float, stop: threading.Event) -> None:
    me = f"{names[pid]} (JAX process {pid})"
    ids = list(range(len(names)))
    while not stop.wait(POLL_S):
        try:
            live = set(client.get_live_nodes(ids))
        except Exception as e:  # noqa: BLE001 - any failure means the coordinator is gone
            if stop.is_set():
                return
            die(
                me,
                f"lost the coordinator, task {names[0]} ({type(e).__name__}: "
                f"{str(e)[:160]}); the cluster is broken, aborting",
            )
        dead = [names[i] for i in ids if i not in live]
        if dead and _state.get("finishing") and stop.wait(2 * POLL_S):
            return  # the other tasks' exit after the shutdown barrier, not a death
        if dead and not stop.is_set():
            _check_abort(client, names, pid)  # a fault another task reported comes first
            _report_dead(client, names, pid, timeout, frozenset(ids) - live)


def _report_dead(client: Any, names: list, pid: int, timeout: float, gone: frozenset) -> None:
    dead = [names[i] for i in sorted(gone)]
    left = [n for n in _finished(client, names) if n in dead]
    if left:
        ended = ", ".join(f"task {n} finished its program" for n in left)
        message = (
            f"{ended} and left while this task still runs its program: a task that ended "
            "joins no further step (did the workers run different numbers of steps?); aborting"
        )
    else:
        message = (
            f"task(s) {dead} stopped responding (no heartbeat for {timeout:g}s, "
            "CommunicationOptions.timeout_seconds): a worker died; aborting"
        )
    _abort_cluster(client, names, pid, message, gone=gone)


FINISHED_KEY = "jaxdist/finished"


def _finished(client: Any, names: list) -> list[str]:
    """The tasks that reached the end of their program (see `_shutdown`)."""
    return [n for i, n in enumerate(names) if _has_key(client, f"{FINISHED_KEY}/{i}")]


def finished_programs(client: Any, names: list) -> dict[str, int]:
    """{task: the collective programs it dispatched} of the tasks that ended their program
    (their count is final: `jaxdist._base.inflight.counted`)."""
    try:
        entries = client.key_value_dir_get(FINISHED_KEY)
    except Exception:  # noqa: BLE001 - the coordinator is gone: the monitor says so
        return {}
    out = {}
    for key, value in entries:
        index = key.rstrip("/").rsplit("/", 1)[-1]
        if index.isdigit() and int(index) < len(names) and value.isdigit():
            out[names[int(index)]] = int(value)
    return out


def _shutdown(client: Any, names: list, pid: int, timeout: float, stop: threading.Event):
    """At exit: the tasks meet at a barrier; the liveness monitor keeps watching until every
    task is there (it ends this task if another one reports a fault meanwhile)."""
    _state["finishing"] = True
    try:
        client.key_value_set(f"{FINISHED_KEY}/{pid}", str(_inflight.counted()))
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
    if done and "finished its program" not in message:
        ended = ", ".join(f"task {n} finished its program" for n in done)
        message = f"{ended} while {message}"
    _abort_cluster(client, names, pid, message)


def _on_uncaught(client: Any, names: list, pid: int, timeout: float, error: BaseException):
    """An uncaught exception ends every task, naming this one and its exception.

    A runtime error of a collective (a peer closed the connection) is usually the effect of
    another task's fault: the reason that task reported (or the liveness monitor's) is
    awaited for up to ``timeout`` + 2 s and printed instead.
    """
    if _from_a_peer(error):
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


PEER_ERROR_TEXT = ("gloo", "connection", "peer", "socket", "unavailable", "coordination")


def _from_a_peer(error: BaseException) -> bool:
    """Whether ``error`` is a collective's runtime error caused by another task (gloo's
    "Connection closed by peer" and the like), not this task's own fault."""
    text = str(error).lower()
    return isinstance(error, jax.errors.JaxRuntimeError) and any(t in text for t in PEER_ERROR_TEXT)


def _install_excepthook(client: Any, names: list, pid: int, timeout: float) -> None:
    previous = sys.excepthook

    def hook(etype: type, error: BaseException, tb: Any) -> None:
        previous(etype, error, tb)
        if not isinstance(error, KeyboardInterrupt):
            _on_uncaught(client, names, pid, timeout, error)

    sys.excepthook = hook


def start(
    names: list[str], pid: int, timeout: float
) -> tuple[Callable[[str], None], Callable[[], dict[str, int]]]:
    """Guards this task: the liveness monitor, the ordered shutdown at exit and the hook on
    uncaught exceptions. Returns, for the in-flight watchdog, the function that reports a
    stalled collective (it names the tasks that already ended, and ends every task) and the
    one that reads the other tasks' final program counts (`finished_programs`)."""
    client = coordination_client()
    stop = threading.Event()
    for target, args in (
        (_monitor, (client, names, pid, timeout, stop)),
        (_watch_aborts, (client, names, pid, stop)),
    ):
        threading.Thread(
            target=target, args=args, name=f"jaxdist-{target.__name__}", daemon=True
        ).start()
    atexit.register(_shutdown, client, names, pid, timeout, stop)  # runs before jax's own
    _install_excepthook(client, names, pid, timeout)
    others = [n for i, n in enumerate(names) if i != pid]

    def ended() -> dict[str, int]:
        return {n: c for n, c in finished_programs(client, names).items() if n in others}

    return (lambda message: _stalled(client, names, pid, message)), ended
