"""Objects passed in a step's arguments: state, read afresh as the step's own object is.

A TF program passes its model, trainer or optimizer to a step as often as it closes over
them (``strategy.run(train_step, args=(model, x))``, ``@tf.function def step(model,
x)``). Such an argument is not an array or a number, so it is a static argument of the
trace, by identity; but the arrays and numbers it holds are state like ``self.w``: read
at every call, and what the step assigns there written back. The places of a step's
state are chains from one root (`jaxdist._state.chains`); a call with such objects is
walked and read from `root`: the step function with those objects, one `StepArguments`
(a ``functools.partial`` whose function is the step and whose arguments are the objects,
so the walk, `chains.fetch` and `assign` know it already; called, it is the step, the
objects not prepended). The compiled steps
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
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax
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


def root(fn: Callable, found: Sequence[tuple[int, Any]], call: tuple | None = None) -> Callable:
    """Where ``fn``'s state is walked from and read at in a call passing the objects
    ``found`` (`objects`): ``fn`` itself when there are none. ``call``: ``(args, kwargs,
    is_leaf)`` as the leaves were flattened, to name an object as the step's parameter."""
    if not found or _replica.is_explicit(fn):  # (jaxdist's Keras steps: state as arguments)
        return fn
    out = StepArguments(fn, *(x for _, x in found))
    out.at = tuple(i for i, _ in found)
    if call is not None:
        out.named = functools.partial(argument_name, fn, *call)
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
    """``value`` as a static argument's key: an object holding state by identity
    (`ByIdentity`: its own ``__eq__`` and ``__hash__`` never run, and two equal objects
    are two objects, each read for itself), a value (`holds_state` False) by itself;
    raises `TypeError` for an unhashable value (a set)."""
    if holds_state(value) and not _peek.is_a(value, (set, list, dict)):
        return ByIdentity(value)
    hash(value)
    return value


def value(static: Any) -> Any:
    """The argument a static key (`key`) stands for."""
    return static.value if type(static) is ByIdentity else static


def argument_name(fn: Callable, args: Any, kwargs: Any, is_leaf: Any, index: int) -> str:
    """The argument leaf ``index`` of ``fn(*args, **kwargs)`` as the step names it: its
    parameter and the path inside it (``model``, ``batch['cfg']``, ``args[3]``).

    >>> def step(x, model, *more, lr=0.1):
    ...     pass
    >>> [argument_name(step, (1, {"a": 2}, 3), {"lr": 4}, None, i) for i in range(4)]
    ['x', "model['a']", 'more[0]', 'lr']
    """
    paths = jax.tree_util.tree_flatten_with_path((tuple(args), dict(kwargs)), is_leaf=is_leaf)[0]
    path = paths[index][0]
    rest = jax.tree_util.keystr(tuple(path[2:]))
    if getattr(path[0], "idx", 1) == 1:  # a keyword argument
        return f"{getattr(path[1], 'key', path[1])}{rest}"
    i = path[1].idx
    return f"{_positional(fn, i)}{rest}"


def _positional(fn: Callable, i: int) -> str:
    """The name of the ``i``-th positional parameter of ``fn`` (``args[i]`` if unknown)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return f"args[{i}]"
    for k, p in enumerate(params):
        if p.kind is p.VAR_POSITIONAL:
            return f"{p.name}[{i - k}]"
        if k == i and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            return p.name
    return f"args[{i}]"
