"""Devices: TF-style device strings, and the `Replicas` record of a strategy's topology.

`Replicas` is the one immutable description of where a strategy's replicas live
(devices, which are this process's, the stacked-value sharding, the first
device, whether they are CPUs); every other module reads topology from it.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxdist._base.cpu_threads import configure as configure_cpu_threads

AXIS = "replica"
"""The name of the replica axis inside `Strategy.run`, for raw `jax.lax` collectives."""

_DEVICE_RE = re.compile(
    r"^(?:/job:(?P<job>[^/]+))?(?:/replica:(?P<replica>\d+))?(?:/task:(?P<task>\d+))?"
    r"(?:/device:|/)?(?P<type>[A-Za-z_]+):(?P<index>\d+)$"
)
_PLATFORMS = {"cpu": "cpu", "gpu": "gpu", "tpu": "tpu", "cuda": "gpu", "rocm": "gpu"}


def local_devices() -> list[jax.Device]:
    """`jax.local_devices()`, sizing XLA's CPU pool first if the backend has not started."""
    configure_cpu_threads()
    return list(jax.local_devices())


def _platform_devices(platform: str) -> list[jax.Device]:
    configure_cpu_threads()  # before JAX's backend starts, if it has not yet
    try:
        return list(jax.devices(platform))
    except RuntimeError:
        return []


def resolve_device(spec: Any, arg: str = "device") -> jax.Device:
    """Returns the `jax.Device` named by a TF-style string or a `jax.Device`.

    Accepted strings: ``"/cpu:0"``, ``"cpu:0"``, ``"/device:CPU:0"``, ``"/gpu:1"``,
    ``"/job:localhost/replica:0/task:0/device:GPU:0"``. The index counts devices of
    that kind in the task (JAX process) named by ``/task:N`` (default: this
    process).

    Raises:
        ValueError: when the string is malformed or names no device here.
        TypeError: when ``spec`` is neither a string nor a `jax.Device`.
    """
    if isinstance(spec, jax.Device):
        return spec
    if not isinstance(spec, str):
        raise TypeError(
            f"{arg} must be a device string such as '/cpu:0' or a jax.Device; "
            f"got {type(spec).__name__} {spec!r}."
        )
    m = _DEVICE_RE.match(spec.strip())
    kind = _PLATFORMS.get(m.group("type").lower()) if m else None
    if m is None or kind is None:
        raise ValueError(
            f"{arg}={spec!r} is not a device string; expected e.g. '/cpu:0', "
            "'/device:GPU:1' or '/job:localhost/replica:0/task:0/device:CPU:0'."
        )
    task = int(m.group("task")) if m.group("task") else jax.process_index()
    candidates = [d for d in _platform_devices(kind) if d.process_index == task]
    index = int(m.group("index"))
    if index >= len(candidates):
        raise ValueError(
            f"{arg}={spec!r} names {kind.upper()} device {index} of task {task}, but "
            f"that task has {len(candidates)} {kind.upper()} device(s) "
            f"(jax.devices(): {jax.devices()})."
        )
    return candidates[index]


def resolve_devices(specs: Any, arg: str = "devices") -> tuple[jax.Device, ...]:
    """Resolves a non-empty sequence of device specs, rejecting duplicates."""
    if isinstance(specs, (str, jax.Device)):
        specs = [specs]
    if not isinstance(specs, Sequence):
        raise TypeError(
            f"{arg} must be a list of device strings or jax.Device objects; "
            f"got {type(specs).__name__}."
        )
    if len(specs) == 0:
        raise ValueError(f"{arg} must name at least one device; got an empty list.")
    devices = tuple(resolve_device(s, f"{arg}[{i}]") for i, s in enumerate(specs))
    if len(set(devices)) != len(devices):
        seen = [d for i, d in enumerate(devices) if d in devices[:i]]
        raise ValueError(f"{arg} must not repeat a device; {seen[0]} appears more than once.")
    return devices


def check_one_platform(devices: Sequence[Any], arg: str = "devices") -> None:
    """Raises `ValueError` when ``devices`` span several platforms (a GPU and the CPU).

    One replicated program runs on one platform: XLA compiles it for one backend, and
    its collectives do not cross backends (TF accepts ``["/gpu:0", "/cpu:0"]`` and
    copies between them; JAX fails later with "DeviceList contains non-IFRT devices").

    >>> import jax
    >>> check_one_platform(jax.devices("cpu")[:2])
    """
    platforms = sorted({d.platform for d in devices})
    if len(platforms) > 1:
        named = ", ".join(f"{d.platform}:{d.id}" for d in devices)
        raise ValueError(
            f"{arg} must all be on one platform; got {' and '.join(platforms)} devices "
            f"({named}). A replicated step is one program for one platform, and JAX's "
            "collectives do not span platforms. Give the devices of one platform (e.g. "
            "every GPU), and move values between platforms outside the step "
            "(jax.device_put)."
        )


def device_string(device: jax.Device) -> str:
    """The TF-style name of a device, e.g. ``/job:localhost/replica:0/task:0/device:CPU:3``."""
    same = [
        d for d in _platform_devices(device.platform) if d.process_index == device.process_index
    ]
    index = same.index(device) if device in same else device.id
    job = "localhost" if jax.process_count() == 1 else "worker"
    return (
        f"/job:{job}/replica:0/task:{device.process_index}/device:{device.platform.upper()}:{index}"
    )


def replica_sharding(devices: Sequence[jax.Device]) -> NamedSharding:
    """The sharding of a stacked value: leading axis split over ``devices``."""
    return _replica_sharding(tuple(devices))


@functools.lru_cache(maxsize=64)
def _replica_sharding(devices: tuple) -> NamedSharding:
    return NamedSharding(Mesh(np.asarray(devices), (AXIS,)), PartitionSpec(AXIS))


@dataclasses.dataclass(frozen=True)
class Replicas:
    """Where a strategy's replicas live: one device per replica, in replica order.

    With several JAX processes (multi-worker) ``devices`` spans every process and
    ``local`` holds the positions of this process's devices.
    """

    devices: tuple[jax.Device, ...]
    local: tuple[int, ...]

    @classmethod
    def of(cls, devices: Sequence[jax.Device]) -> Replicas:
        devices = tuple(devices)
        me = jax.process_index() if jax.process_count() > 1 else None
        local = tuple(i for i, d in enumerate(devices) if me is None or d.process_index == me)
        return cls(devices, local)

    @property
    def num(self) -> int:
        """How many replicas (devices) there are in all."""
        return len(self.devices)

    @property
    def multi_process(self) -> bool:
        """Whether some replicas live in other JAX processes."""
        return len(self.local) != len(self.devices)

    @property
    def local_devices(self) -> tuple[jax.Device, ...]:
        return tuple(self.devices[i] for i in self.local)

    @property
    def first_device(self) -> jax.Device:
        """Where cross-replica results go: this process's first replica device."""
        return self.devices[self.local[0]]

    @property
    def on_cpu(self) -> bool:
        return self.devices[0].platform == "cpu"

    @functools.cached_property
    def sharding(self) -> NamedSharding:
        """The sharding of stacked values: one leading row per replica device."""
        return replica_sharding(self.devices)

    @functools.cached_property
    def replicated(self) -> NamedSharding:
        """The sharding of a value held whole on every replica device."""
        return NamedSharding(self.sharding.mesh, PartitionSpec())

    def replicate(self, x: Any) -> jax.Array:
        """``x`` whole on every replica device (`replicated`): ``x`` itself when it is
        a JAX array held so already (a step's output on one device is: its sharding is
        equivalent, and a `jax.device_put` would cost a new array object each call)."""
        if isinstance(x, jax.Array):
            sharding = x.sharding
            if self._same.get(id(sharding)) is sharding:
                return x
            if sharding in self._alike or sharding.is_equivalent_to(self.replicated, x.ndim):
                if len(self._alike) < 16:  # (a step's outputs: one or two kinds of sharding)
                    self._alike.add(sharding)
                if len(self._same) < 4096:
                    self._same[id(sharding)] = sharding
                return x
        return jax.device_put(x, self.replicated)

    @functools.cached_property
    def _alike(self) -> set:
        """Shardings found equivalent to `replicated` (a set lookup costs less than
        `jax.sharding.Sharding.is_equivalent_to`, which `replicate` runs on every leaf)."""
        return {self.replicated}

    @functools.cached_property
    def _same(self) -> dict[int, Any]:
        """The sharding objects found equivalent, by identity (kept alive here, so that an
        ``id`` is not reused): a program's output keeps its sharding object from call to
        call, and a dict read by ``id`` costs less than the sharding's hash and equality."""
        return {id(self.replicated): self.replicated}

    def strings(self, local_only: bool = False) -> tuple[str, ...]:
        """The devices as TF-style strings (this process's only, with ``local_only``)."""
        devices = self.local_devices if local_only else self.devices
        return tuple(device_string(d) for d in devices)
