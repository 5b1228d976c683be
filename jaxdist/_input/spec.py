"""`TensorSpec`: TF's description of one tensor (shape, dtype, name), owned by jaxdist.

TF's datasets describe their elements with `tf.TensorSpec`, whose shape may hold `None` for a
dimension that is not known ahead (a batch dimension, since the last batch can be smaller).
`jax.ShapeDtypeStruct` was jaxdist's spec until JAX 0.11, which rejects `None` in a shape. jaxdist
keeps TF's meaning with a small type of its own, the same on every JAX version: every dataset's and
iterator's `element_spec` is a pytree of `TensorSpec` leaves.

A `TensorSpec` is a frozen value (hashable, equal by shape, dtype and name) and a pytree leaf. It is
not an array: it describes one. `jax.ShapeDtypeStruct(spec.shape, spec.dtype)` is the JAX struct of
a spec whose shape is fully known (`spec.is_fully_defined()`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np


def _shape(shape: Any) -> tuple[int | None, ...]:
    if shape is None:
        raise TypeError("TensorSpec: shape must be a sequence of ints or None; got None")
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    if not isinstance(shape, Iterable) or isinstance(shape, (str, bytes)):
        raise TypeError(
            f"TensorSpec: shape must be a sequence of ints or None; got {type(shape).__name__}"
        )
    dims = []
    for d in shape:
        if d is not None and (isinstance(d, bool) or not isinstance(d, (int, np.integer))):
            raise TypeError(f"TensorSpec: each dimension must be an int or None; got {d!r}")
        if d is not None and d < 0:
            raise ValueError(f"TensorSpec: dimensions must be >= 0 or None; got {d}")
        dims.append(None if d is None else int(d))
    return tuple(dims)


def _dtype(dtype: Any) -> np.dtype:
    try:
        return np.dtype(dtype)
    except TypeError as e:
        raise TypeError(f"TensorSpec: dtype must be a NumPy/JAX dtype; got {dtype!r}") from e


class TensorSpec:
    """Describes a tensor: its shape (`None` where a dimension is unknown), dtype and name.

    jaxdist's `tf.TensorSpec`. A distributed dataset's `element_spec` is a structure of these,
    with `None` for the batch dimension.

    Args:
        shape: a sequence of ints and `None`s (an int gives a 1-D shape).
        dtype: a NumPy or JAX dtype (default float32).
        name: an optional name.

    Example:
        >>> import jaxdist as jd
        >>> spec = jd.TensorSpec((None, 3), "float32")
        >>> spec
        TensorSpec(shape=(None, 3), dtype=float32, name=None)
        >>> spec.is_compatible_with(jd.TensorSpec((8, 3), "float32"))
        True
        >>> import numpy as np
        >>> spec.is_compatible_with(np.zeros((8, 4), np.float32))
        False
    """

    __slots__ = ("_shape", "_dtype", "_name")

    def __init__(self, shape: Any, dtype: Any = np.float32, name: str | None = None) -> None:
        if name is not None and not isinstance(name, str):
            raise TypeError(f"TensorSpec: name must be a str or None; got {type(name).__name__}")
        self._shape = _shape(shape)
        self._dtype = _dtype(dtype)
        self._name = name

    @classmethod
    def from_tensor(cls, tensor: Any, name: str | None = None) -> TensorSpec:
        """The spec of an array (anything with `shape` and `dtype`).

        >>> import numpy as np, jaxdist as jd
        >>> jd.TensorSpec.from_tensor(np.zeros((2, 5), np.int32))
        TensorSpec(shape=(2, 5), dtype=int32, name=None)
        """
        if not (hasattr(tensor, "shape") and hasattr(tensor, "dtype")):
            tensor = np.asarray(tensor)
        return cls(tuple(tensor.shape), tensor.dtype, name)

    @classmethod
    def from_spec(cls, spec: Any, name: str | None = None) -> TensorSpec:
        """A `TensorSpec` with another spec's shape and dtype (e.g. a `jax.ShapeDtypeStruct`).

        >>> import jax, jaxdist as jd
        >>> jd.TensorSpec.from_spec(jax.ShapeDtypeStruct((4,), "int32"), name="x")
        TensorSpec(shape=(4,), dtype=int32, name='x')
        """
        return cls(tuple(spec.shape), spec.dtype, name if name is not None else _name_of(spec))

    @property
    def shape(self) -> tuple[int | None, ...]:
        """The shape, `None` where a dimension is unknown."""
        return self._shape

    @property
    def dtype(self) -> np.dtype:
        """The element type (a `numpy.dtype`)."""
        return self._dtype

    @property
    def name(self) -> str | None:
        """The name given at construction, or None."""
        return self._name

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self._shape)

    def is_fully_defined(self) -> bool:
        """Whether every dimension is known (no `None`)."""
        return None not in self._shape

    def is_compatible_with(self, spec_or_value: Any) -> bool:
        """Whether a spec or an array could be described by this spec (TF's rule).

        Dtypes must be equal, ranks equal, and each dimension equal or unknown on either side.
        """
        other = spec_or_value
        if not isinstance(other, TensorSpec):
            if not (hasattr(other, "shape") and hasattr(other, "dtype")):
                try:
                    other = np.asarray(other)
                except Exception:  # noqa: BLE001 - anything NumPy cannot read is not compatible
                    return False
            try:
                other = TensorSpec(tuple(other.shape), other.dtype)
            except (TypeError, ValueError):
                return False
        if other.dtype != self._dtype or len(other.shape) != len(self._shape):
            return False
        return all(a is None or b is None or a == b for a, b in zip(self._shape, other.shape))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TensorSpec):
            return NotImplemented
        return (self._shape, self._dtype, self._name) == (other._shape, other._dtype, other._name)

    def __hash__(self) -> int:
        return hash((TensorSpec, self._shape, self._dtype.str, self._name))

    def __repr__(self) -> str:
        return f"TensorSpec(shape={self._shape}, dtype={self._dtype.name}, name={self._name!r})"

    def __reduce__(self) -> tuple:
        return (TensorSpec, (self._shape, self._dtype, self._name))


def _name_of(spec: Any) -> str | None:
    name = getattr(spec, "name", None)
    return name if isinstance(name, str) else None
