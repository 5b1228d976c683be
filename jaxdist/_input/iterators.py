"""Distributed datasets and their iterators: the iteration protocol of distributed input.

A `DistributedDataset` opens a fresh producer of placed elements per epoch; a
`DistributedIterator` reads it, keeping ``experimental_per_replica_buffer_size``
elements ahead (`jax.device_put` is asynchronous, so their transfers overlap the
caller's step). Made by `jaxdist._input.datasets`.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from jaxdist._base import context as _context
from jaxdist._base import jax_internals as _jax_internals
from jaxdist._base.errors import InvalidArgumentError, OutOfRangeError
from jaxdist._input import feeds as _feeds
from jaxdist._input.place import EMPTY as _EMPTY
from jaxdist._input.place import INFINITE, UNKNOWN

FIRST_FILL = 4  # elements read ahead by the first call at most (see DistributedIterator)


class DistributedOptional:
    """The result of `DistributedIterator.get_next_as_optional`: a value, or none at the end.

    >>> import numpy as np, jaxdist as jd
    >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    >>> it = iter(s.experimental_distribute_dataset([np.arange(4)]))
    >>> opt = it.get_next_as_optional()
    >>> opt.has_value(), [x.tolist() for x in s.experimental_local_results(opt.get_value())]
    (True, [[0, 1], [2, 3]])
    >>> it.get_next_as_optional().has_value()
    False
    """

    def __init__(self, value: Any = _EMPTY, element_spec: Any = None) -> None:
        self._value = value
        self._element_spec = element_spec

    def has_value(self) -> bool:
        """Whether there is a value (False once the iterator is exhausted)."""
        return self._value is not _EMPTY

    def get_value(self) -> Any:
        """The value; raises TF's `jaxdist.errors.InvalidArgumentError` (a `ValueError`)
        when there is none."""
        if self._value is _EMPTY:
            raise InvalidArgumentError(
                "The optional has no value: the distributed iterator is exhausted. "
                "Check has_value() first."
            )
        return self._value

    @property
    def element_spec(self) -> Any:
        """The element spec of the iterator that made this optional."""
        return self._element_spec

    def __repr__(self) -> str:
        return f"DistributedOptional(has_value={self.has_value()})"


NEXT_IN_RUN = (
    "next(iterator) should be called from outside of replica_fn. "
    "e.g. strategy.run(replica_fn, args=(next(iterator),))"
)
"""TF's error for reading a distributed iterator inside `Strategy.run`."""


NEXT_WHILE_TRACING = (
    "A distributed iterator was read while JAX was tracing (inside jax.jit or a lax loop "
    "body). The batch would be compiled into the program as a constant: later calls would "
    "reuse it and the iterator would not advance. Read the iterator outside the jitted "
    "function and pass the batch in: `step(next(iterator))` with `step = jax.jit(...)`; for "
    "several steps per call, pass a list of batches (or stack them) and loop over them inside. "
    "Or make the function a jd.function (TF's tf.function), which reads the iterator on "
    "every call."
)
"""jaxdist's error for reading a distributed iterator while JAX traces (TF's tf.function
reads it as a graph op; a JAX trace cannot)."""


def _check_can_read() -> None:
    if _context.current().mode is _context.Mode.REPLICA:
        raise ValueError(NEXT_IN_RUN)
    if _jax_internals.tracing():
        raise RuntimeError(NEXT_WHILE_TRACING)


class DistributedIterator:
    """An iterator over a distributed dataset: each element holds every replica's batch.

    Get it with ``iter(distributed_dataset)``. At the end of the data ``next(it)``
    raises `StopIteration` and ``it.get_next()`` TF's
    `jaxdist.errors.OutOfRangeError` (a `StopIteration`);
    ``get_next_as_optional()`` never raises there. Read it
    outside the step, as TF requires: ``strategy.run(step, args=(next(it),))``;
    called inside `Strategy.run` (also under `jax.jit`) the three methods raise
    TF's `ValueError` without consuming an element, and while JAX traces (inside
    `jax.jit` or a `lax` loop body) a `RuntimeError`: a traced read would compile
    one batch into the program and never advance.

    Prefetching: with ``InputOptions(experimental_per_replica_buffer_size=N)``
    the iterator keeps the N elements after the one it returns already read
    and placed. The buffer fills as the loop advances: the first call reads at
    most ``1 + min(N, 4)`` elements and every later call at most two, so the
    first element comes at once even with a huge N on an endless dataset.
    `jax.device_put` is asynchronous, so their host-to-device transfers run
    while the caller's step runs (reading the source itself
    happens in the caller's thread). An error in a batch is raised when that
    element is reached, not earlier; in a multi-worker run at once (the other
    workers may be waiting for this one to agree on the next step).

    >>> import numpy as np, jaxdist as jd
    >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    >>> it = iter(s.experimental_distribute_dataset([np.arange(4), np.arange(4, 6)]))
    >>> [x.tolist() for x in s.experimental_local_results(it.get_next())]
    [[0, 1], [2, 3]]
    >>> try:
    ...     s.run(lambda: next(it))  # inside the step: TF's error, nothing consumed
    ... except ValueError as e:
    ...     print(e)
    next(iterator) should be called from outside of replica_fn. \
e.g. strategy.run(replica_fn, args=(next(iterator),))
    >>> [x.tolist() for x in s.experimental_local_results(next(it))]
    [[4], [5]]
    >>> next(it, "end")
    'end'
    """

    def __init__(
        self, producer: Iterator, buffer_size: int, element_spec: Any, defer_errors: bool = True
    ) -> None:
        self._element_spec = element_spec
        self._producer: Iterator | None = producer
        self._ahead = buffer_size
        self._defer = defer_errors
        self._buffer: collections.deque = collections.deque()

    def __iter__(self) -> DistributedIterator:
        return self

    def __next__(self) -> Any:
        feed = _feeds.active()
        if feed is not None and _context.current().mode is not _context.Mode.REPLICA:
            return feed.next(self, self._read)  # inside a jd.function: fed to its program
        _check_can_read()
        return self._read()

    def _read(self) -> Any:
        buffer = self._buffer
        # A call reads a bounded number of elements (the first call: the one it returns and
        # up to FIRST_FILL more; later calls: one more than they take), so a large buffer
        # (or AUTOTUNE on an endless dataset) fills as the loop advances and the first
        # element comes at once.
        stop = len(buffer) + (1 + min(self._ahead, FIRST_FILL) if not buffer else 2)
        while self._producer is not None and len(buffer) <= self._ahead and len(buffer) < stop:
            try:
                buffer.append((True, next(self._producer)))
            except StopIteration:
                self._producer = None
                buffer.append((False, None))
            except Exception as e:
                self._producer = None
                if not self._defer:  # across workers: the others wait for this one now
                    raise
                buffer.append((False, e))
        ok, value = buffer[0]
        if ok:
            buffer.popleft()
            return value
        if value is None:
            raise StopIteration
        raise value

    def get_next(self) -> Any:
        """The next element; raises TF's `jaxdist.errors.OutOfRangeError` (a
        `StopIteration`) at the end of the data."""
        try:
            return self.__next__()
        except OutOfRangeError:
            raise
        except StopIteration:
            raise OutOfRangeError(
                "End of sequence: the distributed iterator is exhausted."
            ) from None

    def get_next_as_optional(self) -> DistributedOptional:
        """The next element as a `DistributedOptional` (empty at the end of the data)."""
        _check_can_read()
        try:
            return DistributedOptional(self.__next__(), self._element_spec)
        except StopIteration:
            return DistributedOptional(_EMPTY, self._element_spec)

    @property
    def element_spec(self) -> Any:
        """The per-replica element spec (see `DistributedDataset.element_spec`)."""
        return self._element_spec


class DistributedDataset:
    """A dataset whose elements are split over a strategy's replicas.

    Made by `Strategy.experimental_distribute_dataset` and
    `Strategy.distribute_datasets_from_function`. Iterate it with ``for`` or
    ``iter()``; it can be iterated again when its source can (a list, a
    tf.data-like dataset, a loader, or a function making a fresh iterable per
    epoch). A source that is a one-shot iterator (a generator object) gives
    one epoch; iterating again raises `RuntimeError`. Each element has the
    structure of the source's batches with `PerReplica` leaves (plain arrays for
    a one-replica strategy).

    ``len(dataset)`` is the number of elements (steps) when it is known (TF has
    no ``len``); ``cardinality`` is TF's attribute (see there).

    >>> import numpy as np, jaxdist as jd
    >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    >>> dist = s.experimental_distribute_dataset([np.arange(4.0)])
    >>> dist.element_spec
    TensorSpec(shape=(None,), dtype=float32, name=None)
    >>> [[x.tolist() for x in s.experimental_local_results(b)] for b in dist]
    [[[0.0, 1.0], [2.0, 3.0]]]
    >>> len(dist), dist.cardinality
    (1, np.int64(1))
    """

    def __init__(
        self,
        open_producer: Callable[[], Iterator],
        element_spec: Any,
        buffer_size: int,
        cardinality: int = UNKNOWN,
        steps: int | None = None,
        defer_errors: bool = True,
    ) -> None:
        self._open_producer = open_producer
        self._defer = defer_errors
        self._element_spec = element_spec
        self._buffer_size = buffer_size
        self._cardinality = np.int64(cardinality)
        self._steps = cardinality if steps is None else steps

    def __iter__(self) -> DistributedIterator:
        return DistributedIterator(
            self._open_producer(), self._buffer_size, self._element_spec, self._defer
        )

    def __len__(self) -> int:
        n = int(self._steps)
        if n == INFINITE:
            raise TypeError("The distributed dataset is infinite: it has no len().")
        if n < 0:
            raise TypeError(
                "The distributed dataset's length is unknown: its source has no len() "
                "(a generator, or a function returning one). cardinality is -2."
            )
        return n

    def __bool__(self) -> bool:
        return True  # as any object: not len(), which may be unknown

    @property
    def element_spec(self) -> Any:
        """What one replica's value of an element looks like.

        The source batch's structure with a `jaxdist.TensorSpec` per leaf:
        the batch dimension is None (replicas may get different sizes, as in
        TF's ``TensorSpec(shape=(None, ...))``), the other dimensions and the
        dtype are those of the first batch (the dtype as placed on the devices,
        e.g. int32 for int64 data without x64). Unbatched elements (see
        `Strategy.distribute_datasets_from_function`) keep their whole shape,
        e.g. ``()`` for scalars. None for an empty dataset.
        """
        return self._element_spec

    @property
    def cardinality(self) -> np.int64:
        """TF's attribute: a `numpy.int64`, -1 when the source is infinite, -2 when its
        length is unknown.

        The source's length comes from ``len()``, or a tf.data-style ``cardinality()``
        method; for a function, from what it returned for the first epoch. As in TF
        2.21, it is the number of steps for `experimental_distribute_dataset` and a
        ``PER_REPLICA`` dataset function, and the per-worker dataset's own length for
        a ``PER_WORKER`` `distribute_datasets_from_function` (where several replicas
        share one step: 32 batches over 4 replicas are 8 steps, cardinality 32).
        ``len(dataset)`` is always the number of steps.
        """
        return self._cardinality

    def reduce(self, initial_state: Any, reduce_func: Callable[[Any, Any], Any]) -> Any:
        """Folds ``reduce_func(state, element)`` over the elements, from ``initial_state``.

        >>> import numpy as np, jaxdist as jd
        >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
        >>> dist = s.experimental_distribute_dataset([np.arange(4.0), np.arange(4.0)])
        >>> float(dist.reduce(0.0, lambda acc, x: acc + s.reduce("SUM", x, axis=0)))
        12.0
        """
        state = initial_state
        for element in self:
            state = reduce_func(state, element)
        return state


class DatasetIterator:
    """The iterator of the TF1 ``strategy.make_dataset_iterator(dataset)``.

    It iterates over ``strategy.experimental_distribute_dataset(dataset)``, with
    TF1's iterator API: `get_next`, `initialize` (eagerly, as TF's eager
    iterator does: starts again from the beginning of the dataset and returns
    None) and `initializer` (the same). `Strategy.experimental_run` consumes it.

    >>> import numpy as np, jaxdist as jd
    >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    >>> it = s.make_dataset_iterator([np.arange(4), np.arange(4, 8)])
    >>> [x.tolist() for x in s.experimental_local_results(it.get_next())]
    [[0, 1], [2, 3]]
    >>> it.initialize()  # back to the first batch
    >>> [x.tolist() for x in s.experimental_local_results(it.get_next())]
    [[0, 1], [2, 3]]
    """

    def __init__(self, dataset: DistributedDataset) -> None:
        self._dataset = dataset
        self._iterator = iter(dataset)

    def initialize(self) -> None:
        """Starts again from the first element (TF's eager ``initialize``); returns None."""
        self._iterator = iter(self._dataset)

    @property
    def initializer(self) -> None:
        """TF1's initializer: eagerly, `initialize` (returns None)."""
        return self.initialize()

    def get_next(self) -> Any:
        """The next element; `jaxdist.errors.OutOfRangeError` at the end of the data."""
        return self._iterator.get_next()

    def __iter__(self) -> DatasetIterator:
        return self

    def __next__(self) -> Any:
        return next(self._iterator)

    @property
    def element_spec(self) -> Any:
        """The element's structure of `jaxdist.TensorSpec` (None for an empty dataset)."""
        return self._iterator.element_spec
