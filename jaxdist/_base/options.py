"""Option records: `RunOptions`, `CommunicationOptions`, `InputOptions` and their enums.

Each is a frozen dataclass; `check_*` functions validate them where they are used.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import numpy as np


class CommunicationImplementation(enum.Enum):
    """Which collective implementation to prefer, as in TF.

    On JAX, XLA picks the transport (NCCL on GPU, in-process or gloo on CPU);
    the value is validated and recorded.

    >>> import jaxdist as jd
    >>> [m.value for m in jd.experimental.CommunicationImplementation]
    ['AUTO', 'RING', 'NCCL']
    """

    AUTO = "AUTO"
    RING = "RING"
    NCCL = "NCCL"


def _parse_implementation(value: Any) -> CommunicationImplementation:
    if isinstance(value, CommunicationImplementation):
        return value
    if isinstance(value, str):
        try:
            return CommunicationImplementation(value.upper())
        except ValueError:
            pass
    names = ", ".join(m.name for m in CommunicationImplementation)
    raise ValueError(
        f"implementation must be a CommunicationImplementation ({names}); got {value!r}."
    )


@dataclasses.dataclass(frozen=True, init=False)
class CommunicationOptions:
    """Options for collectives, as `tf.distribute.experimental.CommunicationOptions`.

    Args:
        bytes_per_pack: split `batch_reduce` values into packs of about this many
            bytes, one collective per pack; 0 lets jaxdist choose.
        timeout_seconds: bound on a collective (multi-worker initialization and
            collectives); None for no bound.
        implementation: a `CommunicationImplementation` or its name.

    >>> import jaxdist as jd
    >>> jd.experimental.CommunicationOptions(bytes_per_pack=1024).bytes_per_pack
    1024
    """

    bytes_per_pack: int
    timeout_seconds: float | None
    implementation: CommunicationImplementation

    def __init__(
        self,
        bytes_per_pack: int = 0,
        timeout_seconds: float | None = None,
        implementation: CommunicationImplementation | str = CommunicationImplementation.AUTO,
    ) -> None:
        if not isinstance(bytes_per_pack, int) or isinstance(bytes_per_pack, bool):
            raise TypeError(f"bytes_per_pack must be an int; got {bytes_per_pack!r}.")
        if bytes_per_pack < 0:
            raise ValueError(f"bytes_per_pack must be non-negative; got {bytes_per_pack}.")
        if timeout_seconds is not None:
            if isinstance(timeout_seconds, bool) or not isinstance(timeout_seconds, (int, float)):
                raise TypeError(
                    f"timeout_seconds must be a number of seconds or None; got {timeout_seconds!r}."
                )
            if timeout_seconds <= 0:
                raise ValueError(f"timeout_seconds must be positive; got {timeout_seconds}.")
        object.__setattr__(self, "bytes_per_pack", bytes_per_pack)
        object.__setattr__(self, "timeout_seconds", timeout_seconds)
        object.__setattr__(self, "implementation", _parse_implementation(implementation))

    def merge(self, options: CommunicationOptions | None) -> CommunicationOptions:
        """These options overridden by the non-default fields of ``options``."""
        if options is None:
            return self
        default = CommunicationOptions()
        pick = {
            f.name: getattr(options, f.name)
            if getattr(options, f.name) != getattr(default, f.name)
            else getattr(self, f.name)
            for f in dataclasses.fields(self)
        }
        return CommunicationOptions(**pick)


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """Options of `Strategy.run`, as `tf.distribute.RunOptions` (recorded; XLA decides).

    >>> import jaxdist as jd
    >>> jd.RunOptions().experimental_enable_dynamic_batch_size
    True
    """

    experimental_enable_dynamic_batch_size: bool = True
    experimental_bucketizing_dynamic_shape: bool = False
    experimental_xla_options: Any = None


def check_communication_options(options: Any) -> None:
    """Raises a clear `TypeError` unless ``options`` is a `CommunicationOptions` or None."""
    if options is not None and not isinstance(options, CommunicationOptions):
        raise TypeError(
            "options must be a jaxdist.experimental.CommunicationOptions or None; "
            f"got {type(options).__name__}."
        )


AUTOTUNE_BUFFER = 2
"""The prefetch depth chosen for ``experimental_per_replica_buffer_size=-1``."""


class InputReplicationMode(enum.Enum):
    """How `Strategy.distribute_datasets_from_function` replicates the input pipeline.

    ``PER_WORKER``: ``dataset_fn`` is called once per worker (JAX process) and its
    local replicas take consecutive batches. ``PER_REPLICA``: ``dataset_fn`` is
    called once per replica and each replica reads its own dataset.

    >>> import jaxdist as jd
    >>> [m.value for m in jd.InputReplicationMode]
    ['PER_WORKER', 'PER_REPLICA']
    """

    PER_WORKER = "PER_WORKER"
    PER_REPLICA = "PER_REPLICA"


@dataclasses.dataclass(frozen=True)
class InputOptions:
    """Options of the distributed-input methods, as `tf.distribute.InputOptions`.

    The fields are checked when the options are used (as TF does), so invalid
    combinations raise from `Strategy.distribute_datasets_from_function` /
    `Strategy.experimental_distribute_dataset`.

    Args:
        experimental_fetch_to_device: place each replica's batch on its device
            (True; None means True, as in TF) or keep it as a host NumPy array.
        experimental_replication_mode: an `InputReplicationMode` (or its name).
        experimental_place_dataset_on_device: with ``PER_REPLICA`` and
            ``experimental_fetch_to_device=False``, still place the batches on
            the replicas' devices.
        experimental_per_replica_buffer_size: how many elements after the
            current one a distributed iterator keeps read and placed, so that
            their (asynchronous) transfers overlap the step; 0 disables
            prefetching, -1 lets jaxdist choose (2; TF's AUTOTUNE). TF 2.21
            never checks this field (-2, 1.5 or None are accepted and used
            as they come); jaxdist raises a clear error for a value that is
            not an int >= -1, when the options are used.

    ``str()`` and ``repr()`` are TF's namedtuple text:

    >>> import jaxdist as jd
    >>> jd.InputOptions(experimental_per_replica_buffer_size=2)
    InputOptions(experimental_fetch_to_device=True, \
experimental_replication_mode=<InputReplicationMode.PER_WORKER: 'PER_WORKER'>, \
experimental_place_dataset_on_device=False, experimental_per_replica_buffer_size=2)
    """

    experimental_fetch_to_device: bool = True
    experimental_replication_mode: InputReplicationMode = InputReplicationMode.PER_WORKER
    experimental_place_dataset_on_device: bool = False
    experimental_per_replica_buffer_size: int = 1

    def __post_init__(self) -> None:
        if self.experimental_fetch_to_device is None:  # TF's default spelling
            object.__setattr__(self, "experimental_fetch_to_device", True)
        mode = self.experimental_replication_mode
        if isinstance(mode, str) and mode.upper() in InputReplicationMode.__members__:
            object.__setattr__(
                self, "experimental_replication_mode", InputReplicationMode[mode.upper()]
            )


def check_input_options(options: Any, method: str) -> InputOptions:
    """``options`` (None: the defaults) after checking every field's type and value."""
    if options is None:
        return InputOptions()
    if not isinstance(options, InputOptions):
        raise TypeError(
            f"{method}: options must be a jaxdist.InputOptions or None; "
            f"got {type(options).__name__} {options!r}."
        )
    for name in ("experimental_fetch_to_device", "experimental_place_dataset_on_device"):
        value = getattr(options, name)
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"InputOptions.{name} must be a bool; got {value!r}.")
    mode = options.experimental_replication_mode
    if not isinstance(mode, InputReplicationMode):
        raise ValueError(
            "InputOptions.experimental_replication_mode must be an InputReplicationMode "
            f"(PER_WORKER or PER_REPLICA); got {mode!r}."
        )
    size = options.experimental_per_replica_buffer_size
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
        raise TypeError(
            "InputOptions.experimental_per_replica_buffer_size must be an int (elements to "
            f"prefetch; -1: automatic); got {size!r} (TF accepts it unchecked)."
        )
    if size < -1:
        raise ValueError(
            "InputOptions.experimental_per_replica_buffer_size must be >= 0 (or -1 for "
            f"automatic); got {size} (TF accepts it unchecked)."
        )
    return options


def check_dataset_fn_modes(options: InputOptions) -> None:
    """TF's checks of the replication-mode combinations of `distribute_datasets_from_function`."""
    mode = options.experimental_replication_mode
    place = options.experimental_place_dataset_on_device
    if mode is InputReplicationMode.PER_REPLICA and place and options.experimental_fetch_to_device:
        raise ValueError(
            "InputOptions: experimental_place_dataset_on_device can not be True when "
            "experimental_fetch_to_device is True and the replication mode is PER_REPLICA."
        )
    if mode is InputReplicationMode.PER_WORKER and place:
        raise ValueError(
            "InputOptions: experimental_place_dataset_on_device=True needs "
            "experimental_replication_mode=InputReplicationMode.PER_REPLICA."
        )


def buffer_size(options: InputOptions) -> int:
    """How many elements a distributed iterator keeps ahead (-1: jaxdist's choice, 2)."""
    size = int(options.experimental_per_replica_buffer_size)
    return AUTOTUNE_BUFFER if size == -1 else size
