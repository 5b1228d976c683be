"""Steps of distributed input, and the workers' agreement on them.

A step is one element per local replica (None: that replica gets 0 rows). The readers
below make the steps of each input kind; the producers place them with a `Placer`.

In a multi-worker run the workers' datasets may end at different steps (each worker
reads its own dataset). TF then keeps a worker whose data ran out in the collectives,
handing it empty batches until every worker is done, and ends the loop on every worker
together (it all-reduces a has-data flag every step). jaxdist does the same, paying for
it only when it must: at the start of each epoch the workers compare their numbers of
steps (one exchange); when every worker knows its number and they are equal, nothing
more is exchanged. Otherwise, every step, the workers exchange their local replicas'
row counts (`NO_DATA` for a worker with no data left): while any worker has data, one
without gets empty batches (0 rows, with the element spec's dtype and trailing shape)
and the step is a partial batch across workers; when none has, the loop ends on every
worker. Unbatched elements (whole elements per replica) end when any worker's do, as
TF's eager iteration drops an incomplete step.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

from jaxdist._input_place import EMPTY as _EMPTY
from jaxdist._input_place import UNKNOWN, Placer, host_leaves

NO_DATA = -1
"""A worker's row count in the per-step exchange when its data has ended."""


# -- readers: one element per local replica and step -------------------------------


def per_worker_steps(it: Iterator, n: int, batched: bool) -> Iterator[list]:
    """PER_WORKER: each of the ``n`` local replicas takes the next element of the one
    dataset; at the end, replicas with no batch left get None (empty batches), and with
    unbatched elements an incomplete last step is dropped (as TF eager)."""
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


def split_steps(it: Iterator, placer: Placer, what: str) -> Iterator[list]:
    """`experimental_distribute_dataset` across workers: the local replicas' rows of each
    global batch, split as TF does (``ceil(b / R)`` rows each, in order)."""
    for batch in it:
        leaves, treedef = host_leaves(batch, what)
        b = int(leaves[0].shape[0])
        per = -(-b // placer.n)
        yield [
            jax.tree.unflatten(
                treedef, [x[min(r * per, b) : min((r + 1) * per, b)] for x in leaves]
            )
            for r in placer.local
        ]


# -- producers -------------------------------------------------------------------


def lengths_agree(placer: Placer, steps: int) -> bool:
    """Whether every worker knows its number of steps and they are all equal (one exchange
    across workers; True at once in one process)."""
    if not placer.multi_process:
        return True
    every = placer.exchange([steps] * len(placer.local))
    return every[0] != UNKNOWN and len(set(every)) == 1


def _rows(element: Any, batched: bool) -> int:
    if element is None:
        return 0
    return int(np.shape(jax.tree.leaves(element)[0])[0]) if batched else 1


def synced(steps: Iterator[list], placer: Placer, what: str, batched: bool, spec: Any) -> Iterator:
    """Placed steps while any worker has data (one exchange of row counts per step)."""
    n, live = len(placer.local), True
    while True:
        elements = next(steps, None) if live else None
        live = elements is not None
        mine = [_rows(e, batched) for e in elements] if elements is not None else [NO_DATA] * n
        every = placer.exchange(mine)
        if all(k == NO_DATA for k in every) or (not batched and NO_DATA in every):
            return
        if elements is None and spec is None:
            raise ValueError(
                "This worker's input is empty while other workers' have data: jaxdist learns "
                "the structure of the empty batches it hands a worker whose data ran out from "
                f"that worker's first element ({what}). Give every worker at least one batch."
            )
        lengths = [max(k, 0) for k in every]
        yield placer.combine(elements or [None] * n, what, batched, lengths, spec)


def produce(
    steps: Iterator[list],
    placer: Placer,
    what: str,
    batched: bool,
    spec: Any,
    count: Callable[[], int],
) -> Iterator:
    """The placed steps of a dataset function's datasets; across workers, kept in step
    (see the module docstring). ``count()``: this worker's number of steps this epoch."""
    if lengths_agree(placer, count()):
        for elements in steps:
            yield placer.combine(elements, what, batched)
    else:
        yield from synced(steps, placer, what, batched, spec)
