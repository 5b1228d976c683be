"""Distributed iterators read inside a ``jd.function``: elements fed to its program.

TF's ``tf.function`` reads ``next(iterator)`` as a graph op, a new element on every
call (``train_step(iterator)``, orbit's and Keras' loops). A JAX trace runs Python
once, so a batch read while tracing would be a constant of the program. Inside a
``jd.function`` trace, ``next`` of a distributed iterator goes through the active
`Feed` instead: it names where the iterator is (an argument, or a place in the
function's state), counts the reads, and returns the element the call fetched for
that read on the host; the function makes those elements inputs of its program, and
fetches them again, in the same order, before every later call.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Hashable, Iterator
from typing import Any


class Feed:
    """The reads of distributed iterators in one trace of a ``jd.function``.

    Args:
        where: the place of an iterator (a hashable source), raising if it has none.
        take: ``take(source, k, read)``: the ``k``-th element of that source for the
            call being traced (``read()`` reads the iterator itself).

    >>> fetched = {}
    >>> feed = Feed(lambda it: "arg 0", lambda s, k, read: fetched.setdefault((s, k), read()))
    >>> it = iter([10, 20, 30])
    >>> with feeding(feed):
    ...     first = [active().next(it, lambda: next(it)) for _ in range(2)]
    >>> first, [(s, k) for s, k, _ in feed.used]
    ([10, 20], [('arg 0', 0), ('arg 0', 1)])
    >>> feed.restart(); feed.next(it, lambda: next(it))   # a new trace: the same element
    10
    """

    def __init__(
        self, where: Callable[[Any], Hashable], take: Callable[[Hashable, int, Callable], Any]
    ) -> None:
        self._where, self._take = where, take
        self._counts: dict[Hashable, int] = {}
        self.used: list[tuple[Hashable, int, Any]] = []

    def restart(self) -> None:
        """A new trace of the function begins: its reads count from the first again."""
        self._counts.clear()
        self.used.clear()

    def next(self, iterator: Any, read: Callable[[], Any]) -> Any:
        """The element ``next(iterator)`` gives in this call."""
        source = self._where(iterator)
        k = self._counts.get(source, 0)
        self._counts[source] = k + 1
        element = self._take(source, k, read)
        self.used.append((source, k, element))
        return element


# Its own ContextVar, not a field of the mode state (`jaxdist._base.context.State`): a scope the
# function enters (TF1's ``experimental_run`` reads the iterator inside one) builds a fresh
# mode state, and the feed must reach through it.
_ACTIVE: contextvars.ContextVar[Feed | None] = contextvars.ContextVar("jaxdist_feed", default=None)


def active() -> Feed | None:
    """The feed of the ``jd.function`` being traced, if any."""
    return _ACTIVE.get()


@contextlib.contextmanager
def feeding(feed: Feed) -> Iterator[Feed]:
    """Within the block, distributed iterators read through ``feed``."""
    token = _ACTIVE.set(feed)
    try:
        yield feed
    finally:
        _ACTIVE.reset(token)
