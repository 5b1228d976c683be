"""The bound on un-finished collective programs in flight, for every program with collectives.

XLA's CPU client runs the per-device parts of multi-device programs on a shared
thread pool, in no fixed order across devices. With many un-finished programs
that contain collectives in flight, devices can wait at different programs'
rendezvous until XLA aborts the process ("Termination timeout ... rendezvous");
measured here: a few thousand un-blocked jitted steps, even feeding each other,
and a few hundred interleaved with other collective programs. Across processes
(gloo) the same pattern hangs.

jaxdist therefore records every multi-device program it knows of by one of its
outputs (a "marker") and, when more than `get_max_steps_in_flight()` are
pending, waits for the oldest before going on:

* the programs jaxdist dispatches (`jaxdist._program.compile.dispatch`): steps and the
  all-reduce cross-device ops;
* jitted user functions that return distributed values: their outputs pass
  through the `PerReplica`/`Mirrored` pytree hooks (`note_output`) right after
  dispatch. One marker is kept per output tree (leaves unflattened together).
"""

from __future__ import annotations

import atexit
import collections
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import jax

from jaxdist._base.validate import check_int

_ENV = "JAXDIST_MAX_STEPS_IN_FLIGHT"
_limit = [int(os.environ.get(_ENV, "4"))]
_pending: collections.deque = collections.deque()
_last = [0.0]
BURST_S = 20e-6
"""Leaves of one output tree are unflattened within this many seconds of each other."""


def set_max_steps_in_flight(n: int) -> None:
    """Caps how many dispatched, un-finished collective programs may be in flight.

    When a new program would exceed the cap, jaxdist first waits for the oldest
    one. It counts `Strategy.run` steps, the cross-device ops' programs and
    jitted functions that return distributed values. The default is 4, or the
    environment variable ``JAXDIST_MAX_STEPS_IN_FLIGHT``.

    >>> import jaxdist as jd
    >>> jd.experimental.set_max_steps_in_flight(8)
    >>> jd.experimental.get_max_steps_in_flight()
    8
    >>> jd.experimental.set_max_steps_in_flight(4)
    """
    _limit[0] = check_int(n, "n (steps in flight)", minimum=1)


def get_max_steps_in_flight() -> int:
    """The current cap of un-finished programs in flight (see `set_max_steps_in_flight`).

    >>> import jaxdist as jd
    >>> jd.experimental.get_max_steps_in_flight() >= 1
    True
    """
    return _limit[0]


def throttle(marker: Any, what: str = "a jitted function", counted: bool = True) -> None:
    """Records a dispatched program by one of its outputs; waits for the oldest past the cap.

    With a watchdog running (multi-worker), the program is also watched for progress; a
    ``counted`` one (jaxdist's own programs, which every worker dispatches in the same order)
    gets the next number (see `counted`).
    """
    if _watch["on_stall"] is not None:
        number = None
        if counted:
            _count[0] += 1
            number = _count[0]
        _watched.append((marker, what, time.monotonic(), number))
    _pending.append(marker)  # deque operations are atomic under the GIL
    while len(_pending) > _limit[0]:
        try:
            old = _pending.popleft()
        except IndexError:  # another thread emptied it first
            break
        try:
            old.block_until_ready()
        except Exception:  # noqa: BLE001 - a failed program reports itself to its caller
            pass


def note_output(x: Any) -> None:
    """The pytree hook: a concrete, pending, multi-device array starts a marker.

    Called for every stacked leaf a `PerReplica`/`Mirrored` is rebuilt from; the
    leaves of one output tree arrive within `BURST_S` of each other and count once.
    """
    if not isinstance(x, jax.Array) or isinstance(x, jax.core.Tracer):
        return
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)  # typed keys: their data array is the marker
    now = time.perf_counter()
    burst, _last[0] = now - _last[0] < BURST_S, now
    if burst or len(x.sharding.device_set) < 2 or x.is_ready():  # type: ignore[attr-defined]
        return
    throttle(x, counted=False)  # whether it is still running here is a race: not numbered


# -- multi-worker: the bound, and a watchdog on collectives that make no progress --------------

_watch: dict[str, Any] = {"on_stall": None, "timeout": None, "ended": None}
_watched: collections.deque = collections.deque()
_count = [0]
POLL_S = 0.25
ORPHAN_S = 1.0
"""How long a program waits before the watchdog asks whether a task that ended its program
left it without a partner (that check reads the coordination service)."""
MULTI_WORKER_DEFAULT = 1
"""The default cap across processes: with gloo, even two un-finished collective programs
per device can wait for each other forever (measured: run + three reduces per step hung
with 2+ devices per worker at a cap of 4, and finished at 1)."""


def counted() -> int:
    """How many numbered collective programs this process dispatched (steps, reductions,
    all-reduces and Keras steps across workers): every worker dispatches the same ones in
    the same order, so program #n of one worker meets program #n of every other."""
    return _count[0]


def watch(
    timeout: float,
    on_stall: Callable[[str], None],
    ended: Callable[[], dict[str, int]] | None = None,
) -> None:
    """Starts watching collective programs (once per process): ``on_stall(message)`` is
    called when the oldest un-finished one made no progress for ``timeout`` seconds, or, at
    once, when ``ended()`` (``{task: its final `counted`}`` of the tasks that ended their
    program) shows a task that ended before dispatching it: that program can never finish.

    Also lowers the default in-flight cap to `MULTI_WORKER_DEFAULT` (unless the
    environment variable sets it).
    """
    if os.environ.get(_ENV) is None:
        _limit[0] = MULTI_WORKER_DEFAULT
    first = _watch["on_stall"] is None
    _watch.update(on_stall=on_stall, timeout=float(timeout), ended=ended)
    if first:
        thread = threading.Thread(target=_watchdog, name="jaxdist-collective-watchdog", daemon=True)
        thread.start()
        atexit.register(_stop, thread)  # before jax's own shutdown (registered earlier)


def _stop(thread: threading.Thread) -> None:
    """Ends the watchdog before the interpreter does: a daemon thread killed inside a
    jax call at exit aborts the process."""
    _stopping.set()
    thread.join(timeout=2 * POLL_S + 1)
    _watched.clear()


_stopping = threading.Event()


def _watchdog() -> None:
    while not _stopping.wait(POLL_S):
        while _watched and _ready(_watched[0][0]):
            _watched.popleft()
        if not _watched:
            continue
        _, what, started, number = _watched[0]
        waited = time.monotonic() - started
        name = f"collective program #{number}" if number else "a collective program"
        if waited > _watch["timeout"]:
            _watch["on_stall"](
                f"{name} ({what}) made no progress for {waited:.0f}s "
                f"(CommunicationOptions.timeout_seconds={_watch['timeout']:g}): every worker "
                "must make the same strategy calls in the same order, and one of them did not "
                "reach this one (it stopped calling, or waits elsewhere); aborting"
            )
            return
        left = _orphaned(number) if number and waited > ORPHAN_S else None
        if left:
            _watch["on_stall"](
                f"{left}, while this task waits in {name} ({what}), which the ended task(s) "
                "never dispatched: every worker must make the same strategy calls in the same "
                "order (did the workers run different numbers of steps?); aborting"
            )
            return


def _orphaned(number: int) -> str | None:
    """Names the tasks that ended their program before dispatching program ``number``."""
    ended = _watch["ended"]() if _watch["ended"] is not None else {}
    short = {task: n for task, n in ended.items() if n < number}
    if not short:
        return None
    return ", ".join(
        f"task {task} finished its program after {n} collective programs"
        for task, n in sorted(short.items())
    )


def _ready(marker: Any) -> bool:
    try:
        return bool(marker.is_ready())
    except Exception:  # noqa: BLE001 - a failed program is finished
        return True
