"""Reading user datasets and placing their elements on a strategy's replicas.

A `Source` reads one dataset: an iterable, or a function making a fresh one per
epoch; a one-shot iterator refuses a second epoch rather than yielding nothing.

`Placer.split` splits a global batch as TF does: per-replica size ``ceil(b / R)``,
filled greedily, so a batch of 6 over 4 replicas is ``[2, 2, 2, 0]``. An evenly
divisible batch becomes, per leaf, ONE `jax.device_put` of the host array
reshaped to ``(R, b // R, ...)`` with the strategy's replica sharding (a stacked
`PerReplica`); a partial batch becomes a `PerReplica` of per-device parts.
With several JAX processes each process keeps only its local replicas' rows
(`jax.make_array_from_callback` with the global sharding). `Placer.combine` makes
one step of one element per replica (`distribute_datasets_from_function`):
batches, or whole unbatched elements (scalars), stacked when their shapes agree.
"""

from __future__ import annotations

import contextlib
import itertools
from collections import abc
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from jaxdist._base.devices import Replicas
from jaxdist._cluster.join import exchange
from jaxdist._input.spec import TensorSpec
from jaxdist._values.values import from_padded, from_parts, from_shaped, from_stacked

EMPTY = object()
"""What `Source.peek` returns for an empty dataset."""

INFINITE, UNKNOWN = -1, -2
"""The cardinality of an infinite dataset, and of one whose length is unknown (as TF)."""


# -- sources ---------------------------------------------------------------------


def _is_iterable(dataset: Any) -> bool:
    return callable(getattr(dataset, "as_numpy_iterator", None)) or hasattr(dataset, "__iter__")


def check_dataset(dataset: Any, what: str) -> None:
    """Raises `TypeError` unless ``dataset`` is an iterable of batches (one array is not:
    TF refuses it, and iterating it would take each row for a batch)."""
    if hasattr(type(dataset), "__array__") and hasattr(dataset, "shape"):  # NumPy, JAX, ...
        kind = {np.ndarray: "NumPy array", jax.Array: "jax.Array"}
        name = next((k for t, k in kind.items() if isinstance(dataset, t)), type(dataset).__name__)
        raise TypeError(
            f"{what} must be an iterable of batches, not one array (each of its rows would be "
            f"taken for a batch); got a {name} of shape {tuple(dataset.shape)}. Pass a list "
            "of batches: [x] for one batch, [x[i:i + B] for i in range(0, len(x), B)], "
            "[(x, y)] for features and labels; or jaxdist.NumpyDataset(x).batch(B), or a "
            "tf.data.Dataset."
        )
    if isinstance(dataset, (str, bytes, Mapping)) or not _is_iterable(dataset):
        raise TypeError(
            f"{what} must be an iterable of batches (a list of arrays or of dict/tuple nests "
            "of arrays with a leading batch axis, a generator, a tf.data.Dataset, a grain or "
            "torch loader) or a function returning a fresh one per epoch; "
            f"got {type(dataset).__name__}."
        )


def count(data: Any) -> int:
    """``len(data)``; else its tf.data-style ``cardinality()`` (-1: infinite); else -2."""
    try:
        return int(len(data))
    except TypeError:
        pass
    cardinality = getattr(data, "cardinality", None)
    if callable(cardinality):
        try:
            n = int(cardinality())
        except Exception:  # noqa: BLE001 - anything unusual means "unknown"
            return UNKNOWN
        return n if n >= INFINITE else UNKNOWN
    return UNKNOWN


class Source:
    """One user dataset: fresh iterators of its elements, with a peeked first one.

    ``dataset`` is an iterable, or a function returning a fresh iterable per epoch
    (called once per epoch, as ``tf.data.Dataset.from_generator`` calls its
    generator function). A one-shot iterator (a generator object) can be opened
    once: opening it again raises `RuntimeError` instead of yielding nothing.
    """

    def __init__(self, dataset: Any, what: str, device: Any = None) -> None:
        self.device = device  # the jax.default_device a function source is called under
        self.factory = dataset if callable(dataset) and not _is_iterable(dataset) else None
        if self.factory is None:
            check_dataset(dataset, what)
        self.dataset = dataset
        self.what = what
        self.one_shot = self.factory is None and isinstance(dataset, abc.Iterator)
        self._opened = False
        self._made: Any = None
        self._stash: tuple[Iterator, Any] | None = None

    def _fresh(self) -> Iterator:
        data = self.dataset
        if self.factory is not None:
            with jax.default_device(self.device) if self.device else contextlib.nullcontext():
                data = self.factory()
            if callable(data) and not _is_iterable(data):
                raise TypeError(
                    f"the function given as {self.what} must return an iterable of elements; "
                    f"got another function ({type(data).__name__}). Return the iterable itself."
                )
            check_dataset(data, f"what the function given as {self.what} returned")
            self._made = data
        as_numpy = getattr(data, "as_numpy_iterator", None)
        if callable(as_numpy):
            return iter(as_numpy())
        return iter(data)

    def peek(self) -> Any:
        """The first element (or `EMPTY`); the next `open()` replays it, pulling nothing twice."""
        it = self._fresh()
        try:
            first = next(it)
        except StopIteration:
            first = EMPTY
        self._stash = (it, first)
        return first

    def open(self) -> Iterator:
        """A fresh iterator over the elements (the peeked one first).

        Raises:
            RuntimeError: a one-shot iterator is opened a second time.
        """
        if self._stash is not None:
            it, first = self._stash
            self._stash = None
            self._opened = True
            return it if first is EMPTY else itertools.chain((first,), it)
        if self.one_shot and self._opened:
            raise RuntimeError(
                f"{self.what} is a one-shot iterator ({type(self.dataset).__name__}) that was "
                "already iterated: another epoch over it would yield nothing. Pass (or return "
                "from dataset_fn) a function that makes a fresh iterable instead, e.g. "
                "lambda: make_generator()."
            )
        self._opened = True
        return self._fresh()

    def cardinality(self) -> int:
        """The number of elements: -1 infinite, -2 unknown (for a function: what it returned
        first, when that has a length)."""
        return count(self.dataset if self.factory is None else self._made)


# -- batches ---------------------------------------------------------------------


def _is_host_only(x: Any) -> bool:
    return isinstance(x, np.ndarray) and x.dtype.kind in "OSUV"


def element_leaves(element: Any, what: str) -> tuple[list, Any]:
    """``element``'s leaves as arrays (of any shapes), and its treedef."""
    leaves, treedef = jax.tree.flatten(element)
    if not leaves:
        raise ValueError(f"{what} must hold at least one array; got {element!r}.")
    return [x if isinstance(x, jax.Array) else np.asarray(x) for x in leaves], treedef


def scalar_leaf(leaves: Sequence[Any]) -> int | None:
    """The index of the first scalar (rank-0) leaf: such an element is not a batch."""
    return next((i for i, x in enumerate(leaves) if x.ndim == 0), None)


def host_leaves(batch: Any, what: str) -> tuple[list, Any]:
    """``batch``'s leaves as arrays with a common leading (batch) size, and its treedef."""
    arrays, treedef = element_leaves(batch, what)
    i = scalar_leaf(arrays)
    if i is not None:
        raise ValueError(
            f"{what} must have a leading batch axis on every leaf; leaf {i} is a scalar "
            f"({jax.tree.leaves(batch)[i]!r}). Batch the dataset first (e.g. "
            "experimental_make_numpy_dataset(x).batch(global_batch_size))."
        )
    sizes = [int(x.shape[0]) for x in arrays]
    if len(set(sizes)) != 1:
        raise ValueError(
            f"{what}'s leaves must all have the same leading (batch) size; got sizes {sizes} "
            f"for the leaves of {treedef}."
        )
    return arrays, treedef


def spec_of(leaves: Sequence[Any], treedef: Any, on_device: bool, batched: bool = True) -> Any:
    """The per-replica element spec: `TensorSpec` leaves; for batches the batch dimension is
    None (TF's), unbatched elements keep their whole shape."""

    def one(x: Any) -> TensorSpec:
        dtype = x.dtype
        if on_device and not _is_host_only(x):
            dtype = jax.dtypes.canonicalize_dtype(dtype)
        return TensorSpec((None, *x.shape[1:]) if batched else x.shape, dtype)

    return jax.tree.unflatten(treedef, [one(x) for x in leaves])


class Placer:
    """Places host batches on a strategy's replicas (or keeps them on the host)."""

    def __init__(self, replicas: Replicas, on_device: bool) -> None:
        self.devices: tuple = replicas.devices
        self.replicas = replicas
        self.n = replicas.num
        self.sharding = replicas.sharding
        self.local = list(replicas.local)
        self.local_devices = list(replicas.local_devices)
        self.multi_process = replicas.multi_process
        self.on_device = on_device
        self._fast = on_device and not self.multi_process and self.n > 1

    # experimental_distribute_dataset: split one global batch -----------------------

    def split(self, batch: Any, what: str) -> Any:
        if self._fast and type(batch) is np.ndarray and batch.ndim and batch.dtype.kind in "biufc":
            b = batch.shape[0]
            if b % self.n == 0:  # the hot path: one array, evenly divisible, one device_put
                shaped = batch.reshape((self.n, b // self.n, *batch.shape[1:]))
                return from_stacked(jax.device_put(shaped, self.sharding))
        leaves, treedef = host_leaves(batch, what)
        b = int(leaves[0].shape[0])
        if self.n == 1:
            out = self._put_whole(leaves)
        elif b % self.n == 0:
            out = self._put_even(leaves, b // self.n)
        elif self.on_device and not any(_is_host_only(x) for x in leaves):
            out = self._put_padded(leaves, b)
        else:
            per = -(-b // self.n)
            bounds = [(min(i * per, b), min((i + 1) * per, b)) for i in self.local]
            out = self._put_parts([[x[s:e] for s, e in bounds] for x in leaves])
        return jax.tree.unflatten(treedef, out)

    def _put_padded(self, leaves: list, b: int) -> list:
        """A partial batch: TF's split (``ceil(b / R)`` rows each, in order) as one padded
        array per leaf (one transfer) with each replica's true length as metadata."""
        per = -(-b // self.n)
        lengths = [min(per, max(0, b - i * per)) for i in range(self.n)]
        full = []
        for x in leaves:
            host = np.zeros((self.n * per, *x.shape[1:]), np.asarray(x).dtype)
            host[:b] = np.asarray(x)
            full.append(host)
        stacked = self._put_even(full, per)
        return [from_padded(jax.tree.leaves(v)[0], lengths) for v in stacked]

    def _put_whole(self, leaves: list) -> list:
        if not self.on_device:
            return [np.asarray(x) for x in leaves]
        dev = [i for i, x in enumerate(leaves) if not _is_host_only(x)]
        put = jax.device_put([leaves[i] for i in dev], [self.devices[0]] * len(dev))
        out = list(leaves)
        for i, x in zip(dev, put):
            out[i] = x
        return out

    def _put_even(self, leaves: list, per: int) -> list:
        shaped = [x.reshape((self.n, per, *x.shape[1:])) for x in leaves]
        if not self.on_device:
            hosts = [np.asarray(x) for x in shaped]
            return [self._host_parts([x[i] for i in self.local]) for x in hosts]
        out: list = [None] * len(shaped)
        dev = []
        for i, x in enumerate(shaped):
            if _is_host_only(x):
                out[i] = self._host_parts([x[r] for r in self.local])
            else:
                dev.append(i)
        if self.multi_process:
            for i in dev:
                x = shaped[i]
                arr = jax.make_array_from_callback(x.shape, self.sharding, x.__getitem__)
                out[i] = from_stacked(arr)
        else:
            if len(dev) == 1:
                put = [jax.device_put(shaped[dev[0]], self.sharding)]
            else:
                put = jax.device_put([shaped[i] for i in dev], [self.sharding] * len(dev))
            for i, arr in zip(dev, put):
                out[i] = from_stacked(arr)
        return out

    def _host_parts(self, parts: list) -> Any:
        return from_parts(tuple(np.asarray(p) for p in parts))

    def _put_parts(self, columns: list[list]) -> list:
        """Per-leaf lists of local per-replica arrays as `PerReplica` values of parts."""
        if not self.on_device:
            return [self._host_parts(c) for c in columns]
        if self._fast and not any(_is_host_only(p) for c in columns for p in c):
            # one array padded to the largest shape: a jax.jit argument (parts are not)
            return [from_shaped([np.asarray(p) for p in c], self.replicas) for c in columns]
        flat = [(i, j, p) for i, c in enumerate(columns) for j, p in enumerate(c)]
        dev = [(i, j, p) for i, j, p in flat if not _is_host_only(p)]
        put = jax.device_put([p for _, _, p in dev], [self.local_devices[j] for _, j, _ in dev])
        out = [list(c) for c in columns]
        for (i, j, _), x in zip(dev, put):
            out[i][j] = x
        return [from_parts(tuple(c)) for c in out]

    # distribute_datasets_from_function: one element per local replica -------------

    def _columns(
        self, elements: list, what: str, batched: bool, spec: Any = None
    ) -> tuple[list[list], Any]:
        """Per-leaf lists of the local replicas' leaves (None: exhausted, gets 0 rows shaped
        as the first element, or as ``spec`` when no local replica has one)."""
        leaves_of = host_leaves if batched else element_leaves
        template = next((e for e in elements if e is not None), None)
        if template is None:
            t_leaves, treedef = jax.tree.flatten(spec)
        else:
            t_leaves, treedef = leaves_of(template, what)
        columns: list[list] = [[] for _ in t_leaves]
        for r, element in zip(self.local, elements):
            if element is None:
                leaves = [np.zeros((0, *x.shape[1:]), x.dtype) for x in t_leaves]
            else:
                leaves, t = leaves_of(element, f"{what} (replica {r})")
                if t != treedef:
                    raise ValueError(
                        f"{what} must yield the same structure for every replica; got {treedef} "
                        f"and, for replica {r}, {t}."
                    )
            for c, x in zip(columns, leaves):
                c.append(x)
        return columns, treedef

    def combine(
        self,
        elements: list,
        what: str,
        batched: bool = True,
        lengths: Sequence[int] | None = None,
        spec: Any = None,
    ) -> Any:
        """One element per local replica as one step: batches (None: exhausted, gets empty
        arrays; different batch sizes are padded) or whole unbatched elements.

        ``lengths``: every replica's number of rows, when the workers have exchanged them
        (see `jaxdist._input.steps`); ``spec``: the element spec, for a worker none of whose
        replicas has an element.
        """
        columns, treedef = self._columns(elements, what, batched, spec)
        if self.n == 1:
            return jax.tree.unflatten(treedef, self._put_whole([c[0] for c in columns]))
        placed = [self._place_column(c, batched, lengths) for c in columns]
        return jax.tree.unflatten(treedef, placed)

    def _place_column(self, c: list, batched: bool, lengths: Sequence[int] | None) -> Any:
        if not self.on_device or _is_host_only(c[0]):
            return self._put_parts([c])[0]
        if lengths is None and len({(x.shape, x.dtype) for x in c}) == 1:
            return from_stacked(self._stack(c))
        if batched and len({(x.shape[1:], x.dtype) for x in c}) == 1:  # only batch sizes differ
            lengths = lengths or self.exchange([len(x) for x in c], "the batch sizes of a step")
            size = max(lengths)
            if min(lengths) == size:
                return from_stacked(self._stack(c))
            rows = [
                np.concatenate([x, np.zeros((size - len(x), *x.shape[1:]), x.dtype)]) for x in c
            ]
            return from_padded(self._stack(rows), lengths)
        return self._put_parts([c])[0]

    def exchange(self, local: Sequence[int], purpose: str, steps: int = 1) -> list[int]:
        """``steps`` ints per local replica (step by step) -> every replica's, step by step
        and in replica order: across workers one exchange on the hosts (every worker must
        call it at the same point of its program)."""
        if not self.multi_process:
            return [int(k) for k in local]
        keys = [i * self.n + r for i in range(steps) for r in self.local]
        every = exchange(dict(zip(keys, (int(k) for k in local))), purpose)
        return [every[k] for k in range(steps * self.n)]

    def _stack(self, column: list) -> jax.Array:
        shape = (self.n, *column[0].shape)
        if not self.multi_process and all(isinstance(x, np.ndarray) for x in column):
            return jax.device_put(np.stack(column), self.sharding)
        shards = jax.device_put([x[None] for x in column], self.local_devices)
        return jax.make_array_from_single_device_arrays(shape, self.sharding, shards)
