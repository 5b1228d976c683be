"""One replica as its own topology: a step compiled without a stacked replica axis.

`jax.pmap` gives every output a leading replica axis, so on one device each leaf of
a step's result used to be unstacked by its own eager ``reshape`` (TF unwraps one
replica's results to plain values): one dispatch per leaf. Here the step (the
per-replica program `jaxdist._stage.Staged` traced) is mapped with `jax.vmap` over a
replica axis of size one inside one `jax.jit`, which adds and removes that axis
itself: an eager call is one cached dispatch (the C++ fast path of `jax.jit`) whose
outputs are already plain arrays, and a collective over the one replica is a
reduction over an axis of size one, which XLA removes (no ``all-reduce`` is left in
the program, where XLA's CPU compiler keeps a one-member one under `jax.pmap`).

A distributed argument enters as its stacked array (shape ``(1, *shape)``) and is
unstacked inside the program; which arguments are stacked is a static argument of
the `jax.jit`, so a `PerReplica` and a plain array share one trace of the step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jaxdist._devices import AXIS, Replicas


def vmapped(fn: Callable, in_axes: Sequence[int | None]) -> Callable:
    """``fn`` mapped over a replica axis of size one (`jax.pmap`'s calling convention:
    ``in_axes`` 0 for a stacked argument, None for a broadcast one; outputs stacked).

    A broadcast argument stays unbatched, so what is computed from it alone is the
    same program as without the map (no batch axis of size one through the dots), and
    a collective of it over the one replica is the value itself.

    >>> import jax.numpy as jnp
    >>> from jax import lax
    >>> f = vmapped(lambda x, y: [lax.psum(x * y, "replica")], (0, None))
    >>> f(jnp.ones((1, 2)), 3.0)[0].tolist()
    [[3.0, 3.0]]
    """
    return jax.vmap(fn, in_axes=tuple(in_axes), axis_name=AXIS, axis_size=1)


def program(evaluate: Callable, replicas: Replicas) -> Program:
    """The compiled one-replica step (see `Program`)."""
    return Program(evaluate, replicas.first_device)


class Program:
    """``program(stacked, *args)`` runs ``evaluate`` (the per-replica program, with the
    replica ids as its first argument) on ``args``, where ``stacked[i]`` says that
    ``args[i]`` carries a leading replica axis of size one. It returns a list of plain
    (unstacked) arrays committed to ``device``, in one dispatch.
    """

    def __init__(self, evaluate: Callable, device: jax.Device) -> None:
        self._device = jax.sharding.SingleDeviceSharding(device)

        def run(stacked: tuple, *args: Any) -> list:
            ids = jnp.zeros((1,), jnp.int32)
            axes = (0, *(0 if s else None for s in stacked))
            outs = vmapped(evaluate, axes)(ids, *args)
            return [o[0] for o in outs]

        self._jitted = jax.jit(run, static_argnums=0, out_shardings=self._device)

    def __call__(self, stacked: tuple, *args: Any) -> list:
        try:
            return self._jitted(stacked, *args)
        except ValueError:  # an argument committed to another device (pmap moved it)
            device = self._device
            moved = [jax.device_put(a, device) if isinstance(a, jax.Array) else a for a in args]
            return self._jitted(stacked, *moved)

    def lower(self, stacked: tuple, *args: Any) -> Any:
        """The program lowered for these arguments (`jax.stages.Lowered`), to inspect."""
        return self._jitted.lower(stacked, *args)
