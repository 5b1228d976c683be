"""The Python numbers a step writes, computed on the host with Python's arithmetic.

A number of the state that is an input of the program (`jaxdist._state.promote`) enters
it at JAX's default width (``int32``, ``float32``): a counter past 2**31 would wrap
and a clock at 2**24 adding 0.1 would not move, where Python (and TF eager, which
runs the step's Python) computes exactly. The value a step writes there
(``self.calls += 1``, ``self.lr *= 0.99``) is computed from the numbers and literals
only, in most steps: `plan` finds, in the traced program, the part that computes
each written number; where it reads no array and uses only arithmetic this module
knows, `HostPlan.run` computes it in Python (unbounded ints, double floats; the
literals of a jaxpr keep the Python value the code wrote). Nothing waits for the
device then. A written number computed from an array (``self.loss = float(...)``
cannot be traced; ``self.total += jnp.sum(x)`` can) stays the device's value.

>>> import jax, jax.numpy as jnp
>>> spec = jax.ShapeDtypeStruct((), jnp.int32, weak_type=True)
>>> closed = jax.make_jaxpr(lambda n: [n + 2_000_000_000])(spec)
>>> p = plan(closed.jaxpr, 0, [0])
>>> p.run([2_000_000_000])
([4000000000], False)
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from jax.extend.core import Literal


def _div(a: Any, b: Any) -> Any:
    """``lax.div``: integers truncate toward zero (C's rule), floats divide."""
    if isinstance(a, int) and isinstance(b, int):
        if b == 0:
            raise ZeroDivisionError("integer division or modulo by zero")
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b >= 0) else -q
    return a / b


def _rem(a: Any, b: Any) -> Any:
    """``lax.rem``: the remainder of `_div` (the sign of ``a``)."""
    if isinstance(a, int) and isinstance(b, int):
        return a - b * _div(a, b)
    return math.fmod(a, b)


def _sign(a: Any) -> Any:
    return type(a)((a > 0) - (a < 0))


def _logic(op: Callable) -> Callable:
    return lambda a, b: op(a, b) if isinstance(a, int) else op(bool(a), bool(b))


_OPS: dict[str, Callable[..., Any]] = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "div": _div,
    "rem": _rem,
    "neg": operator.neg,
    "abs": abs,
    "sign": _sign,
    "max": max,
    "min": min,
    "pow": operator.pow,
    "square": lambda a: a * a,
    "floor": lambda a: float(math.floor(a)),
    "ceil": lambda a: float(math.ceil(a)),
    "eq": operator.eq,
    "ne": operator.ne,
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
    "and": _logic(operator.and_),
    "or": _logic(operator.or_),
    "xor": _logic(operator.xor),
    "not": lambda a: not a if isinstance(a, bool) else ~a,
    "select_n": lambda which, *cases: cases[int(which)],
    "copy": lambda a: a,
    "copy_p": lambda a: a,
    "convert_element_type": lambda a: a,  # the result's dtype decides (`_converter`)
    "reshape": lambda a: a,  # of a scalar to a scalar
    "squeeze": lambda a: a,
    "broadcast_in_dim": lambda a: a,
}
_PARAMS: dict[str, Callable[[Any, dict], Any]] = {"integer_pow": lambda a, p: a ** p["y"]}
_NESTED = ("jit", "pjit", "closed_call", "core_call")


def _scalar(var: Any) -> bool:
    aval: Any = getattr(var, "aval", None)
    return getattr(aval, "shape", None) == () and np.dtype(aval.dtype).kind in "biuf"


def _inner(eqn: Any) -> Any:
    """The closed jaxpr a call primitive runs, None for another primitive."""
    if eqn.primitive.name not in _NESTED:
        return None
    return eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")


def _supported(eqn: Any) -> bool:
    if not all(_scalar(v) for v in (*eqn.invars, *eqn.outvars)):
        return False
    name = eqn.primitive.name
    if name in _OPS or name in _PARAMS:
        return True
    inner = _inner(eqn)
    if inner is None:
        return False
    jaxpr = getattr(inner, "jaxpr", inner)
    return (
        not getattr(inner, "consts", ())
        and not jaxpr.constvars
        and all(_supported(e) for e in jaxpr.eqns)
    )


def _producers(jaxpr: Any) -> dict:
    return {v: e for e in jaxpr.eqns for v in e.outvars}


def _needed(jaxpr: Any, outs: Sequence[Any]) -> set:
    """The variables the equations computing ``outs`` read (inputs included)."""
    producers = _producers(jaxpr)
    seen: set = set()
    todo = [v for v in outs if not isinstance(v, Literal)]
    while todo:
        v = todo.pop()
        if v in seen:
            continue
        seen.add(v)
        eqn = producers.get(v)
        if eqn is not None:
            todo.extend(x for x in eqn.invars if not isinstance(x, Literal))
    return seen


_CONVERT = {"b": bool, "i": int, "u": int, "f": float}


def _converter(aval: Any) -> Callable[[Any], Any]:
    """The Python type of ``aval``'s values (int, float or bool)."""
    return _CONVERT[np.dtype(aval.dtype).kind]


def _read(v: Any, slots: dict) -> Any:
    """A variable's slot, or a literal's Python value in a 1-tuple."""
    return (_converter(v.aval)(v.val),) if isinstance(v, Literal) else slots[v]


def _op(eqn: Any) -> Callable[..., list]:
    inner = _inner(eqn)
    if inner is not None:
        return _nested(getattr(inner, "jaxpr", inner))
    name = eqn.primitive.name
    if name in _PARAMS:
        f, params = _PARAMS[name], eqn.params
        return lambda a: [f(a, params)]
    g = _OPS[name]
    return lambda *a: [g(*a)]


def _compile(eqns: Sequence[Any], slots: dict) -> list:
    """Each equation as ``(op, reads, writes)`` over a list of values (``slots`` gives
    each variable's place, and gets those of the equations' results)."""
    prog = []
    for eqn in eqns:
        reads = [_read(v, slots) for v in eqn.invars]
        writes = []
        for v in eqn.outvars:
            slots[v] = len(slots)
            writes.append((slots[v], _converter(v.aval)))
        prog.append((_op(eqn), reads, writes))
    return prog


def _nested(jaxpr: Any) -> Callable[..., list]:
    """A nested jaxpr's equations as one op."""
    slots = {v: i for i, v in enumerate(jaxpr.invars)}
    prog = _compile(jaxpr.eqns, slots)
    outs = [_read(v, slots) for v in jaxpr.outvars]
    size = len(slots)

    def op(*args: Any) -> list:
        env = [*args, *[None] * (size - len(args))]
        _run(prog, env)
        return [o[0] if type(o) is tuple else env[o] for o in outs]

    return op


def _run(prog: list, env: list) -> None:
    for op, reads, writes in prog:
        outs = op(*[r[0] if type(r) is tuple else env[r] for r in reads])
        for (slot, convert), out in zip(writes, outs):
            env[slot] = convert(out)


class HostPlan:
    """Which written numbers are computed in Python (`run`), which numbers the device
    program reads (`device`: the others may be given any value), and which of its
    integers `run` checks against the device's int32."""

    def __init__(self, numbers: list, host: dict, eqns: list, device: set, ints: list) -> None:
        slots = {v: i for i, v in enumerate(numbers)}
        self._prog = _compile(eqns, slots)
        self._size = len(slots)
        self._outs = [_read(v, slots) for v in host.values()]
        self._ints = [slots[v] for v in ints]
        self.host = host  # index of a written output -> its variable
        self.device = device  # indices of the numbers the device program reads

    def run(self, numbers: Sequence[Any]) -> tuple[list, bool]:
        """The host-computed written numbers (in `host`'s order) from the numbers now,
        and whether an integer the device computes with (an input, or one it computes
        from the numbers alone) is past int32, where the device would wrap.

        Raises:
            ZeroDivisionError, OverflowError: as Python's arithmetic raises them.
        """
        env = [*numbers, *[None] * (self._size - len(numbers))]
        if self._prog:  # a NumPy float in Python's (double) arithmetic, as a float
            env = [x.item() if type(x) in _NUMPY else x for x in env]
        _run(self._prog, env)
        values = [o[0] if type(o) is tuple else env[o] for o in self._outs]
        wide = any(not _INT32[0] <= env[i] <= _INT32[1] for i in self._ints)
        return values, wide


_INT32 = (-(2**31), 2**31 - 1)
_NUMPY = frozenset((np.float16, np.float32, np.float64))  # `jaxdist._state.promote.NUMBERS`


def _host_vars(jaxpr: Any, numbers: list) -> tuple[set, list]:
    """The variables computed from the numbers and literals alone (numbers included),
    and the equations computing them, in order."""
    known, eqns = set(numbers), []
    for eqn in jaxpr.eqns:
        if _supported(eqn) and all(isinstance(v, Literal) or v in known for v in eqn.invars):
            known.update(eqn.outvars)
            eqns.append(eqn)
    return known, eqns


def plan(jaxpr: Any, first: int, written: Sequence[int]) -> HostPlan:
    """The `HostPlan` of a program whose inputs from ``first`` on are numbers and whose
    last ``len(written)`` outputs are the numbers the step wrote."""
    numbers = list(jaxpr.invars[first:])
    known, eqns = _host_vars(jaxpr, numbers)
    k = len(jaxpr.outvars) - len(written)
    outs = jaxpr.outvars[k:]
    host = {j: v for j, v in enumerate(outs) if isinstance(v, Literal) or v in known}
    device_outs = [v for j, v in enumerate(jaxpr.outvars) if j < k or j - k not in host]
    # what an effect reads (``jax.debug.print(self.calls)``) runs on the device too
    device_outs += [v for e in jaxpr.eqns if e.effects for v in e.invars]
    needed = _needed(jaxpr, device_outs)
    device = {i for i, v in enumerate(numbers) if v in needed}
    ints = [v for v in known if v in needed and np.dtype(v.aval.dtype).kind in "iu"]
    return HostPlan(numbers, host, eqns, device, ints)
