"""Objects passed in a step's arguments: state, read afresh as the step's own object is.

A TF program passes its model, trainer or optimizer to a step as often as it closes over
them (``strategy.run(train_step, args=(model, x))``, ``@tf.function def step(model,
x)``). Such an argument is not an array or a number, so it is a static argument of the
trace, by identity; but the arrays and numbers it holds are state like ``self.w``: read
at every call, and what the step assigns there written back. The places of a step's
state are chains from one root (`jaxdist._state.chains`); a call with such objects is
walked and read from `root`: the step function with those objects, one `StepArguments`
(a ``functools.partial`` never called: its function is the step, its arguments the
objects, so the walk, `chains.fetch` and `assign` know it already). The compiled steps
stay cached on the step function itself (the objects are in their key), so a new root
per call costs one small object.

Values that hold no state are not walked: ``None``, bools, strings and bytes, numbers,
Enum members, dtypes, ranges and slices (all static by their value).

>>> class Model:
...     w = 1.0
>>> def step(x, m):
...     return x * m.w
>>> m = Model()
>>> root(step, [(1, m)]).args == (m,)
True
>>> root(step, []) is step, holds_state(m), holds_state("relu")
(True, True, False)
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from jaxdist._state import peek as _peek
from jaxdist._state import replica as _replica
from jaxdist._state.chains import StepArguments, step_of

__all__ = [
    "ByIdentity",
    "StepArguments",
    "holds_state",
    "key",
    "objects",
    "root",
    "step_of",
    "value",
]

_VALUES = (
    type(None),
    bool,
    str,
    bytes,
    int,
    float,
    complex,
    enum.Enum,
    np.generic,
    np.dtype,
    range,
    slice,
    type(Ellipsis),
    frozenset,
)


def holds_state(value: Any) -> bool:
    """Whether a static argument can hold state the step reads (an object, a function, a
    class), rather than being a value that is all its meaning (`_VALUES`)."""
    return not _peek.is_a(value, _VALUES)


def objects(leaves: Sequence[Any], static: Sequence[bool]) -> list[tuple[int, Any]]:
    """``[(leaf index, object)]`` of the static leaves that can hold state."""
    return [(i, x) for i, (x, s) in enumerate(zip(leaves, static)) if s and holds_state(x)]


def root(fn: Callable, found: Sequence[tuple[int, Any]]) -> Callable:
    """Where ``fn``'s state is walked from and read at in a call passing the objects
    ``found`` (`objects`): ``fn`` itself when there are none."""
    if not found or _replica.is_explicit(fn):  # (jaxdist's Keras steps: state as arguments)
        return fn
    out = StepArguments(fn, *(x for _, x in found))
    out.at = tuple(i for i, _ in found)
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", "step")
    vars(out)["__qualname__"] = name  # (messages name the step: `describe`)
    return out


class ByIdentity:
    """An unhashable object that holds state (a ``@dataclass`` model config), as a static
    argument's key: by identity, since what it holds is read at every call anyway."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __hash__(self) -> int:
        return id(self.value)

    def __eq__(self, other: object) -> bool:
        return type(other) is ByIdentity and other.value is self.value


def key(value: Any) -> Any:
    """``value`` as a static argument's key: itself where hashable, else `ByIdentity`
    where it holds state; raises `TypeError` for an unhashable value (a set)."""
    try:
        hash(value)
    except TypeError:
        if not holds_state(value) or _peek.is_a(value, (set, list, dict)):
            raise
        return ByIdentity(value)
    return value


def value(static: Any) -> Any:
    """The argument a static key (`key`) stands for."""
    return static.value if type(static) is ByIdentity else static
