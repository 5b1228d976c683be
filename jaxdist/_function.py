"""`jd.function`: TF's ``tf.function`` for jaxdist, with the state on objects kept current.

TF programs keep their state in variables on objects (``self.w``, a model, an
optimizer) and compile their distributed step with ``@tf.function``; the variables
are captured by reference, so every call reads their values now, and an ``assign``
inside the function is seen after it. A plain ``jax.jit`` bakes what the function
reads from ``self`` or a global into the program as constants, and an assignment
inside it leaks a tracer.

``jd.function`` compiles the whole function (its ``strategy.run`` calls, reductions,
optimizer update) into one program, dispatched once per call, and gives it TF's
meaning, built on the same parts as the eager ``strategy.run``
(`jaxdist._stage.Staged`):

* the arrays and Python numbers it reads from its closure, globals and object, at
  any depth and inside the steps it gives ``strategy.run`` or any jitted helper, are
  inputs of the program, read afresh on every call;
* what it assigns into that state (``self.params = new``, ``state["w"] = ...``,
  ``self.step += 1``) is written back after the call, as ``tf.Variable.assign`` is:
  distributed values stay distributed;
* one trace per argument signature (arrays by shape and dtype, Python numbers traced,
  other Python values by value), and again when a Python value it depends on changes
  (a retrace warning after `WARN_AT` traces, as TF warns);
* called inside another JAX trace (``jax.jit``, a ``lax`` loop), it runs inline.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Hashable
from typing import Any

import jax
import numpy as np

from jaxdist import _compile, _context
from jaxdist._stage import Staged, example
from jaxdist._validate import describe, hashable_arg, is_number

_DYNAMIC = "d"


def _signature(x: Any) -> Hashable:
    if isinstance(x, jax.Array):
        return (x.shape, x.dtype, getattr(x, "weak_type", False))
    if isinstance(x, np.ndarray):
        return (x.shape, x.dtype)
    return type(x).__name__


def _static_key(value: Any, index: int) -> Hashable:
    try:
        return (type(value), hashable_arg(value, index))
    except TypeError:
        raise TypeError(
            f"jd.function arguments must be arrays, numbers, distributed values or hashable "
            f"Python objects; leaf {index} is an unhashable {type(value).__name__}. Convert "
            "it to an array, or keep it on the function's object or closure."
        ) from None


class _Program:
    """One trace of the function: the compiled program and how its outputs are read."""

    def __init__(self, fn: Callable, treedef: Any, kinds: tuple, statics: list, dyn: list) -> None:
        info: dict = {}

        def body(*arrays: Any) -> list:
            it, st = iter(arrays), iter(statics)
            leaves = [next(it) if k == _DYNAMIC else next(st) for k in kinds]
            args, kwargs = jax.tree.unflatten(treedef, leaves)
            with _context.enter(_context.function_state(fn)):
                out = fn(*args, **kwargs)
            flat, info["treedef"] = jax.tree.flatten(out)
            traced = [isinstance(x, jax.core.Tracer) for x in flat]
            info["layout"] = [None if t else x for x, t in zip(flat, traced)]
            return [x for x, t in zip(flat, traced) if t]

        examples = [example(x, False) for x in dyn]
        outputs = lambda: [x for x in info["layout"] if x is not None]  # noqa: E731
        self.staged = Staged(fn, body, examples, outputs=outputs, numbers=True, writes=True)
        self._info = info
        self.program = jax.jit(self.staged.evaluate)

    def result(self, fn: Callable, outs: list) -> Any:
        it = iter(outs)
        layout = self._info["layout"]
        leaves = [next(it) if x is None else self.staged.output(fn, x) for x in layout]
        return jax.tree.unflatten(self._info["treedef"], leaves)


class Function:
    """A function compiled whole, reading and writing its state as TF's ``tf.function``.

    Created by `function`; call it as the function. ``python_function`` is the
    function it wraps.
    """

    def __init__(self, fn: Callable, name: str | None = None) -> None:
        self.python_function = fn
        self.__name__ = name or getattr(fn, "__name__", "function")
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__wrapped__ = fn

    def __get__(self, obj: Any, objtype: Any = None) -> Function:
        if obj is None:
            return self
        return Function(types.MethodType(self.python_function, obj), self.__name__)

    def __repr__(self) -> str:
        return f"<jd.function {describe(self.python_function)}>"

    def experimental_get_tracing_count(self) -> int:
        """How many times the function was traced (TF's name): one per signature and state."""
        return _compile.steps.size(self.python_function)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fn = self.python_function
        if _compile.tracing():  # inside another trace: inline, the outer trace owns it
            return fn(*args, **kwargs)
        leaves, treedef = jax.tree.flatten((args, kwargs))
        kinds, dyn, statics, key = [], [], [], []
        for i, x in enumerate(leaves):
            if isinstance(x, (jax.Array, np.ndarray)) or is_number(x):
                kinds.append(_DYNAMIC)
                dyn.append(x)
                key.append(_signature(x))
            else:
                kinds.append("s")
                statics.append(x)
                key.append(_static_key(x, i))
        full = ("jd.function", treedef, tuple(key))
        build = lambda: _Program(fn, treedef, tuple(kinds), statics, dyn)  # noqa: E731
        entry, extra = _compile.steps.get(fn, full, build, lambda e: e.staged.inputs(fn))
        outs = entry.program(*dyn, *extra)
        entry.staged.write_back(fn, outs)
        return entry.result(fn, outs)


def function(fn: Callable | None = None, **options: Any) -> Any:
    """TF's ``tf.function``: ``fn`` compiled whole, its state read and written as TF does.

    Use it as a decorator (on functions and methods) or call it on a function. The
    function may call ``strategy.run``, ``strategy.reduce`` and any JAX code; the
    arrays and Python numbers it reads from ``self``, its closure or globals are read
    afresh on every call, and what it assigns there is written back after the call.

    Args:
        fn: the function (or method) to compile.
        **options: TF's ``tf.function`` options. ``jit_compile``, ``autograph`` and
            ``reduce_retracing`` are accepted (XLA always compiles the function;
            Python control flow runs at trace time, as with ``autograph=False``);
            others are a `TypeError`.

    Returns:
        A `Function` (or a decorator making one when ``fn`` is None).

    Raises:
        TypeError: ``fn`` is not callable, or an unknown option was given.

    >>> import jax.numpy as jnp, jaxdist as jd
    >>> strategy = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    >>> class Trainer:
    ...     def __init__(self):
    ...         self.w = jnp.ones(())
    ...     def step(self, x):
    ...         return jd.get_replica_context().all_reduce("SUM", x * self.w)
    ...     @jd.function
    ...     def train(self, x):
    ...         total = strategy.run(self.step, args=(x,))
    ...         self.w = self.w + 1.0          # written back after the call
    ...         return total
    >>> t = Trainer()
    >>> float(t.train(jnp.ones(())).values[0]), float(t.train(jnp.ones(())).values[0])
    (2.0, 4.0)
    >>> float(t.w)
    3.0
    """
    unknown = set(options) - _TF_OPTIONS
    if unknown:
        raise TypeError(
            f"jd.function got unknown option(s) {sorted(unknown)}; it accepts TF's "
            f"{sorted(_TF_OPTIONS)}."
        )
    if fn is None:
        return functools.partial(function, **options)
    if not callable(fn):
        raise TypeError(f"jd.function(fn) takes a function or method; got {type(fn).__name__}.")
    return functools.wraps(fn, updated=())(Function(fn))


_TF_OPTIONS = frozenset(
    ("jit_compile", "autograph", "reduce_retracing", "experimental_relax_shapes")
)
