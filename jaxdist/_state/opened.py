"""A plain ``@dataclass`` a step assigns, opened as a pytree for the write-back.

``self.state = State(w - lr * g, step + 1)`` with ``State`` a dataclass JAX was never told
about: to JAX the object is one leaf, so the values the trace computed inside it would be
dead tracers after the call. `flatten` opens such an object (a dataclass instance holding
a value of the running trace, with an instance dictionary) into a node of its own whose
children are its instance dictionary's entries; `unflatten` makes a new object of the
same class from the program's values after each call, as ``copy.copy`` then setting
those attributes would, without running the class's code (no ``__init__``,
``__post_init__``, ``__setattr__`` or ``__copy__``: the values are the ones the trace's
object held). Any other object stays a leaf (an object that is not a dataclass, or
has slots only, holding a computed value is refused: `jaxdist._state.assign`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from jaxdist._state import peek as _peek


class Opened:
    """A dataclass object as a pytree node: its class, and its instance dictionary's keys
    and values (the values are the children).

    >>> import dataclasses
    >>> @dataclasses.dataclass
    ... class State:
    ...     w: float
    ...     step: int
    >>> node = Opened(State, ("w", "step"), (0.5, 3))
    >>> jax.tree.leaves(node)
    [0.5, 3]
    >>> node.made()
    State(w=0.5, step=3)
    """

    def __init__(self, kind: type, keys: tuple, values: tuple) -> None:
        self.kind, self.keys, self.values = kind, keys, values

    def made(self) -> Any:
        """A new object of the class holding these values (its code not run)."""
        obj: Any = object.__new__(self.kind)
        own = _peek.instance_dict(obj)
        if own is None:  # (`opens` accepted the class for having one)
            raise TypeError(f"{self.kind.__name__} objects have no instance dictionary")
        own.update(zip(self.keys, self.values))
        return obj


jax.tree_util.register_pytree_node(
    Opened,
    lambda n: (n.values, (n.kind, n.keys)),
    lambda aux, values: Opened(aux[0], aux[1], tuple(values)),
)


def opens(obj: Any, holds: Callable[[Any], bool]) -> bool:
    """Whether ``obj`` is a dataclass instance JAX keeps as a leaf, with an instance
    dictionary, that ``holds`` a value of the running trace."""
    kind = type(obj)
    if isinstance(obj, type) or _peek.type_lookup(kind, "__dataclass_fields__") is None:
        return False
    if not jax.tree_util.all_leaves([obj]) or _peek.instance_dict(obj) is None:
        return False
    return holds(obj) and kind.__new__ is object.__new__


def flatten(value: Any, holds: Callable[[Any], bool]) -> tuple[list, Any]:
    """``jax.tree.flatten(value)`` with the dataclass objects `opens` accepts opened: the
    leaves, and a treedef whose ``unflatten`` makes those objects again (`Reopened`)."""
    opened = _open(value, holds, 4)
    leaves, treedef = jax.tree.flatten(opened)
    return leaves, (treedef if opened is value else Reopened(treedef))


def _open(value: Any, holds: Callable[[Any], bool], depth: int) -> Any:
    if depth == 0:
        return value
    found = False

    def one(leaf: Any) -> Any:
        nonlocal found
        if not opens(leaf, holds):
            return leaf
        found = True
        own = dict(_peek.instance_dict(leaf) or {})
        values = tuple(_open(v, holds, depth - 1) for v in own.values())
        return Opened(type(leaf), tuple(own), values)

    out = jax.tree.map(one, value)
    return out if found else value


class Reopened:
    """The treedef of a value with opened objects: ``unflatten`` gives new objects of their
    classes in their places."""

    def __init__(self, treedef: Any) -> None:
        self.treedef = treedef

    def unflatten(self, leaves: Any) -> Any:
        return _made(self.treedef.unflatten(list(leaves)))


def _made(value: Any) -> Any:
    def one(node: Any) -> Any:
        if not isinstance(node, Opened):
            return node
        return Opened(node.kind, node.keys, tuple(_made(v) for v in node.values)).made()

    return jax.tree.map(one, value, is_leaf=lambda x: isinstance(x, Opened))
