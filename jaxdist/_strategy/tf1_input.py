"""`StrategyV1`'s TF1-era input methods, as the base class `InputMethodsV1` of `StrategyV1`.

TF1 fed a step from an iterator (``experimental_run``), built its iterators with
``make_dataset_iterator`` and its datasets with ``experimental_make_numpy_dataset`` and
``experimental_distribute_datasets_from_function`` (TF 2.2's name of
``distribute_datasets_from_function``). Each is a TF1 name over this wing's datasets and
iterators, so they live here rather than beside `StrategyV1`'s other TF1 methods
(`jaxdist._strategy.compat`: session config, clusters, logical devices, the renamed methods).

They are a base class (``StrategyV1(InputMethodsV1)``, ``InputMethodsV1(Strategy)``) rather
than functions the class would call: the methods keep their signatures, docstrings and
examples as they were, and `isinstance`/`issubclass` with `Strategy` and `StrategyV1` are
unchanged. `deprecated`, which both modules use to mark TF1 methods, is defined here, the
lower of the two.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from jaxdist._base import context as _context
from jaxdist._base.options import InputOptions
from jaxdist._input.datasets import DistributedDataset, InputContext
from jaxdist._input.iterators import DatasetIterator
from jaxdist._input.numpy_dataset import NumpyDataset
from jaxdist._strategy.strategy import Strategy

F = TypeVar("F", bound=Callable[..., Any])


def deprecated(replacement: str) -> Callable[[F], F]:
    """Marks a TF1-era method: calling it warns, pointing at the caller, naming ``replacement``."""

    def decorate(method: F) -> F:
        @functools.wraps(method)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            warnings.warn(
                f"Strategy.{method.__name__} is deprecated (a TF 1.x API kept for porting); "
                f"use {replacement} instead.",
                DeprecationWarning,
                stacklevel=2,
            )
            return method(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


class InputMethodsV1(Strategy):
    """`Strategy` plus the TF1-era input methods; the base class of `StrategyV1`.

    >>> import jaxdist as jd
    >>> issubclass(jd.StrategyV1, InputMethodsV1) and issubclass(InputMethodsV1, jd.Strategy)
    True
    """

    @deprecated("run(fn, args=(next(iterator),))")
    def experimental_run(self, fn: Callable, input_iterator: Any = None) -> Any:
        """Runs ``fn`` on every replica with the next element of ``input_iterator``.

        Deprecated (TF 1.x): use ``strategy.run(fn, args=(next(iterator),))``.

        Takes one element from ``input_iterator`` (``get_next()`` where the
        iterator has it, as TF1 iterators do, else ``next()``) and passes it as
        the only argument of ``fn``; with no iterator ``fn`` takes no argument.
        Returns what `run` returns: ``fn``'s structure with `PerReplica`
        leaves (plain values for one replica).

        >>> import warnings, jax.numpy as jnp, jaxdist as jd
        >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
        >>> it = iter([s.experimental_distribute_values_from_function(
        ...     lambda ctx: jnp.full(2, ctx.replica_id_in_sync_group))])
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore", DeprecationWarning)
        ...     out = s.experimental_run(lambda x: x * 2, it)
        >>> [x.tolist() for x in s.experimental_local_results(out)]
        [[0, 0], [2, 2]]

        Args:
            fn: the step function; it takes the iterator's element, or nothing.
            input_iterator: an iterator of (distributed) elements, e.g.
                ``iter(strategy.experimental_distribute_dataset(batches))``, or None.

        Raises:
            TypeError: when ``input_iterator`` is not an iterator (pass ``iter(dataset)``).
            StopIteration: when ``input_iterator`` is exhausted.
        """
        if input_iterator is None:
            return self.run(fn)
        get_next = getattr(input_iterator, "get_next", None)
        if not callable(get_next):
            if not hasattr(input_iterator, "__next__"):
                raise TypeError(
                    "input_iterator must be an iterator (with __next__ or get_next), e.g. "
                    "iter(strategy.experimental_distribute_dataset(dataset)); got "
                    f"{type(input_iterator).__name__}."
                )
            get_next = input_iterator.__next__
        with self.scope():
            element = get_next()
        return self.run(fn, args=(element,))

    def make_dataset_iterator(self, dataset: Any) -> DatasetIterator:
        """(TF 1.x) An iterator over ``experimental_distribute_dataset(dataset)``.

        ``dataset`` yields global batches, split over the replicas as
        `experimental_distribute_dataset` splits them. The iterator has TF1's
        ``get_next()``, ``initialize()`` / ``initializer`` (eagerly: start again
        from the beginning) and is what `experimental_run` consumes. TF 2.21 has
        the method on its TF2 strategies too, without a warning.

        >>> import warnings, numpy as np, jaxdist as jd
        >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
        >>> it = s.make_dataset_iterator([np.arange(4.0)])
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore", DeprecationWarning)
        ...     out = s.experimental_run(lambda x: x * 2, it)
        >>> [x.tolist() for x in s.experimental_local_results(out)]
        [[0.0, 2.0], [4.0, 6.0]]

        Raises:
            TypeError: ``dataset`` is not iterable (see `experimental_distribute_dataset`).
        """
        return DatasetIterator(self.experimental_distribute_dataset(dataset))

    @deprecated("distribute_datasets_from_function")
    def experimental_distribute_datasets_from_function(
        self, dataset_fn: Callable[[InputContext], Any], options: InputOptions | None = None
    ) -> DistributedDataset:
        """Deprecated name of `distribute_datasets_from_function` (warns).

        >>> import warnings, numpy as np, jaxdist as jd
        >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore", DeprecationWarning)
        ...     dist = s.experimental_distribute_datasets_from_function(
        ...         lambda ctx: [np.arange(2)])
        >>> len(list(dist))
        1
        """
        return self.distribute_datasets_from_function(dataset_fn, options)

    @deprecated("experimental_distribute_dataset (pass a list or any iterable of batches)")
    def experimental_make_numpy_dataset(
        self, numpy_input: Any, session: Any = None
    ) -> NumpyDataset:
        """A `NumpyDataset` of the rows of ``numpy_input`` (deprecated, as in TF 1.x; warns).

        Batch it with ``.batch(global_batch_size)`` and pass it to
        `experimental_distribute_dataset`.

        >>> import warnings, numpy as np, jaxdist as jd
        >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore", DeprecationWarning)
        ...     ds = s.experimental_make_numpy_dataset(np.arange(6.0)).batch(4)
        >>> [[x.tolist() for x in s.experimental_local_results(b)]
        ...  for b in s.experimental_distribute_dataset(ds)]
        [[[0.0, 1.0], [2.0, 3.0]], [[4.0], [5.0]]]

        Args:
            numpy_input: an array, or a dict/tuple/list nest of arrays with the same rows.
            session: ignored (TF 1.x sessions do not exist in JAX).
        """
        _context.require_cross_replica(self, "experimental_make_numpy_dataset")
        return NumpyDataset(numpy_input)
