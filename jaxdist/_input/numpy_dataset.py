"""`NumpyDataset`: the small dataset of `Strategy.experimental_make_numpy_dataset`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from jaxdist._base.layout import host_view
from jaxdist._input.spec import TensorSpec


class NumpyDataset:
    """A small dataset of the rows of NumPy arrays (``experimental_make_numpy_dataset``).

    Iterating yields rows (a nest of arrays yields nests of rows); ``batch``
    gives a dataset of batches usable with `Strategy.experimental_distribute_dataset`.

    >>> import numpy as np, jaxdist as jd
    >>> ds = jd.NumpyDataset(np.arange(5))
    >>> [b.tolist() for b in ds.batch(2)], len(ds)
    ([[0, 1], [2, 3], [4]], 5)
    """

    def __init__(self, data: Any, batch_size: int | None = None, drop_remainder: bool = False):
        leaves, treedef = jax.tree.flatten(data)
        arrays = [host_view(x) for x in leaves]
        if not arrays or any(x.ndim == 0 for x in arrays):
            raise ValueError(
                "numpy_input must be an array (or a dict/tuple/list nest of arrays) with a "
                f"leading axis of rows; got {data!r}."
            )
        sizes = {x.shape[0] for x in arrays}
        if len(sizes) != 1:
            raise ValueError(
                f"numpy_input's arrays must have the same number of rows; got {sorted(sizes)}."
            )
        self._leaves, self._treedef = arrays, treedef
        self._rows = sizes.pop()
        self.batch_size = batch_size
        self.drop_remainder = drop_remainder

    def batch(self, batch_size: int, drop_remainder: bool = False) -> NumpyDataset:
        """A dataset of consecutive ``batch_size`` rows (the last may be shorter).

        Args:
            batch_size: rows per batch, a positive int.
            drop_remainder: drop a last batch shorter than ``batch_size``.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
            raise TypeError(f"batch_size must be an int; got {batch_size!r}.")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive; got {batch_size}.")
        if self.batch_size is not None:
            raise ValueError("This NumpyDataset is already batched; batch the unbatched one.")
        data = jax.tree.unflatten(self._treedef, self._leaves)
        return NumpyDataset(data, int(batch_size), bool(drop_remainder))

    def __len__(self) -> int:
        if self.batch_size is None:
            return self._rows
        full, rest = divmod(self._rows, self.batch_size)
        return full + (1 if rest and not self.drop_remainder else 0)

    def __iter__(self) -> Iterator:
        step = self.batch_size
        for i in range(len(self)):
            if step is None:
                yield jax.tree.unflatten(self._treedef, [x[i] for x in self._leaves])
            else:
                rows = slice(i * step, (i + 1) * step)
                yield jax.tree.unflatten(self._treedef, [x[rows] for x in self._leaves])

    def as_numpy_iterator(self) -> Iterator:
        """An iterator of the elements (as `tf.data.Dataset.as_numpy_iterator`)."""
        return iter(self)

    @property
    def element_spec(self) -> Any:
        """`TensorSpec` leaves of one element (batch dimension None when batched)."""
        lead = () if self.batch_size is None else (None,)
        return jax.tree.unflatten(
            self._treedef, [TensorSpec(lead + x.shape[1:], x.dtype) for x in self._leaves]
        )

    def __repr__(self) -> str:
        return f"NumpyDataset(rows={self._rows}, batch_size={self.batch_size})"
