"""TF's ``tf.function`` arguments for `jd.function`: its options checked, an ``input_signature``.

An ``input_signature`` is bound as TF 2.21 binds it (``function_type_utils``): the specs go to the
function's parameters in order (a parameter named ``self`` and ``**kwargs`` take none; ``*args``
takes the rest as positional-only ``args_0``, ``args_1``, ...); a parameter past the specs keeps
its default, and only that value; a keyword-only one must have a default. A call is bound to that
signature before any work: too many, missing or unknown arguments are Python's binding errors, an
array of another dtype, rank or known dimension is a `TypeError` naming the argument, its spec and
what was given, as TF's ``Binding inputs to tf.function failed``. NumPy arrays and Python values
are converted to the spec's dtype as TF converts them (a Python float to an integer spec is a
`TypeError`, as in TF); JAX arrays, like TF's tensors, must have the spec's dtype. A distributed
value (`PerReplica`, `Mirrored`) fits a spec when each replica's component does (TF's
``PerReplicaSpec`` of it; a distributed dataset's ``element_spec`` is that spec).

`ConcreteFunction` is TF's ``get_concrete_function()``: the function for one signature.

>>> import jaxdist as jd
>>> def scaled(self, x, k=2):
...     return x * k
>>> sig = InputSignature.of(scaled, [jd.TensorSpec((None,), "float32")])
>>> print(sig)
(self, x: TensorSpec(shape=(None,), dtype=float32, name=None), k=2)
>>> args, kwargs = sig.bound().bind(([1.0, 2.0],), {})
>>> args[0].dtype, args[0].shape, args[1]
(dtype('float32'), (2,), 2)
>>> sig.bound().bind(([1.0],), {"k": 3})
Traceback (most recent call last):
TypeError: Binding inputs to jd.function scaled failed due to `Can not cast 3 to Literal[2]`...
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdist._input.spec import TensorSpec
from jaxdist._values import layout as _layout
from jaxdist._values.values import is_distributed

_BOOLS = ("autograph", "reduce_retracing", "experimental_relax_shapes")
_OPTIONAL_BOOLS = ("jit_compile", "experimental_compile", "experimental_follow_type_hints")
_LITERAL = "literal"  # a parameter past the specs: only its default value fits


def check_options(**options: Any) -> bool:
    """Checks `jd.function`'s TF options; returns ``reduce_retracing`` (or its old name's value).

    None of them changes what jaxdist runs (see `jaxdist.function`): each is checked for its
    type, so that a misspelt value is an error rather than ignored.
    """
    for name in _BOOLS + _OPTIONAL_BOOLS:
        value = options[name]
        if not (type(value) is bool or (value is None and name not in _BOOLS[:2])):
            allowed = "a bool" if name in _BOOLS[:2] else "a bool or None"
            raise TypeError(f"jd.function({name}=...) takes {allowed}; got {value!r}.")
    implements = options["experimental_implements"]
    if implements is not None and not isinstance(implements, str):
        raise TypeError(
            "jd.function(experimental_implements=...) takes a str (the name of the function "
            f"it implements) or None; got {type(implements).__name__}."
        )
    attributes = options["experimental_attributes"]
    if attributes is not None and not (
        isinstance(attributes, Mapping) and all(isinstance(k, str) for k in attributes)
    ):
        raise TypeError(
            "jd.function(experimental_attributes=...) takes a dict with str keys or None; "
            f"got {attributes!r}."
        )
    relax = options["experimental_relax_shapes"]
    return bool(options["reduce_retracing"] or relax)


def _spec_leaf(leaf: Any) -> TensorSpec:
    if isinstance(leaf, TensorSpec):
        return leaf
    if isinstance(leaf, jax.ShapeDtypeStruct):
        return TensorSpec.from_spec(leaf)
    raise TypeError(
        "jd.function(input_signature=...) must be a possibly nested list or tuple of "
        f"jd.TensorSpec; got {leaf!r} ({type(leaf).__name__}) in it."
    )


def check_signature(input_signature: Any) -> tuple:
    """``input_signature`` as a tuple of spec structures (`TensorSpec` leaves), or TypeError."""
    if not isinstance(input_signature, (list, tuple)):
        raise TypeError(
            "jd.function(input_signature=...) must be a list or tuple of jd.TensorSpec (one "
            f"per argument); got {type(input_signature).__name__}."
        )
    return tuple(jax.tree.map(_spec_leaf, s, is_leaf=lambda x: x is None) for s in input_signature)


def _constrain(params: list[inspect.Parameter], specs: tuple) -> list[tuple]:
    """TF's ``add_type_constraints``: ``[(parameter, spec structure | _LITERAL | None)]``."""
    out: list[tuple] = []
    left = list(specs)
    var_pos = any(p.kind is p.VAR_POSITIONAL for p in params)
    for p in params:
        kind = p.POSITIONAL_ONLY if var_pos and p.kind is p.POSITIONAL_OR_KEYWORD else p.kind
        if p.name == "self":
            out.append((p.replace(kind=kind), None))
        elif p.kind is p.VAR_KEYWORD:  # (takes nothing: an unknown keyword is an error)
            continue
        elif p.kind is p.VAR_POSITIONAL:
            names = [f"{p.name}_{i}" for i in range(len(left))]
            out += [(inspect.Parameter(n, p.POSITIONAL_ONLY), left.pop(0)) for n in names]
        elif p.kind is p.KEYWORD_ONLY and p.default is p.empty:
            raise TypeError(
                "jd.function: since input_signature is defined, keyword-only parameter "
                f"`{p.name}` must have a default value (TF's rule)."
            )
        elif left:
            out.append((p.replace(kind=kind), left.pop(0)))
        elif p.default is not p.empty:
            out.append((p.replace(kind=kind), _LITERAL))
        else:
            raise TypeError(f"jd.function: input_signature missing type constraint for {p.name}")
    if left:
        raise TypeError(
            f"jd.function: input_signature contains {len(left)} extra type constraints."
        )
    return out


def python_parameters(fn: Callable) -> list[inspect.Parameter]:
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # (a builtin without a signature: its arguments as *args)
        return [inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL)]


class InputSignature:
    """A function's parameters with TF's type constraints from an ``input_signature``."""

    def __init__(self, params: list[inspect.Parameter], specs: tuple, name: str) -> None:
        self.specs, self._name = specs, name
        self._constrained = _constrain(params, specs)
        self._params = params
        self._bound: InputSignature | None = None
        plain = [p for p, _ in self._constrained]
        seen_default = False  # (``(x, y=1, *args)``: the args after y take no default)
        for i in range(len(plain) - 1, -1, -1):
            if plain[i].kind is plain[i].POSITIONAL_ONLY:
                seen_default = seen_default or plain[i].default is plain[i].empty
                if seen_default and plain[i].default is not plain[i].empty:
                    plain[i] = plain[i].replace(default=plain[i].empty)
        self._signature = inspect.Signature(plain)

    @classmethod
    def of(cls, fn: Callable, input_signature: Any) -> InputSignature:
        """The signature of ``fn`` (a function or method) under ``input_signature``."""
        name = getattr(fn, "__name__", type(fn).__name__)
        return cls(python_parameters(fn), check_signature(input_signature), name)

    def bound(self) -> InputSignature:
        """The signature once the first parameter (``self``) is bound: a method's."""
        if self._bound is None:
            self._bound = InputSignature(self._params[1:], self.specs, self._name)
        return self._bound

    def __str__(self) -> str:
        parts = [
            f"{p.name}: {c!r}"
            if c not in (None, _LITERAL)
            else f"{p.name}={p.default!r}"
            if c is _LITERAL
            else p.name
            for p, c in self._constrained
        ]
        return f"({', '.join(parts)})"

    def bind(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """The call's arguments bound and converted (TypeError when they do not fit)."""
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as e:
            raise self._error(str(e), args, kwargs) from None
        bound.apply_defaults()
        for p, constraint in self._constrained:
            if constraint is None or p.name not in bound.arguments:
                continue
            value = bound.arguments[p.name]
            if constraint is _LITERAL:
                if not _same(value, p.default):
                    raise self._error(
                        f"Can not cast {value!r} to Literal[{p.default!r}]", args, kwargs
                    )
                continue
            bound.arguments[p.name] = self._fit(p.name, constraint, value, args, kwargs)
        return tuple(bound.args), dict(bound.kwargs)

    def _fit(self, name: str, spec: Any, value: Any, args: tuple, kwargs: dict) -> Any:
        specs, treedef = jax.tree.flatten(spec)
        try:
            leaves = treedef.flatten_up_to(value)  # type: ignore[attr-defined]
        except (ValueError, TypeError):
            got = _describe(value)
            raise self._error(
                f"argument `{name}` {got} does not have the structure of {spec!r}", args, kwargs
            ) from None
        fitted = []
        for s, v in zip(specs, leaves):
            if not isinstance(s, TensorSpec):  # (a concrete function's Python value)
                if not _same(v, s):
                    raise self._error(f"Can not cast {v!r} to Literal[{s!r}]", args, kwargs)
                fitted.append(v)
                continue
            out, got = fit(s, v)
            if got is not None:
                raise self._error(f"argument `{name}`: Can not cast {got} to {s!r}", args, kwargs)
            fitted.append(out)
        return jax.tree.unflatten(treedef, fitted)

    def _error(self, why: str, args: tuple, kwargs: dict) -> TypeError:
        shown = lambda v: jax.tree.map(_describe, v)  # noqa: E731
        return TypeError(
            f"Binding inputs to jd.function {self._name} failed due to `{why}`. Received args: "
            f"{shown(args)} and kwargs: {shown(kwargs)} for signature: {self}."
        )

    def structured(self) -> tuple[tuple, dict]:
        """TF's ``structured_input_signature``: specs named by their parameter when unnamed."""
        args: list = []
        kwargs: dict = {}
        for p, c in self._constrained:
            if c is None:
                continue
            value = (
                p.default if c is _LITERAL else jax.tree.map(lambda s, n=p.name: _named(s, n), c)
            )
            (kwargs.__setitem__(p.name, value) if p.kind is p.KEYWORD_ONLY else args.append(value))
        return tuple(args), kwargs


def _named(spec: Any, name: str) -> Any:
    if not isinstance(spec, TensorSpec) or spec.name:
        return spec
    return TensorSpec(spec.shape, spec.dtype, name)


def _same(value: Any, default: Any) -> bool:
    try:
        return value is default or bool(type(value) is type(default) and value == default)
    except Exception:  # noqa: BLE001 - an array's ``==`` is no literal
        return False


class _Shown(str):
    """A text shown as it is in a structure's repr (an array by its spec)."""

    def __repr__(self) -> str:
        return str(self)


def _describe(value: Any) -> Any:
    if isinstance(value, (jax.Array, np.ndarray)) or is_distributed(value):
        return _Shown(_spec_text(value))
    return value


def _spec_text(value: Any) -> str:
    if is_distributed(value):
        parts = ", ".join(f"TensorSpec(shape={s}, dtype={d})" for s, d in components(value))
        return f"{type(value).__name__}({parts})"
    return f"TensorSpec(shape={tuple(value.shape)}, dtype={np.dtype(value.dtype).name})"


def components(v: Any) -> list[tuple[tuple, np.dtype]]:
    padded = _layout.padded(v)
    if padded is not None:
        data, lengths = padded
        rest = tuple(data.shape[2:])
        return [(n if isinstance(n, tuple) else (n, *rest), np.dtype(data.dtype)) for n in lengths]
    parts = _layout.parts(v)
    if parts is not None:
        return [
            (tuple(np.shape(p)), np.dtype(getattr(p, "dtype", None) or np.asarray(p).dtype))
            for p in parts
        ]
    data = _layout.stacked(v)
    return [(tuple(data.shape[1:]), np.dtype(data.dtype))] * int(data.shape[0])


def _fits_shape(spec: TensorSpec, shape: tuple) -> bool:
    return len(shape) == spec.ndim and all(a is None or a == b for a, b in zip(spec.shape, shape))


def _convertible(value: Any, arr: np.ndarray, dtype: np.dtype) -> bool:
    """TF's conversion of a non-tensor to ``dtype``: NumPy values cast between numeric kinds;
    Python values not from a float to an integer or bool, nor from a complex to a real."""
    if arr.dtype.kind not in "biufc" or dtype.kind not in "biufc":
        return arr.dtype == dtype
    if isinstance(value, (np.ndarray, np.generic)):
        return True
    order = "buifc"  # (bool < int < float < complex: a Python value converts upwards)
    return order.index(arr.dtype.kind) <= order.index(dtype.kind) or arr.size == 0


def fit(spec: TensorSpec, value: Any) -> tuple[Any, str | None]:
    """``(value as passed on, None)`` when ``value`` fits ``spec``, else ``(None, what it is)``."""
    if isinstance(value, TensorSpec):  # (``get_concrete_function(spec)``: a subtype fits)
        ok = value.dtype == spec.dtype and _fits_shape(spec, value.shape)
        return (value, None) if ok else (None, repr(value))
    if is_distributed(value):
        ok = all(d == spec.dtype and _fits_shape(spec, s) for s, d in components(value))
        return (value, None) if ok else (None, _spec_text(value))
    if isinstance(value, jax.Array):  # a tensor: its own dtype (TF casts no tensor)
        if value.dtype != spec.dtype or not _fits_shape(spec, tuple(value.shape)):
            return None, _spec_text(value)
        return (value.astype(spec.dtype) if getattr(value, "weak_type", False) else value), None
    try:
        arr = np.asarray(value)
    except Exception:  # noqa: BLE001 - anything NumPy cannot read fits no spec
        return None, repr(value)
    if not _convertible(value, arr, spec.dtype):
        return None, repr(value) if arr.ndim == 0 else _spec_text(arr)
    if not _fits_shape(spec, arr.shape):
        return None, _spec_text(arr)
    return jnp.asarray(arr.astype(spec.dtype, copy=False)), None


def example(spec: TensorSpec) -> Any:
    """An array of ``spec`` (zeros), to trace with; ``spec`` must be fully defined."""
    return jnp.zeros(spec.shape, spec.dtype)
