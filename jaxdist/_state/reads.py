"""What a step's trace says about the state it read that stays a constant, or was stored.

`jaxdist._state.stage` traces a step once and makes the arrays of its state inputs of
the program; what it cannot find there stays a constant, and a value the step stored in
its state during the trace would be stored once. A trace says so, and this module holds
the words: a warning for the JAX arrays that existed before the trace but are not where
jaxdist looks (`warn_unfound_arrays`), a warning for the NumPy arrays a step computed from
NumPy state (`warn_numpy_copies`), and the error for a tracer stored in the state
(`stored_tracer`). Apart from the trace itself, which decides when to say them.

>>> def step(x):
...     return x
>>> print(stored_tracer(step, "self.w"))  # doctest: +ELLIPSIS
The step ... stored a value it computed in self.w (a JAX tracer): ...
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import jax
import numpy as np

from jaxdist._base.validate import describe
from jaxdist._state import chains as _chains


def warn_unfound_arrays(fn: Callable, unfound: list) -> None:
    """Warns once per trace where the step read JAX arrays that existed before its trace
    but are not where jaxdist looks for state (an installed package's global, an object
    reached only through a C extension or a call it cannot follow): each stays a
    constant of the program."""
    arrays = [c for c in unfound if isinstance(c, jax.Array)]
    if not arrays:
        return
    what = ", ".join(f"{c.dtype}{list(c.shape)}" for c in arrays[:3])
    warnings.warn(
        f"The step {describe(fn)} read {len(arrays)} JAX array(s) ({what}) that jaxdist "
        "could not find in the state it can reach from the step (its closure, globals, "
        "object and what they hold): an installed package's global, or an object reached "
        "only through a call. Each is a constant of the compiled step, so a later change "
        "is not seen. Pass it to strategy.run as an argument, or keep it on the step's "
        "object or in a global of your program.",
        RuntimeWarning,
        stacklevel=5,
    )


def warn_numpy_copies(fn: Callable, unfound: list, strided: list) -> None:
    """Warns once per trace where a step whose state holds NumPy arrays made a NumPy
    array jaxdist cannot trace back to it (``np.exp(self.w)``, a view of a Fortran-ordered
    or strided array that JAX copied): it stays a constant of the program."""
    copies = [c for c in unfound if isinstance(c, np.ndarray)]
    if not copies:
        return
    what = ", ".join(f"{c.dtype}{list(c.shape)}" for c in copies[:3])
    if strided:
        what += f"; perhaps views of {', '.join(strided[:3])} (not C-contiguous: copied)"
    warnings.warn(
        f"The step {describe(fn)} reads NumPy arrays from its state and computed "
        f"{len(copies)} NumPy array(s) ({what}) that are not in it (np.exp(self.w), "
        "x.astype(...), a view of a Fortran-ordered or strided array): each is a constant "
        "of the compiled step, so a later change of the data it came from is not seen. "
        "Use jax.numpy on the state instead (jnp.exp(self.w), jnp.asarray(table)[1]), "
        "or pass the result to strategy.run as an argument.",
        RuntimeWarning,
        stacklevel=5,
    )


def warn_drawn(fn: Callable, where: list) -> None:
    """Warns once per trace where the step read an iterator or a random generator of its
    state (``next(self.schedule)``, ``self.rng.normal()``: `jaxdist._state.record`): what
    the trace took from it was taken once, when it was traced, and every call of the
    program reuses it."""
    if not where:
        return
    names = ", ".join(_chains.describe_safely(fn, c) for c in where[:3])
    warnings.warn(
        f"The step {describe(fn)} takes values from {names} (an iterator or a random "
        "generator) while it is traced: what it took is a constant of the compiled step, "
        "the same on every call. Draw the values outside the step and pass them to "
        "strategy.run as arguments (or use jax.random with a key passed in).",
        RuntimeWarning,
        stacklevel=5,
    )


def stored_tracer(fn: Callable, where: str) -> RuntimeError:
    return RuntimeError(
        f"The step {describe(fn)} stored a value it computed in {where} (a JAX "
        "tracer): jaxdist traces the step once, so an assignment inside it does not "
        "happen on every call, and the stored tracer is invalid once the trace ends. "
        f"Return the new value from the step and assign it after strategy.run "
        f"({where} = strategy.run(...)), as with a tf.Variable's assign, or make the "
        "function that calls strategy.run a jd.function, which writes back what it assigns."
    )
