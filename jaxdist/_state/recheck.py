"""The state check mode: a cached step traced again on each call and compared.

jaxdist reads a compiled step's state afresh on every call from the places its trace
found, and traces the step again when a Python value it watches changes. A value read
through a route neither knows of would be a constant of the cached program: stale,
silently. Under the check mode every call of a cached step (eager ``strategy.run``, a
``jd.function``, a ragged step) also traces it again, as if the cache were empty, and
compares the two traces (`differences`): the program's operations and literals, the
arrays it holds as constants, the places of the state it reads and writes, and the
values it returns untraced. Any difference is a `StateCheckError` naming it, before
the cached program runs. It costs a trace per call (the program is not compiled again):
a mode for tests and debugging, as TF's ``tf.config.run_functions_eagerly``.

On with ``JAXDIST_CHECK_STATE=1`` in the environment, or `set_state_checks`.

>>> import jaxdist as jd
>>> jd.experimental.set_state_checks(True)
>>> jd.experimental.state_checks()
True
>>> jd.experimental.set_state_checks(False)
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from jax.extend.core import ClosedJaxpr, Jaxpr, Literal

from jaxdist._base.validate import describe

_ENV = "JAXDIST_CHECK_STATE"
_on = [os.environ.get(_ENV, "0") not in ("", "0", "false", "False")]


class StateCheckError(RuntimeError):
    """The cached program of a step differs from a trace of it now (the check mode)."""


def set_state_checks(enabled: bool) -> None:
    """Turns the state check mode on or off for this process.

    Under it, every call of a step jaxdist has compiled (``strategy.run``, a
    ``jd.function``) also traces the step again and compares the trace with the
    cached program: a constant that changed, another program, or another place of
    the state read or written raises `StateCheckError` naming it (a value jaxdist
    would have read stale). Each call then costs a trace; the default is off, or on
    where the environment sets ``JAXDIST_CHECK_STATE=1``.

    Args:
        enabled: True to check every call, False to stop.

    Raises:
        TypeError: ``enabled`` is not a bool.
    """
    if type(enabled) is not bool:
        raise TypeError(f"set_state_checks(enabled) takes a bool; got {enabled!r}.")
    _on[0] = enabled


def state_checks() -> bool:
    """Whether the state check mode is on (`set_state_checks`)."""
    return _on[0]


def check(fn: Callable, cached: Any, fresh: Any) -> None:
    """Raises `StateCheckError` where ``fresh``'s record of a trace of ``fn`` (a
    `Staged.record`) differs from ``cached``'s."""
    found = differences(cached, fresh)
    if found:
        raise StateCheckError(
            f"jaxdist's state check ({_ENV}): the program cached for {describe(fn)} "
            f"differs from a trace of it now: {found}. The cached program would have "
            "computed with a stale value (a route of the state jaxdist does not track). "
            "Pass the value as an argument of the step, or keep it on the step's object, "
            "and please report the route."
        )


def differences(cached: dict, fresh: dict) -> str:
    """The first difference between two records of a step's trace ('' when alike)."""
    for key, what in _PARTS:
        a, b = cached[key], fresh[key]
        if key == "constants":
            found = _constants(a, b)
        elif key == "returned":
            found = _returned(a, b)
        else:
            found = "" if a == b else f"{what}: {_first(a, b)}"
        if found:
            return found
    return ""


_PARTS = (
    ("reads", "the places of the state it reads"),
    ("writes", "the places of the state it writes"),
    ("constants", ""),
    ("returned", ""),
    ("program", "the program"),
)


def _first(a: Sequence | str, b: Sequence | str) -> str:
    if isinstance(a, str) and isinstance(b, str):
        lines = list(zip(a.splitlines(), b.splitlines()))
        at = next((i for i, (x, y) in enumerate(lines) if x != y), len(lines))
        a, b = a.splitlines()[at : at + 1], b.splitlines()[at : at + 1]
        return f"cached `{' '.join(a).strip()}`, now `{' '.join(b).strip()}`"
    return f"cached {list(a)}, now {list(b)}"


def _constants(a: list, b: list) -> str:
    if len(a) != len(b):
        return f"it holds {len(a)} arrays as constants, a trace now {len(b)}"
    for i, (x, y) in enumerate(zip(a, b)):
        if not _same(x, y):
            return (
                f"constant {i} ({_kind(x)}), an array it read from outside its arguments, "
                f"is now {_short(y)} where the cached program holds {_short(x)}"
            )
    return ""


def _returned(a: list, b: list) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if not _same(x, y):
            return f"its untraced output {i} is now {_short(y)} where the cached one is {_short(x)}"
    return "" if len(a) == len(b) else f"it returns {len(b)} untraced values where {len(a)}"


def _same(x: Any, y: Any) -> bool:
    if x is y:
        return True
    if hasattr(x, "shape") and hasattr(y, "shape"):
        x, y = np.asarray(x), np.asarray(y)
        return x.shape == y.shape and x.dtype == y.dtype and np.array_equal(x, y, equal_nan=True)
    if hasattr(x, "shape") or hasattr(y, "shape"):
        return False
    try:
        return bool(type(x) is type(y) and x == y)
    except Exception:  # noqa: BLE001 - a value that cannot compare: compare by identity
        return False


def _kind(x: Any) -> str:
    return f"{np.asarray(x).dtype}{list(np.shape(x))}" if hasattr(x, "shape") else type(x).__name__


def _short(x: Any) -> str:
    if hasattr(x, "shape"):
        a = np.asarray(x)
        text = repr(a.tolist()) if a.size <= 6 else np.array2string(a, threshold=6)
    else:
        text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


# -- a program's form: its live equations, constants apart -------------------------------------


def program_form(jaxpr: Jaxpr, consts: Sequence) -> tuple[str, list]:
    """``jaxpr``'s live equations as text (variables numbered in order, literals by value,
    nested jaxprs inline) and the constants they use, in order of use; ``consts`` gives
    the values of ``jaxpr``'s constvars (None: an input, read afresh). Dead equations (a
    trace's leftovers, which JAX's caches make differ between traces) are left out.

    >>> import jax, jax.numpy as jnp
    >>> def f(x):
    ...     _ = jnp.zeros(3) + 1.0          # dead
    ...     return x * 2.0
    >>> text, consts = program_form(jax.make_jaxpr(f)(1.0).jaxpr, [])
    >>> len(text.splitlines()), "mul" in text, consts
    (1, True, [])
    """
    lines: list[str] = []
    values: list = []
    _form(jaxpr, dict(zip(jaxpr.constvars, consts)), {}, values, lines, "", itertools.count())
    return "\n".join(lines), values


def _live(jaxpr: Jaxpr) -> list:
    used = {v for v in jaxpr.outvars if not isinstance(v, Literal)}
    keep = []
    for eqn in reversed(jaxpr.eqns):
        if eqn.effects or any(v in used for v in eqn.outvars):
            keep.append(eqn)
            used.update(v for v in eqn.invars if not isinstance(v, Literal))
    return keep[::-1]


def _form(
    jaxpr: Jaxpr, consts: dict, names: dict, values: list, lines: list, pad: str, counter: Any
) -> None:
    def name(v: Any) -> str:
        if isinstance(v, Literal):
            return f"{_ADDRESS.sub('', repr(v.val))}:{_type(v.aval)}"
        if v not in names:
            value = consts.get(v)
            if value is not None:  # a constant (None: an input of the state)
                values.append(value)
            names[v] = f"v{next(counter)}"
        return f"{names[v]}:{_type(v.aval)}"

    for eqn in _live(jaxpr):
        if eqn.primitive.name in _PLACEMENTS and len(eqn.invars) == len(eqn.outvars):
            for v, out in zip(eqn.invars, eqn.outvars):  # the same values, placed elsewhere
                names[out] = name(v).partition(":")[0]
            continue
        ins = " ".join(name(v) for v in eqn.invars)
        params = []
        for key in sorted(eqn.params):
            param = eqn.params[key]
            subs = param if isinstance(param, (tuple, list)) else (param,)
            if any(isinstance(p, (ClosedJaxpr, Jaxpr)) for p in subs):
                for p in subs:
                    inner = p.jaxpr if isinstance(p, ClosedJaxpr) else p
                    values.extend(p.consts if isinstance(p, ClosedJaxpr) else ())
                    _form(inner, {}, names, values, lines, pad + "  ", counter)
                params.append(f"{key}=<above>")
            else:
                params.append(f"{key}={_ADDRESS.sub('', repr(param))}")
        outs = " ".join(name(v) for v in eqn.outvars)
        lines.append(f"{pad}{outs} = {eqn.primitive.name}[{', '.join(params)}] {ins}".rstrip())


def _type(aval: Any) -> str:
    """An abstract value's dtype and shape (not its sharding or the axes it varies over,
    which follow how its inputs were placed, not what it computes)."""
    shape = getattr(aval, "shape", None)
    return aval.str_short() if shape is None else f"{aval.dtype}{list(shape)}"


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
# primitives that only place or re-type their operands: the values go through unchanged
_PLACEMENTS = frozenset(
    {"reshard", "sharding_constraint", "device_put", "pvary", "pcast", "mesh_cast", "copy"}
)
