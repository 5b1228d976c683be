"""TF's ``ConcreteFunction`` for `jd.function`: the function for one input signature.

``fn.get_concrete_function(*specs_or_values)`` gives one: calls of it are bound to its signature
(`jaxdist._run.signature.InputSignature`) and then run as the `jd.function` runs. A signature of
fully known shapes is traced at once, as TF traces it (counted by
``experimental_get_tracing_count``, shared with the calls of those shapes), and has
``structured_outputs``; JAX traces a program per concrete shape, so a signature with a ``None``
dimension is traced at the calls, one trace per shape met.

>>> import jax.numpy as jnp, jaxdist as jd
>>> def double(x):
...     return {"y": x * 2}
>>> f = jd.function(double)
>>> concrete = f.get_concrete_function(jd.TensorSpec((3,), "float32"))
>>> concrete.structured_input_signature
((TensorSpec(shape=(3,), dtype=float32, name='x'),), {})
>>> concrete.structured_outputs, f.experimental_get_tracing_count()
({'y': TensorSpec(shape=(3,), dtype=float32, name=None)}, 1)
>>> [float(v) for v in concrete(jnp.ones(3))["y"]]
[2.0, 2.0, 2.0]
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxdist._input.spec import TensorSpec
from jaxdist._run import signature as _signature
from jaxdist._values.values import is_distributed


def output_specs(out: Any) -> Any:
    """The structure of a function's outputs with a `TensorSpec` for each array (a tuple of
    its replicas' specs for a distributed value); other Python values as they are."""

    def spec(x: Any) -> Any:
        if is_distributed(x):
            return tuple(TensorSpec(s, d) for s, d in _signature.components(x))
        if isinstance(x, (jax.Array, np.ndarray)):
            return TensorSpec(tuple(x.shape), x.dtype)
        return x

    return jax.tree.map(spec, out, is_leaf=is_distributed)


def _spec_of(value: Any) -> Any:
    """``get_concrete_function``'s argument as a constraint: specs as they are, arrays by
    their spec, a distributed value by its replicas' (``None`` where they differ)."""
    if isinstance(value, TensorSpec):
        return value
    if isinstance(value, jax.ShapeDtypeStruct):
        return TensorSpec.from_spec(value)
    if is_distributed(value):
        comps = _signature.components(value)
        shapes = [s for s, _ in comps]
        if len({len(s) for s in shapes}) != 1 or len({d for _, d in comps}) != 1:
            raise TypeError(f"get_concrete_function: {value!r} has replicas of different ranks")
        dims = tuple(d[0] if len(set(d)) == 1 else None for d in zip(*shapes))
        return TensorSpec(dims, comps[0][1])
    if isinstance(value, (jax.Array, np.ndarray)):
        return TensorSpec.from_tensor(value)
    return value


def signature_of(fn: Callable, args: tuple, kwargs: dict) -> _signature.InputSignature:
    """The signature ``get_concrete_function(*args, **kwargs)`` asks for, on a function
    without an ``input_signature`` (TF: specs stay specs, values give their spec, Python values
    are literals)."""
    params = _signature.python_parameters(fn)
    try:
        bound = inspect.Signature(params).bind(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"get_concrete_function of {getattr(fn, '__name__', fn)}: {e}") from None
    bound.apply_defaults()
    specs: list = []
    for p in params:
        value: Any = bound.arguments.get(p.name, () if p.kind is p.VAR_POSITIONAL else None)
        if p.kind is p.VAR_KEYWORD:
            if value:
                raise TypeError("get_concrete_function: **kwargs take no arguments (TF's rule)")
            continue
        for v in value if p.kind is p.VAR_POSITIONAL else (value,):
            if p.name != "self":
                specs.append(jax.tree.map(_spec_of, v, is_leaf=is_distributed))
    return _signature.InputSignature(params, tuple(specs), getattr(fn, "__name__", "function"))


def examples(args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """The arguments with an array (zeros) for each `TensorSpec`, to trace with; None when a
    spec has an unknown dimension."""
    leaves = [x for x in jax.tree.leaves((args, kwargs)) if isinstance(x, TensorSpec)]
    if not all(s.is_fully_defined() for s in leaves):
        return None
    made = lambda x: _signature.example(x) if isinstance(x, TensorSpec) else x  # noqa: E731
    return jax.tree.map(made, args), jax.tree.map(made, kwargs)


class ConcreteFunction:
    """TF's ``ConcreteFunction``: a `jd.function` for one input signature.

    Made by ``Function.get_concrete_function``; call it with arguments that fit
    ``structured_input_signature``.
    """

    def __init__(
        self, name: str, sig: _signature.InputSignature, run: Callable, outputs: Any = None
    ) -> None:
        self._name, self._sig, self._run, self._outputs = name, sig, run, outputs
        self.structured_input_signature = sig.structured()

    @property
    def structured_outputs(self) -> Any:
        """The outputs' structure, a `TensorSpec` per array (TF: symbolic tensors)."""
        if self._outputs is None:
            raise ValueError(
                f"The concrete function of {self._name} for {self._sig} has unknown dimensions "
                "(None): JAX traces one program per concrete shape, so its outputs are known "
                "only per call. Ask get_concrete_function for full shapes to read them."
            )
        return self._outputs

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = self._sig.bind(args, kwargs)
        return self._run(args, kwargs)

    def __repr__(self) -> str:
        return f"<ConcreteFunction {self._name}{self._sig}>"
