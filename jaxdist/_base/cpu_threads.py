"""The size of XLA's CPU thread pool for simulated CPU devices.

XLA's CPU client runs every device's part of a program on one pool of
``max(cores, devices)`` threads. A collective needs every device's part running
at once to meet at its rendezvous; with several multi-device programs in flight,
their parts fill the pool and wait for each other until XLA aborts the process
("Termination timeout for `all reduce` ... Expected 8 threads to join the
rendezvous"). Measured on 2 cores with 8 simulated devices: an un-blocked loop of
a jitted evaluation step (run + reduce, outputs without a distributed value, which
the in-flight bound of `jaxdist._base.inflight` cannot count) aborts with a pool of 8,
10 or 12 threads and finishes with 16, 24 or 64 (2 devices: aborts with 2,
finishes with 4).

So, when ``import jaxdist`` comes before JAX starts its backend and several CPU
devices are simulated (2 devices on 2 cores abort the same way), jaxdist sets ``PJRT_NPROC`` (which
XLA reads once, when the CPU client starts) to twice the device count. It never
overrides a ``PJRT_NPROC`` the user set, and ``JAXDIST_CPU_THREADS=0`` leaves
XLA's default. When the backend started first, XLA's pool stays as it is and the
in-flight bound is the only guard: `cpu_threads` says which case holds.
"""

from __future__ import annotations

import os
import re
import warnings
from typing import Any

import jax

from jaxdist._base.jax_internals import backends_started

_FLAG = re.compile(r"--xla_force_host_platform_device_count=(\d+)")
_state: dict[str, Any] = {"set_by": None}


def _simulated_devices() -> int:
    found = _FLAG.findall(os.environ.get("XLA_FLAGS", ""))
    n = int(found[-1]) if found else 0
    try:
        n = max(n, int(getattr(jax.config, "jax_num_cpu_devices", 0) or 0))
    except (ValueError, TypeError):  # pragma: no cover - an odd config value
        pass
    return n


_MARK = "JAXDIST_PJRT_NPROC"  # the value jaxdist set, seen by child processes


def configure() -> None:
    """Sets ``PJRT_NPROC`` to twice the simulated CPU devices if it can (see module doc).

    A value that a parent process's jaxdist set (inherited with the environment, e.g. by
    workers launched from a process with more devices) is sized again for this process.
    """
    current = os.environ.get("PJRT_NPROC")
    inherited = current is not None and current == os.environ.get(_MARK)
    if os.environ.get("JAXDIST_CPU_THREADS") == "0" or (current is not None and not inherited):
        return
    if backends_started():
        return
    n = _simulated_devices()
    if n < 2 or 2 * n <= (os.cpu_count() or 1):
        if inherited:  # XLA's default suits this process
            del os.environ["PJRT_NPROC"], os.environ[_MARK]
        return
    os.environ["PJRT_NPROC"] = os.environ[_MARK] = str(2 * n)
    _state["set_by"] = "jaxdist"


def cpu_threads() -> dict[str, Any]:
    """What jaxdist did to XLA's CPU thread pool, and its size.

    Returns a dict: ``threads`` (``PJRT_NPROC`` if set, else None for XLA's
    default of max(cores, devices)), ``set_by_jaxdist`` (True when jaxdist set
    it), ``backend_started`` (the pool is fixed once True).

    >>> import jaxdist as jd
    >>> sorted(jd.experimental.cpu_threads())
    ['backend_started', 'set_by_jaxdist', 'threads']
    """
    value = os.environ.get("PJRT_NPROC")
    return {
        "threads": int(value) if value and value.isdigit() else None,
        "set_by_jaxdist": _state["set_by"] == "jaxdist",
        "backend_started": backends_started(),
    }


def _process_cpu_devices() -> int:
    """How many CPU devices this process has (its backend is started when this is asked)."""
    try:
        return len(jax.devices("cpu"))
    except RuntimeError:  # pragma: no cover - no CPU backend
        return 0


def _requested_late() -> tuple[int, int] | None:
    """``(asked, got)`` when ``XLA_FLAGS`` asks for more simulated CPU devices than this
    process has: it was set after JAX started its backend (XLA reads it once, then)."""
    found = _FLAG.findall(os.environ.get("XLA_FLAGS", ""))
    try:
        configured = int(getattr(jax.config, "jax_num_cpu_devices", 0) or 0)
    except (ValueError, TypeError):  # pragma: no cover - an odd config value
        configured = 0
    if not found or configured > 0:
        return None
    try:
        got = len(jax.local_devices(backend="cpu"))
    except RuntimeError:  # pragma: no cover - no CPU backend
        return None
    asked = int(found[-1])
    return (asked, got) if asked > got else None


def check_requested() -> None:
    """Warns once when ``XLA_FLAGS`` asks for simulated CPU devices this process does not
    have (set after JAX started: the strategy silently gets fewer replicas)."""
    late = None if _state.get("warned_late") else _requested_late()
    if late is None:
        return
    _state["warned_late"] = True
    warnings.warn(
        f"XLA_FLAGS asks for {late[0]} simulated CPU devices, but this process has {late[1]}: "
        "XLA reads XLA_FLAGS once, when JAX starts its backend, and it was set after that, so "
        f"the strategy has {late[1]} CPU device(s). Set XLA_FLAGS before anything runs JAX "
        "(before importing jax and jaxdist), or call jax.config.update('jax_num_cpu_devices', "
        f"{late[0]}) before JAX starts.",
        RuntimeWarning,
        stacklevel=4,
    )


def check(num_cpu_devices: int) -> None:
    """Warns once when a strategy uses more simulated CPU devices than XLA's pool can
    run two programs of (the backend started before jaxdist could size it), and when
    ``XLA_FLAGS`` asked for devices the process does not have (`check_requested`)."""
    check_requested()
    if _state.get("warned") or num_cpu_devices < 2:
        return
    threads = cpu_threads()["threads"] or max(os.cpu_count() or 1, num_cpu_devices)
    if threads >= 2 * num_cpu_devices:
        return
    _state["warned"] = True
    total = _process_cpu_devices()
    whose = f" of this process's {total}" if total > num_cpu_devices else ""
    warnings.warn(
        f"XLA's CPU thread pool has {threads} threads for a strategy over {num_cpu_devices}"
        f"{whose} simulated CPU devices (JAX started its backend before jaxdist could size "
        "it). Un-blocked loops of "
        "jitted functions that return no distributed value may then abort at a collective's "
        f"rendezvous. Import jaxdist before JAX runs anything, or set PJRT_NPROC="
        f"{2 * num_cpu_devices} in the environment.",
        RuntimeWarning,
        stacklevel=4,
    )


configure()
