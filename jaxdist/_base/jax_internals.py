"""What jaxdist reads of JAX beyond its public API: one door, checked on every supported version.

jaxdist supports JAX 0.10 through the newest release (0.12 today); CI runs the whole suite on the
floor (Python 3.11, jax 0.10.2: `make test`) and on the newest (Python 3.12: `make test-latest`).
Everything else in jaxdist uses JAX's public API (`jax`, `jax.lax`, `jax.extend.core`,
`jax.interpreters.ad` / `batching`, `jax.distributed`, `jax.Array`). What has no public
replacement is read here, and nowhere else (`tests/base/test_jax_internals.py` checks that no other
module names ``jax._src``):

Each read, why it has no public replacement, and the test that guards it:

- ``jax._src.core.trace_state_clean``: "is any JAX transformation tracing now?" (``jax.core``
  exports no such query, and a tracer is not always at hand to inspect). Guarded by
  ``tests/run/test_jit.py`` (eager vs traced calls) and ``tests/base/test_jax_internals.py``.
- ``jax._src.core.unsafe_get_current_trace``: the innermost trace, to tell a step's own tracers
  from an outer ``jax.jit``'s (by a tracer's ``_trace``: `is_inner_tracer`). Guarded by
  ``tests/run/test_jit.py`` (steps inside a user's jit).
- ``jax._src.xla_bridge.backends_are_initialized``: "has the backend started?" without starting
  it (every public device query starts it, and both ``PJRT_NPROC`` and
  ``jax.distributed.initialize`` must come before that). Guarded by
  ``tests/base/test_cpu_threads.py`` and ``tests/cluster/test_cluster_resolver.py``.
- ``jax._src.distributed.global_state.client``: the coordination service's key-value store
  (``jax.distributed`` exposes initialize and shutdown only), for multi-worker input agreement
  and the liveness guard. Guarded by ``tests/cluster/test_multi_worker.py``.
- The collective primitives' names and params (``psum`` / ``pmax`` / ``pmin`` ``axes``,
  ``all_gather`` ``all_gather_dimension`` / ``tiled``, ``reduce_scatter``
  ``scatter_dimension``, ``axis_index``): a partial-batch step interprets the step's jaxpr
  (``jax.extend.core`` gives jaxprs, not stable names or params). Guarded by
  `check_collectives` (run before the first partial-batch step) and
  ``tests/partial/test_nested_collectives.py``.
- XLA's CPU compile options (`QUICK_CPU` in `jaxdist._program.compile`): each is tried alone and
  dropped where the jaxlib rejects it (``xla_cpu_use_fusion_emitters`` is gone in jaxlib 0.11).
  Guarded by ``tests/partial/test_ragged.py``.

On a JAX where one of these is missing, the call that needs it raises `JaxInternalsError`
naming the JAX version and what is missing: never a silent fallback that could change an answer.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import jax
from jax import lax
from jax.extend.core import ClosedJaxpr, Jaxpr

#: The JAX versions CI tests: the floor and the newest release.
TESTED = ("0.10.2", "0.12.0.1")


class JaxInternalsError(RuntimeError):
    """This JAX lacks something jaxdist reads beyond JAX's public API."""


def _missing(what: str, detail: str = "") -> JaxInternalsError:
    return JaxInternalsError(
        f"jaxdist needs {what} from JAX, and JAX {jax.__version__} does not have it"
        f"{': ' + detail if detail else ''}. jaxdist is tested on JAX {TESTED[0]} to "
        f"{TESTED[-1]}; install one of those (pip install -U jaxdist may have a newer jaxdist)."
    )


@functools.cache
def private_attr(module: str, name: str) -> Any:
    """``module.name`` of JAX, or `JaxInternalsError` naming this JAX version and the name."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise _missing(f"{module}.{name}") from e


def trace_state_clean() -> bool:
    """True when no JAX transformation is tracing (`jax.jit`, a `lax` loop body, ...).

    >>> import jax
    >>> trace_state_clean(), jax.jit(lambda x: trace_state_clean() or x)(1)
    (True, Array(1, dtype=int32, weak_type=True))
    """
    return bool(_core("trace_state_clean")())


@functools.cache
def _core(name: str) -> Any:
    """``jax._src.core.<name>``, looked up once (it runs on every eager call)."""
    return private_attr("jax._src.core", name)


def current_trace() -> Any:
    """The innermost active JAX trace (the eval trace when none is tracing)."""
    return private_attr("jax._src.core", "unsafe_get_current_trace")()


def tracing() -> bool:
    """Whether a JAX transformation is tracing (`jax.jit`, a `lax` loop body, a pmap body)."""
    return not trace_state_clean()


def is_inner_tracer(x: Any, trace: Any) -> bool:
    """Whether ``x`` is a tracer of ``trace`` (not one captured from an outer trace)."""
    if not isinstance(x, jax.core.Tracer):
        return False
    return trace is None or getattr(x, "_trace", trace) is trace


def backends_started() -> bool:
    """Whether JAX's backends have started, without starting them."""
    return bool(private_attr("jax._src.xla_bridge", "backends_are_initialized")())


def coordination_client() -> Any:
    """The `jax.distributed` coordination client of this process (None before it joins)."""
    state = private_attr("jax._src.distributed", "global_state")
    try:
        return state.client
    except AttributeError as e:
        raise _missing("jax._src.distributed.global_state.client") from e


# -- the collective primitives a partial-batch step interprets ---------------------------------

#: primitive name -> the params jaxdist reads from its equations
COLLECTIVE_PARAMS: dict[str, tuple[str, ...]] = {
    "psum": ("axes", "axis_index_groups"),
    "pmax": ("axes", "axis_index_groups"),
    "pmin": ("axes", "axis_index_groups"),
    "all_gather": ("all_gather_dimension", "tiled", "axis_index_groups"),
    "reduce_scatter": ("scatter_dimension", "tiled", "axis_index_groups"),
    "axis_index": (),
}


def _probe(x: Any, axis: str) -> tuple:
    return (
        lax.psum(x, axis),
        lax.pmax(x, axis),
        lax.pmin(x, axis),
        lax.all_gather(x, axis, tiled=True),
        lax.psum_scatter(jax.numpy.stack([x, x]), axis, tiled=True),
        lax.axis_index(axis),
    )


@functools.cache
def check_collectives(axis: str) -> None:
    """Raises `JaxInternalsError` unless this JAX's collectives trace to the primitives and
    params a partial-batch step interprets (`jaxdist._partial.lockstep`).

    >>> check_collectives("replica")  # this JAX is one jaxdist knows
    """
    x = jax.numpy.zeros((2,), jax.numpy.float32)
    jaxpr = jax.make_jaxpr(_probe, axis_env=[(axis, 2)], static_argnums=1)(x, axis)
    seen = {e.primitive.name: e.params for e in jaxpr.jaxpr.eqns}
    for name, params in COLLECTIVE_PARAMS.items():
        if name not in seen:
            raise _missing(
                f"the collective primitive {name!r}",
                f"its collectives trace to {sorted(seen)}",
            )
        lost = [p for p in params if p not in seen[name]]
        if lost:
            raise _missing(f"the params {lost} of {name!r}", f"it has {sorted(seen[name])}")


def host_effects(effects: Any) -> frozenset:
    """``effects`` less the named axes' (a collective's, ``jax._src.core.NamedAxisEffect``):
    what an equation does beyond its values, a host callback's (`jax.debug.callback`,
    `jax.debug.print`, ``io_callback``) or a state's, which a replica runs once per replica.

    >>> import jax
    >>> def f(x):
    ...     jax.debug.print("{x}", x=x)
    ...     return jax.lax.psum(x, "i")
    >>> eqns = jax.make_jaxpr(f, axis_env=[("i", 2)])(1.0).jaxpr.eqns
    >>> [e.primitive.name for e in eqns if host_effects(e.effects)]
    ['debug_print']
    """
    named = _core("NamedAxisEffect")
    return frozenset(e for e in effects if not isinstance(e, named))


# -- constants of nested jaxprs ----------------------------------------------------------------


def detached(closed: Any) -> Any:
    """``closed``'s jaxpr without the values of its constants: what a kept trace holds.

    JAX 0.12's ``Jaxpr`` carries its constants' values (``jax.make_jaxpr(f).jaxpr`` is the
    closed jaxpr itself), so a step kept with its jaxpr kept alive every array its trace
    read: the state as it was at the trace, a copy per trace. Where a jaxpr can carry them
    (its public ``with_consts``), the one returned carries None in their place (its
    ``constvars`` stay); an older JAX's ``Jaxpr`` carries none, and is returned as it is.

    >>> import jax, jax.numpy as jnp
    >>> w = jnp.arange(3.0)
    >>> kept = detached(jax.make_jaxpr(lambda x: x + w)(jnp.ones(3)))
    >>> any(c is w for c in getattr(kept, "consts", [])), len(kept.constvars)
    (False, 1)
    """
    jaxpr = closed.jaxpr
    attach = getattr(jaxpr, "with_consts", None)
    if attach is None or not getattr(jaxpr, "consts", None):
        return jaxpr
    return attach([None] * len(jaxpr.consts))


def nested_consts(jaxpr: Any) -> list:
    """The constants of the jaxprs nested in ``jaxpr``'s equations (a jitted helper, a
    ``jax.pmap`` or a ``lax`` loop body traced inside it), at any depth, each once.

    JAX keeps an array a nested function closed over as a constant of that function's
    jaxpr (an equation parameter), not of the outer one, so the outer jaxpr's ``consts``
    do not list it. Equation parameters are read through ``jax.extend.core``'s jaxpr
    types, whatever their names.

    >>> import jax, jax.numpy as jnp
    >>> w = jnp.arange(3.0)
    >>> helper = jax.jit(lambda x: x + w)
    >>> closed = jax.make_jaxpr(lambda x: helper(x) * 2)(jnp.ones(3))
    >>> closed.consts, [c is w for c in nested_consts(closed.jaxpr)]
    ([], [True])
    """
    out: dict[int, Any] = {}
    _collect_nested(jaxpr, out, set())
    return list(out.values())


def _collect_nested(jaxpr: Any, out: dict[int, Any], seen: set[int]) -> None:
    if id(jaxpr) in seen:
        return
    seen.add(id(jaxpr))
    for eqn in jaxpr.eqns:
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                if isinstance(sub, ClosedJaxpr):
                    for c in sub.consts:
                        out.setdefault(id(c), c)
                    _collect_nested(sub.jaxpr, out, seen)
                elif isinstance(sub, Jaxpr):
                    _collect_nested(sub, out, seen)
