"""State frozen by a user's own compile: named at the trace, never silent.

Inside a plain ``jax.jit`` (or a ``lax`` loop body) a ``strategy.run`` step is traced
as part of the user's function, and the arrays it reads from its object, closure or
globals become constants of the user's program: later changes are not seen. jaxdist
cannot make them inputs of a program it does not own, so it names them, once per
trace, with the two fixes: ``jd.function`` (TF's ``tf.function``, which reads state
afresh and writes back what it assigns) or passing the state as an argument.
``jd.function``'s own trace reads state afresh, so nothing is said there.
"""

from __future__ import annotations

import os
import sys
import types
import warnings
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxdist._base import context as _context
from jaxdist._base.jax_internals import nested_consts
from jaxdist._base.layout import is_tracer
from jaxdist._base.validate import describe
from jaxdist._state import capture as _capture
from jaxdist._state import chains as _chains
from jaxdist._state import peek as _peek
from jaxdist._state import watch as _watch


def check_not_stacked(fn: Callable, chains: list, consts: list) -> None:
    """Raises where the step read a distributed value's stacked array (all replicas'
    components: ``jax.tree`` over a `PerReplica` kept on ``self``) as its own."""
    for chain, const in zip(chains, consts):
        if chain is None:
            continue
        for k, (kind, _) in enumerate(chain):
            if kind == "stacked":
                where = _chains.describe(fn, chain[:k])
                raise RuntimeError(
                    f"The step {describe(fn)} read {where}, a distributed value (one component "
                    f"per replica), as the array of all its components (shape "
                    f"{tuple(np.shape(const))}): a step sees only its own replica's component. "
                    f"Pass it to strategy.run as an argument (strategy.run(step, args=({where}, "
                    "...))), which gives each replica its component, or store a value that is "
                    "the same on every replica (strategy.reduce) on the object."
                )


# the package's folder, wherever in it this module is
_HERE = os.path.dirname(os.path.abspath(sys.modules[__name__.partition(".")[0]].__file__ or ""))


def lists_read(fn: Callable) -> dict:
    """The lengths of the lists whose entries ``fn``'s state holds, by chain, taken before
    a trace: `warn_frozen` names the entries of a list the trace did not grow (settings,
    not a log the step appends to)."""
    out: dict = {}
    if _jaxdists(fn):
        return out
    for chain, _, _ in _watch.watch(fn):
        if _indexed(chain) and chain[:-1] not in out:
            try:
                parent = _chains.fetch(fn, chain[:-1])
            except _chains.Gone:
                continue
            if _peek.is_a(parent, list):
                out[chain[:-1]] = list.__len__(parent)
    return out


def warn_frozen(fn: Callable, closed: Any, lists: dict | None = None) -> None:
    """Warns naming the arrays of ``fn``'s state that its step's trace ``closed`` (made
    inside a user's compile) reads: each is a constant of that compile (in
    ``jd.function``'s trace, an input it reads afresh: no warning). Raises where the step
    reads a distributed value of its state as the array of all its components, as an
    eager step does. ``lists``: `lists_read` before the trace (the entries of those lists
    the trace did not grow are named too).

    >>> import warnings, jax, jax.numpy as jnp, jaxdist as jd
    >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    >>> box = {"w": jnp.ones(())}
    >>> with warnings.catch_warnings(record=True) as seen:
    ...     warnings.simplefilter("always")
    ...     _ = jax.jit(lambda: s.run(lambda: box["w"] * 2))()
    >>> any("the state it reads (box['w'])" in str(w.message) for w in seen)
    True
    """
    if _jaxdists(fn):
        return  # jaxdist's own steps (Keras') pass their state as arguments
    consts = [
        c
        for c in [*closed.consts, *nested_consts(closed.jaxpr)]
        if (isinstance(c, jax.Array) and not is_tracer(c))
        or (isinstance(c, np.ndarray) and c.dtype != object)
    ]
    chains = _capture.locate(fn, consts) if consts else []
    check_not_stacked(fn, chains, consts)
    if _context.in_function():
        return
    found = [_chains.describe(fn, c) for c in chains if c is not None]
    found += [  # Python values of the state held by a name (``self.lr``, ``box["lr"]``,
        # ``self.training``, ``self.phase``, ``cfg.lr`` of a namedtuple): baked in as well
        # (not entries of a list the trace grew: a log the step appends to)
        _chains.describe(fn, chain)
        for chain, value, how in _watch.watch(fn)
        if _baked(value, how)
        and not (_indexed(chain) and not _in_tuple(fn, chain) and not _kept(fn, chain, lists))
        and not _library_held(fn, chain)
    ]
    if not found:
        return
    names = ", ".join(found[:4])
    more = f" and {len(found) - 4} more" if len(found) > 4 else ""
    warnings.warn(
        f"strategy.run({describe(fn)}) is traced inside your own jax.jit (or lax loop): "
        f"the state it reads ({names}{more}) is baked into that compiled function as "
        "constants, so a later change (an optimizer step, a checkpoint restore) is not "
        "seen. Decorate the function that calls strategy.run with @jd.function instead of "
        "jax.jit (it reads state afresh on every call and writes back what it assigns, as "
        "tf.function does), or pass the state to it as arguments.",
        RuntimeWarning,
        stacklevel=4,
    )


def _baked(value: Any, how: str) -> bool:
    """Whether a watched value is one a compile bakes in: a number, bool or string
    (Python's or NumPy's), an Enum member, a set."""
    if how == "value":
        return type(value) in (int, float, bool, str) or isinstance(value, np.generic)
    return how in ("member", "set")


def _jaxdists(fn: Callable) -> bool:
    """Whether ``fn`` (a call's root with its argument objects: its step) is one of
    jaxdist's own steps (Keras' ``fit``'s), which pass their state as arguments."""
    code = _chains.code_of(fn)
    return code is not None and code.co_filename.startswith(_HERE)


def _kept(fn: Callable, chain: Any, lists: dict | None) -> bool:
    """Whether the value at ``chain`` is an entry of a list the trace read and did not grow
    or shrink (`lists_read`)."""
    if not lists or chain[:-1] not in lists:
        return False
    try:
        parent = _chains.fetch(fn, chain[:-1])
    except _chains.Gone:
        return False
    return _peek.is_a(parent, list) and list.__len__(parent) == lists[chain[:-1]]


def _in_tuple(fn: Callable, chain: Any) -> bool:
    """Whether the value at ``chain`` is an entry of a tuple or namedtuple (a setting, not
    a log)."""
    try:
        return isinstance(_chains.fetch(fn, chain[:-1]), tuple)
    except _chains.Gone:
        return False


def _indexed(chain: Any) -> bool:
    """Whether a chain ends at a position of a sequence (``traces[0]``, ``shape[1]``)."""
    kind, key = chain[-1]
    return kind in ("flat", "child", "stacked") or (kind == "item" and type(key) is int)


def _library_held(fn: Callable, chain: Any) -> bool:
    """Whether the number at ``chain`` belongs to an installed library's object (a Keras
    optimizer's ``beta_1``, a metric's internals, a library function's default): the
    object nearest the number on its chain that is not a built-in container is of a
    module installed apart from the user's code (site-packages, jaxdist). Those are
    settings, not state a program changes between steps; TF's ``tf.function`` bakes them
    in too."""
    for k in range(len(chain) - 1, 0, -1):
        try:
            holder = _chains.fetch(fn, chain[:k])
        except _chains.Gone:
            return False
        if type(holder) not in (dict, list, tuple):
            break
    else:
        return False
    if isinstance(holder, types.ModuleType):
        name = holder.__name__
    elif isinstance(holder, (type, types.FunctionType)):
        name = getattr(holder, "__module__", None) or ""
    else:
        name = type(holder).__module__
    return _installed(name)


def _installed(module_name: str) -> bool:
    """Whether a module is an installed library's (or jaxdist's): not the user's code, nor
    the standard library's containers a program keeps its settings in (an
    ``argparse.Namespace``, a ``types.SimpleNamespace``)."""
    path = getattr(sys.modules.get(module_name), "__file__", None) or ""
    return any(part in path for part in ("site-packages", "dist-packages")) or path.startswith(
        _HERE
    )
