"""Errors in the user's step, told in the user's words: which step, which line, what to do.

A step given to `Strategy.run` is traced once for every replica, so its values are tracers,
not numbers: a Python ``if`` on one (``if loss > 0:``), ``int(x)`` or ``range(n)`` of one
fails inside JAX with a message that names JAX's and jaxdist's frames. `raise_for_step`
turns such an error into a `TypeError` that names the step, the file and line of the user's
code where the value was used, and the fix. Layer 0: JAX and the standard library only.
"""

from __future__ import annotations

import os
import sys
import traceback
from types import TracebackType
from typing import Any, NoReturn

import jax
import jaxlib

# What JAX raises when Python needs a concrete value of a traced one.
CONCRETE_VALUE_ERRORS: tuple[type[BaseException], ...] = (
    jax.errors.TracerBoolConversionError,
    jax.errors.TracerIntegerConversionError,
    jax.errors.ConcretizationTypeError,
)

# What `is_step_error` looks among (a traced shape is JAX's TypeError).
STEP_ERRORS: tuple[type[BaseException], ...] = (*CONCRETE_VALUE_ERRORS, TypeError)

_JAXDIST = sys.modules[__name__.partition(".")[0]]  # the package, wherever this module is
_NOT_THE_USERS = tuple(
    os.path.dirname(os.path.abspath(m.__file__ or "")) + os.sep for m in (jax, jaxlib, _JAXDIST)
)

_FIX = {
    jax.errors.TracerBoolConversionError: (
        "a Python bool of a traced value (an if, while, and/or, or bool() on it). Branch on "
        "values with jnp.where(cond, a, b), or lax.cond(cond, true_fn, false_fn, *operands) "
        "for code; loop with lax.while_loop / lax.fori_loop"
    ),
    jax.errors.TracerIntegerConversionError: (
        "a Python int of a traced value (int(), range(), or an index taken from it). Keep it "
        "an array (jnp indexing, lax.dynamic_slice), or loop with lax.fori_loop"
    ),
}
_SHAPE_FIX = (
    "a Python int of a traced value as a shape (jnp.zeros(k), reshape): a number passed in "
    "args is traced, as jax.jit traces it, and strategy.run takes no static_argnums. Bind it "
    "with functools.partial(step, k=3) (a static number: each value compiles once), or close "
    "over it (a number the step closes over or reads from self is not static: it is re-read "
    "on every call, and traced again when it changes where a shape needs its value)"
)
_CONCRETE_FIX = (
    "a concrete number of a traced value (a shape, a size or a Python number computed from "
    "it). Compute with jnp / lax on the array instead (jnp.where, lax.cond)"
)


def is_shape_error(error: BaseException) -> bool:
    """Whether ``error`` is JAX's for a traced value used as a shape (``jnp.zeros(k)``)."""
    return isinstance(error, TypeError) and "Shapes must be 1D sequences of concrete" in str(error)


def is_step_error(error: BaseException) -> bool:
    """Whether `raise_for_step` words ``error``: a concrete-value error or a traced shape."""
    return isinstance(error, CONCRETE_VALUE_ERRORS) or is_shape_error(error)


def _where(error: BaseException) -> str:
    frame = user_frame(error.__traceback__)
    if frame is None:
        return ""
    return f" at {frame.filename}:{frame.lineno}" + (
        f" ({frame.line.strip()})" if frame.line else ""
    )


def user_frame(tb: TracebackType | None) -> traceback.FrameSummary | None:
    """The innermost frame of ``tb`` that is neither JAX's nor jaxdist's (the user's line).

    >>> import sys
    >>> try:
    ...     int("x")
    ... except ValueError:
    ...     frame = user_frame(sys.exc_info()[2])
    >>> frame.name
    '<module>'
    """
    for frame in reversed(traceback.extract_tb(tb)):
        if not os.path.abspath(frame.filename).startswith(_NOT_THE_USERS):
            return frame
    return None


def step_name(fn: Any) -> str:
    """How the user knows their step: its qualified name, else its repr."""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return name if isinstance(name, str) else repr(fn)


def raise_for_step(fn: Any, error: BaseException) -> NoReturn:
    """Raises a `TypeError` from ``error`` (one of `CONCRETE_VALUE_ERRORS`) naming the step
    ``fn``, the user's file and line, and the fix.

    >>> import jax
    >>> def step(x):
    ...     return x if x > 0 else -x
    >>> try:
    ...     try:
    ...         jax.jit(step)(1.0)
    ...     except jax.errors.TracerBoolConversionError as e:
    ...         raise_for_step(step, e)
    ... except TypeError as error:
    ...     message = str(error)
    >>> message.startswith("strategy.run(step): the step at <doctest"), "jnp.where" in message
    (True, True)
    """
    where = _where(error)
    fix = next((text for kind, text in _FIX.items() if isinstance(error, kind)), _CONCRETE_FIX)
    if is_shape_error(error):
        fix = _SHAPE_FIX
    raise TypeError(
        f"strategy.run({step_name(fn)}): the step{where} needs {fix}. The step is traced once "
        "for every replica, so its values are traced arrays, not Python numbers; a value that "
        "should stay a Python constant can be closed over (or given as a bool, str or None) "
        f"instead of passed as an array. (JAX's error: {type(error).__name__})"
    ) from error


def raise_for_function(fn: Any, error: BaseException) -> NoReturn:
    """Raises a `TypeError` from ``error`` (`is_step_error`) raised while a ``jd.function`` of
    ``fn`` was traced with an array where its Python needs a number (``range(steps)``,
    ``jnp.zeros(k)``): names the user's line and the fix.

    >>> import jax, jax.numpy as jnp
    >>> def train(x, steps):
    ...     for _ in range(steps):
    ...         x = x + 1
    ...     return x
    >>> try:
    ...     try:
    ...         jax.jit(train)(1.0, jnp.asarray(3))
    ...     except jax.errors.TracerIntegerConversionError as e:
    ...         raise_for_function(train, e)
    ... except TypeError as error:
    ...     message = str(error)
    >>> message.startswith("jd.function(train): the function at <doctest"), "fori_loop" in message
    (True, True)
    """
    raise TypeError(
        f"jd.function({step_name(fn)}): the function{_where(error)} needs a Python number of "
        "an array argument (a loop count, a shape): the function's array arguments are traced. "
        "Pass a Python int (a number argument of a jd.function is static where its value is "
        "needed, as in tf.function: each value traces once), or keep it an array and loop with "
        "lax.fori_loop(0, steps, body, x) / lax.while_loop (shapes must be Python ints). "
        f"(JAX's error: {type(error).__name__})"
    ) from error
