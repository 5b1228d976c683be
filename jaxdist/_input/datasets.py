"""Distributed input: the bodies of the `Strategy` input methods, and `InputContext`.

`distribute_dataset` and `distribute_datasets_from_function` are the bodies of
the `Strategy` methods of the same names. Each reads its dataset's first
element now (to check it and to give ``element_spec``) and returns a
`DistributedDataset` (`jaxdist._input.iterators`) whose producers, below, read the
sources and place each step with a `Placer` (`jaxdist._input.place`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

from jaxdist._base.devices import Replicas
from jaxdist._base.options import (
    InputOptions,
    InputReplicationMode,
    buffer_size,
    check_dataset_fn_modes,
    check_input_options,
)
from jaxdist._base.validate import check_callable, is_number
from jaxdist._input.iterators import DistributedDataset as DistributedDataset
from jaxdist._input.iterators import DistributedIterator as DistributedIterator
from jaxdist._input.iterators import DistributedOptional as DistributedOptional
from jaxdist._input.place import EMPTY as _EMPTY
from jaxdist._input.place import (
    INFINITE,
    UNKNOWN,
    Placer,
    Source,
    element_leaves,
    host_leaves,
    scalar_leaf,
    spec_of,
)
from jaxdist._input.steps import (
    SplitSteps,
    lengths_agree,
    per_replica_steps,
    per_worker_steps,
    produce,
    synced,
)


@dataclasses.dataclass(frozen=True)
class InputContext:
    """What a ``dataset_fn`` of `Strategy.distribute_datasets_from_function` sees.

    Args:
        num_input_pipelines: how many input pipelines (``dataset_fn`` calls) there are.
        input_pipeline_id: which one this is (shard the data by it).
        num_replicas_in_sync: the strategy's number of replicas.

    >>> import jaxdist as jd
    >>> ctx = jd.InputContext(num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=4)
    >>> ctx.get_per_replica_batch_size(64)
    16
    >>> ctx
    InputContext(num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=4)
    >>> print(ctx)  # str() is TF's text
    tf.distribute.InputContext(input pipeline id 1, total: 2)
    """

    num_input_pipelines: int = 1
    input_pipeline_id: int = 0
    num_replicas_in_sync: int = 1

    def __str__(self) -> str:
        return (
            f"tf.distribute.InputContext(input pipeline id {self.input_pipeline_id}, "
            f"total: {self.num_input_pipelines})"
        )

    def get_per_replica_batch_size(self, global_batch_size: Any) -> Any:
        """``global_batch_size // num_replicas_in_sync``.

        Raises:
            TypeError: ``global_batch_size`` is not a number (a Python or NumPy
                number, a numeric array, or a traced one).
            ValueError: when ``global_batch_size`` is not divisible by
                ``num_replicas_in_sync``.
        """
        n = self.num_replicas_in_sync
        dtype = getattr(global_batch_size, "dtype", None)
        if not is_number(global_batch_size) and not (dtype is not None and dtype.kind in "iuf"):
            raise TypeError(
                "get_per_replica_batch_size: global_batch_size must be a number (an int); got "
                f"{type(global_batch_size).__name__} {global_batch_size!r}."
            )
        if isinstance(global_batch_size, jax.core.Tracer):
            return global_batch_size // n
        if int(np.asarray(global_batch_size)) % n:
            raise ValueError(
                f"The `global_batch_size` {global_batch_size} is not divisible by "
                f"`num_replicas_in_sync` {n}."
            )
        if isinstance(global_batch_size, (int, np.integer)):
            return int(global_batch_size) // n
        return global_batch_size // n


# -- producers -------------------------------------------------------------------


def split_producer(
    it: Iterator,
    placer: Placer,
    what: str,
    batched: bool,
    spec: Any,
    count: Callable[[], int],
    ahead: int,
) -> Iterator:
    """Elements of `experimental_distribute_dataset`: each global batch split (an
    unbatched element, on one replica, passed whole); across workers whose numbers of
    batches may differ, kept in step (`jaxdist._input.steps`; ``ahead``: the buffer size)."""
    if not lengths_agree(placer, count()):
        yield from synced(it, SplitSteps(placer, what, spec, ahead), True)
        return
    for batch in it:
        yield placer.split(batch, what) if batched else placer.combine([batch], what, False)


def step_count(counts: Sequence[int], batched: bool, shared: int = 1) -> int:
    """The number of steps over datasets of ``counts`` elements (-1 infinite, -2 unknown),
    ``shared`` replicas taking consecutive elements of each: batched data runs while any
    dataset has a batch, unbatched data while every one has a full step."""
    if UNKNOWN in counts:
        return UNKNOWN
    steps = [-(-c // shared) if batched else c // shared for c in counts if c >= 0]
    if batched:
        return INFINITE if INFINITE in counts else max(steps)
    return min(steps) if steps else INFINITE


def inspect_first(first: Any, what: str, on_device: bool) -> tuple[Any, bool]:
    """The element spec from a peeked first element (None if empty), and whether it is a
    batch (no leaf is a scalar)."""
    if first is _EMPTY:
        return None, True
    leaves, treedef = element_leaves(first, f"the first element of {what}")
    batched = scalar_leaf(leaves) is None
    if batched:  # checks the batch (one leading size)
        leaves, treedef = host_leaves(first, f"the first batch of {what}")
    return spec_of(leaves, treedef, on_device, batched), batched


# -- the Strategy methods ----------------------------------------------------------


def distribute_dataset(replicas: Replicas, dataset: Any, options: InputOptions | None) -> Any:
    """`Strategy.experimental_distribute_dataset`: every global batch split over the replicas.

    ``dataset`` is any re-iterable iterable of batches: arrays (NumPy or JAX) or
    dict/tuple/namedtuple nests of them with a leading global-batch axis (a list
    of batches, a `tf.data.Dataset` through ``as_numpy_iterator``, a grain or
    torch loader), or a function returning a fresh one per epoch (called once
    per epoch, as ``tf.data.Dataset.from_generator`` calls its function; use it
    for generators). A batch of ``b`` gives each replica ``ceil(b / R)`` rows,
    filled greedily as TF does: 6 over 4 replicas is ``[2, 2, 2, 0]``, and no
    row is dropped or repeated. Evenly divisible batches become one sharded
    array per leaf (one `jax.device_put`); partial ones one padded array or
    per-device parts. Each element has the batch's structure with `PerReplica`
    leaves (plain arrays for one replica). The first batch is read now, to check
    it and to give ``element_spec``. As in TF, any leading axis is a batch axis
    (elements of shape ``(3,)`` are split as batches of 3), and on one replica
    unbatched elements (scalars) are yielded unchanged. Across workers, if the
    workers' datasets end at different steps, a worker whose data ran out gets
    empty batches while any worker has data (see
    `distribute_datasets_from_function`).

    >>> import numpy as np, jaxdist as jd
    >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    >>> def gen():
    ...     yield from (np.arange(4), np.arange(4, 6))
    >>> dist = s.experimental_distribute_dataset(gen)  # the function: re-iterable
    >>> [[[x.tolist() for x in s.experimental_local_results(b)] for b in dist] for _ in "ab"]
    [[[[0, 1], [2, 3]], [[4], [5]]], [[[0, 1], [2, 3]], [[4], [5]]]]

    Raises:
        TypeError: ``dataset`` is not iterable or ``options`` not `InputOptions`.
        ValueError: the first element has a scalar leaf (it is not a batch) and
            there are several replicas, or its leaves' batch sizes differ.
        NotImplementedError: ``PER_REPLICA`` replication mode.
    """
    opts = check_input_options(options, "experimental_distribute_dataset")
    if opts.experimental_replication_mode is InputReplicationMode.PER_REPLICA:
        raise NotImplementedError(
            "InputReplicationMode.PER_REPLICA is only supported in "
            "distribute_datasets_from_function; use PER_WORKER (the default) here."
        )
    source = Source(dataset, "dataset")
    placer = Placer(replicas, opts.experimental_fetch_to_device)
    first = source.peek()
    spec, batched = inspect_first(first, "dataset", placer.on_device)
    if not batched and placer.n > 1:
        _raise_unbatched(first, placer.n)
    what = "each batch of dataset"
    return DistributedDataset(
        lambda: split_producer(
            source.open(), placer, what, batched, spec, source.cardinality, buffer_size(opts)
        ),
        spec,
        buffer_size(opts),
        source.cardinality(),
        defer_errors=not placer.multi_process,
    )


def _raise_unbatched(first: Any, n: int) -> None:
    i = scalar_leaf(element_leaves(first, "dataset")[0]) or 0
    raise ValueError(
        "experimental_distribute_dataset splits each element of dataset along its first "
        f"axis over the {n} replicas, but the first element is not a batch: leaf {i} is a "
        f"scalar ({jax.tree.leaves(first)[i]!r}). Batch the dataset first (e.g. "
        "experimental_make_numpy_dataset(x).batch(global_batch_size), or tf.data's "
        ".batch()), or give each replica whole elements with distribute_datasets_from_function."
    )


def distribute_datasets_from_function(
    replicas: Replicas, dataset_fn: Callable, options: InputOptions | None
) -> Any:
    """`Strategy.distribute_datasets_from_function`.

    ``PER_WORKER`` (default): ``dataset_fn`` is called once per worker (JAX
    process) with ``InputContext(num_input_pipelines=workers,
    input_pipeline_id=worker, num_replicas_in_sync=R)``; it should return
    per-replica batches (``ctx.get_per_replica_batch_size(global)``), and each
    local replica takes the next batch. At the end, replicas with no batch left
    get empty arrays. ``PER_REPLICA``: called once per replica, with
    ``num_input_pipelines=R`` and ``input_pipeline_id`` the replica id (under that
    replica's `jax.default_device`); replica r reads its own dataset, and gets
    empty arrays once it is exhausted while others are not. Across workers
    (a multi-worker strategy), a worker whose data ran out gets empty batches
    (its element spec's dtype and trailing shape) while any worker has data,
    and iteration ends on every worker together, as TF does: the workers
    compare their numbers of steps once per epoch, and agree on each step
    only when a number is unknown or they differ (`jaxdist._input.steps`).

    ``dataset_fn`` may return an iterable or a function returning a fresh one
    per epoch (for generators). Nothing is split: each replica gets the
    element as it is. Unbatched elements (scalars, or nests with a scalar leaf)
    are handed out whole, one per replica and step, as TF does; when a step
    cannot be completed at the end of the data (PER_WORKER: fewer elements left
    than local replicas; PER_REPLICA: a replica's dataset is exhausted), that
    step is dropped, as TF's eager iteration does (TF's ``tf.function`` loops and
    ``get_next_as_optional`` instead pad it with zeros).

    >>> import jaxdist as jd
    >>> s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    >>> dist = s.distribute_datasets_from_function(lambda ctx: [5.0, 6.0, 7.0, 8.0, 9.0])
    >>> [[float(x) for x in s.experimental_local_results(e)] for e in dist]
    [[5.0, 6.0], [7.0, 8.0]]
    >>> dist.element_spec, dist.cardinality, len(dist)  # TF's cardinality: the dataset's
    (TensorSpec(shape=(), dtype=float32, name=None), np.int64(5), 2)

    Raises:
        TypeError: ``dataset_fn`` is not callable, or returns something not iterable.
        ValueError: an invalid `InputOptions` combination (as TF).
    """
    check_callable(
        dataset_fn,
        "dataset_fn",
        "a callable taking an InputContext and returning an iterable of batches",
    )
    opts = check_input_options(options, "distribute_datasets_from_function")
    check_dataset_fn_modes(opts)
    fetch = opts.experimental_fetch_to_device or opts.experimental_place_dataset_on_device
    placer = Placer(replicas, fetch)
    if opts.experimental_replication_mode is InputReplicationMode.PER_WORKER:
        return _per_worker(placer, dataset_fn, buffer_size(opts))
    return _per_replica(placer, dataset_fn, buffer_size(opts))


_DSFN = "the dataset returned by dataset_fn"
_DSFN_EACH = f"each element of {_DSFN}"


def _per_worker(placer: Placer, dataset_fn: Callable, ahead: int) -> DistributedDataset:
    workers, worker = (1, 0)
    if placer.multi_process:
        workers, worker = jax.process_count(), jax.process_index()
    source = Source(dataset_fn(InputContext(workers, worker, placer.n)), _DSFN)
    spec, batched = inspect_first(source.peek(), _DSFN, placer.on_device)
    count = step_count([source.cardinality()], batched, shared=len(placer.local))
    local = len(placer.local)

    def steps() -> Iterator:
        it = source.open()
        return produce(
            per_worker_steps(it, local, batched), placer, _DSFN_EACH, batched, spec, ahead
        )

    return DistributedDataset(
        steps,
        spec,
        ahead,
        cardinality=source.cardinality(),
        steps=count,
        defer_errors=not placer.multi_process,
    )


def _per_replica(placer: Placer, dataset_fn: Callable, ahead: int) -> DistributedDataset:
    n = placer.n
    sources = []
    for r in placer.local:
        with jax.default_device(placer.devices[r]):
            dataset = dataset_fn(InputContext(n, r, n))
        sources.append(Source(dataset, _DSFN, placer.devices[r]))
    firsts = [s.peek() for s in sources]
    first = next((f for f in firsts if f is not _EMPTY), _EMPTY)
    spec, batched = inspect_first(first, _DSFN, placer.on_device)
    count = step_count([s.cardinality() for s in sources], batched)

    def steps() -> Iterator:
        its = [s.open() for s in sources]
        return produce(per_replica_steps(its, batched), placer, _DSFN_EACH, batched, spec, ahead)

    return DistributedDataset(
        steps,
        spec,
        ahead,
        count,
        defer_errors=not placer.multi_process,
    )
