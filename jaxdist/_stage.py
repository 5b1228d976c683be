"""A step traced once, whose captured state is read again on every eager call.

`Staged` traces a step body to a jaxpr (`jax.make_jaxpr`, with the replica axis
bound when the body uses collectives). The arrays the body read from outside
its arguments are the jaxpr's constants; those that `jaxdist._capture.locate`
finds in the step's state become inputs of the program, fetched afresh on every
call (`Staged.inputs`), so an eager step never computes with a stale array and
is not traced again when only their values change. The program itself is
`Staged.evaluate`, which jaxdist then maps over the replicas (`jax.pmap`) or
compiles (`jax.jit`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend.core import ClosedJaxpr, jaxpr_as_fun

from jaxdist import _capture
from jaxdist._layout import is_tracer


def _spec(x: Any) -> Any:
    aval = jax.typeof(x)
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=getattr(aval, "weak_type", False))


def example(x: Any, mapped: bool) -> Any:
    """The abstract value of one replica's part of ``x`` (a row when ``mapped``)."""
    spec = _spec(x)
    if mapped:
        return jax.ShapeDtypeStruct(spec.shape[1:], spec.dtype, weak_type=spec.weak_type)
    return spec


def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray)) and not is_tracer(x)


class Staged:
    """``body`` traced once on ``examples``; what it read from ``fn``'s state is an input.

    Args:
        fn: the user's step function (where captured state is looked for).
        body: the function to trace; takes the flat arguments, returns a list of arrays.
        examples: abstract values of the arguments.
        axis_env: ``[(axis_name, size)]`` when ``body`` uses collectives.
        outputs: a function giving, after the trace, the arrays ``body`` returned
            that are not traced (read again on every call too, when found).
    """

    def __init__(
        self,
        fn: Callable,
        body: Callable[..., list],
        examples: Sequence[Any],
        axis_env: list | None = None,
        outputs: Callable[[], list] = list,
    ) -> None:
        closed = jax.make_jaxpr(body, axis_env=axis_env or [])(*examples)
        consts = list(closed.consts)
        out_consts = [x for x in outputs() if _is_array(x)]
        chains = _capture.locate(fn, consts + out_consts) if consts or out_consts else []
        lifted = [(i, c) for i, c in enumerate(chains[: len(consts)]) if c is not None]
        self._lifted = [(i, c, np.shape(consts[i]), consts[i].dtype) for i, c in lifted]
        for i, _ in lifted:
            consts[i] = None  # not kept: read again on every call
        self._consts = consts
        self._jaxpr = closed.jaxpr
        self._outs = {
            id(x): c for x, c in zip(out_consts, chains[len(consts) :]) if c is not None
        }
        self._watched = _capture.watch(fn)
        self._placed: list = [None] * len(self._lifted)
        self.num_inputs = len(self._lifted)

    def evaluate(self, *args: Any) -> list:
        """The program: the traced body on ``args`` followed by the captured inputs."""
        k = len(args) - self.num_inputs
        consts = list(self._consts)
        for (i, *_), v in zip(self._lifted, args[k:]):
            consts[i] = v
        return jaxpr_as_fun(ClosedJaxpr(self._jaxpr, consts))(*args[:k])

    def inputs(self, fn: Callable, place: Callable[[Any], Any] | None = None) -> list | None:
        """The captured arrays now, or None when ``fn``'s state no longer fits this trace
        (a watched number changed, an array changed shape or dtype, or moved).

        ``place`` puts a JAX array where the program reads it; the placed copy is kept
        while the state holds the same array (JAX arrays are immutable), so unchanged
        state is not copied again on every call. NumPy arrays are placed every call
        (they can change in place).
        """
        if self._watched and _capture.changed(fn, self._watched):
            return None
        out = []
        for k, (_, chain, shape, dtype) in enumerate(self._lifted):
            try:
                v = _capture.fetch(fn, chain)
            except _capture.Gone:
                return None
            if not _is_array(v) or np.shape(v) != shape or v.dtype != dtype:
                return None
            if place is not None:
                v = self._place(k, v, place)
            out.append(v)
        for chain in self._outs.values():
            try:
                _capture.fetch(fn, chain)
            except _capture.Gone:
                return None
        return out

    def _place(self, k: int, v: Any, place: Callable[[Any], Any]) -> Any:
        if not isinstance(v, jax.Array):
            return place(v)
        last = self._placed[k]
        if last is not None and last[0] is v:
            return last[1]
        placed = place(v)
        self._placed[k] = (v, placed)
        return placed

    def output(self, fn: Callable, value: Any) -> Any:
        """An untraced output ``value`` of the trace, as ``fn``'s state holds it now."""
        chain = self._outs.get(id(value))
        if chain is None:
            return value
        return _capture.fetch(fn, chain)
