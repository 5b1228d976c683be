"""The batches Keras' epoch iterator hands a strategy's step: the host's, as they are.

In a strategy's scope (and in a ``fit``/``evaluate``/``predict`` outside it, which enters the
scope of the model's strategy, TF's ``model.distribute_strategy``) Keras' distribution is a
`jaxdist._keras.distribution.StrategyDistribution`, whose data layout (`OneDeviceLayout`)
keeps a batch whole on the first replica device: jaxdist's step splits it TF's way and
places it itself (NumPy batches that split evenly go to its program as they are). Keras'
JAX epoch iterator, seeing a distribution, would place every array of every batch with that
layout first (``jax.make_array_from_process_local_data``: about 150 µs a step on CPU, half a
dispatch-bound model's step, for a copy the step does not need). So in a strategy's scope
the iterator gives the batches as Keras' own iterator gives them with no distribution: as
the data adapter yields them on CPU devices, and on an accelerator each placed on the first
replica device one batch ahead (Keras' look-ahead). One rule for every way in: ``fit`` in
the scope or outside it, ``evaluate``, ``predict``.

Private Keras API used: ``keras.src.backend.jax.trainer.JAXEpochIterator._get_iterator`` and
its ``data_adapter`` (covered by tests/keras_wing/test_keras.py and
tests/package/test_speed_guard.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import jax
import keras
from keras.src.backend.jax.trainer import JAXEpochIterator

_PATCHED: dict[str, Any] = {}


class OneDeviceLayout(keras.distribution.TensorLayout):
    """A data layout that keeps a host batch on one device (the step splits it TF's way)."""

    def __init__(self, sharding: jax.sharding.Sharding) -> None:
        super().__init__([None])
        self.sharding = sharding

    @property
    def backend_layout(self) -> jax.sharding.Sharding:
        return self.sharding


def install() -> None:
    """Wraps ``JAXEpochIterator._get_iterator`` once (see the module docstring)."""
    if _PATCHED:
        return
    _PATCHED["_get_iterator"] = original = JAXEpochIterator._get_iterator

    def _get_iterator(self: Any) -> Any:
        layout = getattr(keras.distribution.distribution(), "data_layout", None)
        if not isinstance(layout, OneDeviceLayout):
            return original(self)
        return host_batches(self.data_adapter.get_jax_iterator(), layout.sharding)

    _get_iterator.__doc__ = original.__doc__
    JAXEpochIterator._get_iterator = _get_iterator  # type: ignore[method-assign]


def host_batches(batches: Iterable[Any], sharding: jax.sharding.Sharding) -> Iterable[Any]:
    """``batches`` as a strategy's step takes them: as they are on CPU devices (Keras' own
    iterator makes no copy there either), else each placed with ``sharding`` one batch
    ahead, so that its transfer overlaps the step before.

    >>> import numpy as np
    >>> cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    >>> batches = [(np.ones(2), None)]
    >>> host_batches(batches, cpu) is batches
    True
    """
    devices: list[Any] = list(sharding.device_set)
    if all(d.platform == "cpu" for d in devices):
        return batches
    return _one_ahead(batches, sharding)


def _one_ahead(batches: Iterable[Any], sharding: jax.sharding.Sharding) -> Iterator[Any]:
    ahead = None
    for batch in batches:
        placed = jax.tree.map(lambda x: jax.device_put(x, sharding), batch)
        if ahead is not None:
            yield ahead
        ahead = placed
    if ahead is not None:
        yield ahead
