"""Steps of distributed input, and the workers' agreement on them.

A step is one element per local replica (None: that replica gets 0 rows). The readers
below make the steps of each input kind; `produce` places them with a `Placer`.

In a multi-worker run the workers' datasets may end at different steps (each worker
reads its own dataset). TF then keeps a worker whose data ran out in the collectives,
handing it empty batches until every worker is done, and ends the loop on every worker
together (it all-reduces a has-data flag every step). jaxdist does the same, paying for
it only when it must: at the start of each epoch the workers compare their numbers of
steps (one exchange); when every worker knows its number and they are equal, nothing
more is exchanged. Otherwise (`synced`) the workers exchange their local replicas' row
counts (`NO_DATA` past the end of a worker's data) for the next 1, 2, 4, then
`MAX_CHUNK` steps at a time, each worker reading that many of its own elements ahead on
the host: while any worker has data, one without gets empty batches (0 rows, with the
element spec's dtype and trailing shape) and the step is a partial batch across
workers; when none has, the loop ends on every worker. Unbatched elements (whole
elements per replica) end when any worker's do, as TF's eager iteration drops an
incomplete step. The exchanges run on the hosts (`jaxdist._cluster.join.exchange`), so
they never wait for the steps in flight on the devices.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np

from jaxdist._input.place import EMPTY as _EMPTY
from jaxdist._input.place import UNKNOWN, Placer, host_leaves

NO_DATA = -1
"""A worker's row count in the per-step exchange when its data has ended."""


# -- readers: one element per local replica and step -------------------------------


def per_worker_steps(it: Iterator, n: int, batched: bool) -> Iterator[list]:
    """PER_WORKER: each of the ``n`` local replicas takes the next element of the one
    dataset; at the end, replicas with no batch left get None (empty batches), and with
    unbatched elements an incomplete last step is dropped (as TF eager).

    >>> import numpy as np
    >>> batches = [np.zeros((2, 1)), np.ones((2, 1)), np.ones((1, 1))]
    >>> steps = per_worker_steps(iter(batches), 2, True)
    >>> [[None if e is None else e.shape for e in step] for step in steps]
    [[(2, 1), (2, 1)], [(1, 1), None]]
    >>> list(per_worker_steps(iter([5.0, 6.0, 7.0]), 2, False))  # unbatched: the 7 is dropped
    [[5.0, 6.0]]
    """
    while True:
        elements = list(itertools.islice(it, n))
        if not elements or (len(elements) < n and not batched):
            return
        yield elements + [None] * (n - len(elements))


def per_replica_steps(its: Sequence[Iterator], batched: bool) -> Iterator[list]:
    """PER_REPLICA: replica r takes the next element of its own dataset; an exhausted
    replica gets None while others have data; unbatched data ends when any replica's does."""
    live = [True] * len(its)
    while True:
        elements = []
        for k, it in enumerate(its):
            e = next(it, _EMPTY) if live[k] else _EMPTY
            live[k] = e is not _EMPTY
            elements.append(e if live[k] else None)
        if not any(live) or (not batched and not all(live)):
            return
        yield elements


class SplitSteps:
    """`experimental_distribute_dataset` across workers kept in step: a global batch's
    row counts per local replica (TF's split, ``ceil(b / R)`` rows each, in order), and
    its placement (the usual `Placer.split` when every worker has the same batch size)."""

    def __init__(self, placer: Placer, what: str, spec: Any, ahead: int = 1) -> None:
        self.placer, self.what, self.spec, self.ahead = placer, what, spec, ahead

    def _split(self, b: int) -> list[int]:
        per = -(-b // self.placer.n)
        return [min(per, max(0, b - r * per)) for r in range(self.placer.n)]

    def rows(self, batch: Any) -> list[int]:
        every = self._split(int(host_leaves(batch, self.what)[0][0].shape[0]))
        return [every[r] for r in self.placer.local]

    def place(self, batch: Any, lengths: list[int]) -> Any:
        local = len(self.placer.local)
        if batch is None:
            return self.placer.combine([None] * local, self.what, True, lengths, self.spec)
        leaves, treedef = host_leaves(batch, self.what)
        b = int(leaves[0].shape[0])
        if lengths == self._split(b):  # every worker has this batch size: the usual split
            return self.placer.split(batch, self.what)
        per = -(-b // self.placer.n)
        parts = [
            jax.tree.unflatten(
                treedef, [x[min(r * per, b) : min((r + 1) * per, b)] for x in leaves]
            )
            for r in self.placer.local
        ]
        return self.placer.combine(parts, self.what, True, lengths, self.spec)


class CombinedSteps:
    """`distribute_datasets_from_function` across workers kept in step: one element per
    local replica and step (None: 0 rows)."""

    def __init__(self, placer: Placer, what: str, batched: bool, spec: Any, ahead: int = 1) -> None:
        self.placer, self.what, self.batched, self.spec = placer, what, batched, spec
        self.ahead = ahead

    def rows(self, elements: list) -> list[int]:
        return [_rows(e, self.batched) for e in elements]

    def place(self, elements: list | None, lengths: list[int]) -> Any:
        elements = elements or [None] * len(self.placer.local)
        return self.placer.combine(elements, self.what, self.batched, lengths, self.spec)


# -- producers -------------------------------------------------------------------


MAX_CHUNK = 8
"""The most steps the workers agree on in one exchange (each worker reads that many of its
own elements ahead, on the host, before placing them)."""


def lengths_agree(placer: Placer, steps: int) -> bool:
    """Whether every worker knows its number of steps and they are all equal (one exchange
    across workers; True at once in one process)."""
    if not placer.multi_process:
        return True
    every = placer.exchange([steps] * len(placer.local), "the number of steps of an epoch")
    return every[0] != UNKNOWN and len(set(every)) == 1


def _rows(element: Any, batched: bool) -> int:
    if element is None:
        return 0
    return int(np.shape(jax.tree.leaves(element)[0])[0]) if batched else 1


def _read(items: Iterator, count: int) -> list:
    """Up to ``count`` items (fewer at the end)."""
    return list(itertools.islice(items, count))


def synced(items: Iterator, steps: Any, batched: bool) -> Iterator:
    """Placed steps while any worker has data. The workers exchange their local replicas'
    row counts for 1, 2, 4, ... up to `MAX_CHUNK` steps at a time (`NO_DATA` past the end
    of a worker's data), so a long epoch costs one exchange per `MAX_CHUNK` steps; with a
    buffer size of 0 (``steps.ahead``: read nothing ahead), one step at a time."""
    placer, n, chunk, live = steps.placer, len(steps.placer.local), 1, True
    most = MAX_CHUNK if steps.ahead else 1
    while True:
        got = _read(items, chunk) if live else []
        live = len(got) == chunk
        mine = [k for item in got for k in steps.rows(item)] + [NO_DATA] * n * (chunk - len(got))
        every = placer.exchange(mine, "the row counts of the next steps", chunk)
        for i in range(chunk):
            lengths = every[i * placer.n : (i + 1) * placer.n]
            if all(k == NO_DATA for k in lengths) or (not batched and NO_DATA in lengths):
                return
            if i >= len(got) and steps.spec is None:
                raise ValueError(
                    "This worker's input is empty while other workers' have data: jaxdist "
                    "learns the structure of the empty batches it hands a worker whose data ran "
                    f"out from that worker's first element ({steps.what}). Give every worker at "
                    "least one batch."
                )
            yield steps.place(got[i] if i < len(got) else None, [max(k, 0) for k in lengths])
        chunk = min(2 * chunk, most)


def produce(
    elements: Iterator[list], placer: Placer, what: str, batched: bool, spec: Any, ahead: int
) -> Iterator:
    """The placed steps of a dataset function's datasets. Across workers they are always
    kept in step (`synced`): the workers' batch sizes may differ at any step, even when
    their numbers of steps agree, and every worker must place a step the same way."""
    if not placer.multi_process:
        for step in elements:
            yield placer.combine(step, what, batched)
    else:
        yield from synced(elements, CombinedSteps(placer, what, batched, spec, ahead), batched)
