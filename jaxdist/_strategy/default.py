"""The default strategy and the public getters of the current strategy and context.

They sit above every strategy class because they construct the default
strategy (one replica on the first local device, ``fn`` called as it is) and its
replica context; the state they read is `jaxdist._base.context`'s.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax

from jaxdist._base import context as _context
from jaxdist._base.context import Mode
from jaxdist._base.devices import Replicas
from jaxdist._base.options import RunOptions
from jaxdist._base.validate import check_callable, check_fn_args, check_optional
from jaxdist._collective.cross_device_ops import ReductionToOneDevice
from jaxdist._collective.replica_context import ReplicaContext, default_replica_context
from jaxdist._strategy.compat import StrategyV1
from jaxdist._strategy.extended import DEFAULT, StrategyExtended
from jaxdist._strategy.strategy import Strategy
from jaxdist._values.trees import ValueContext


class _DefaultStrategy(StrategyV1):
    """The strategy in effect outside any scope: one replica, ``fn`` called as it is."""

    _is_default = True

    def scope(self) -> Any:
        """A no-op scope: the default strategy never becomes "current" (as in TF)."""
        return contextlib.nullcontext(self)

    def run(
        self,
        fn: Callable,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        options: RunOptions | None = None,
    ) -> Any:
        """Calls ``fn(*args, **kwargs)`` as it is, in the default replica context.

        Inside a ``merge_fn`` (cross-replica context) the default replica context is
        entered for the call, as TF's default strategy does.

        >>> import jaxdist as jd
        >>> s = jd.get_strategy()
        >>> s.run(lambda x: x * 2, args=(3,))
        6
        """
        check_fn_args(fn, args, kwargs)
        check_optional(options, RunOptions, "options", "a jaxdist.RunOptions")
        state = _context.current()
        if state.strategy is None and state.mode is Mode.MERGE:
            with _context.enter(_context.State()):
                return fn(*args, **(kwargs or {}))
        return fn(*args, **(kwargs or {}))

    def experimental_distribute_values_from_function(
        self, value_fn: Callable[[ValueContext], Any]
    ) -> Any:
        """Calls ``value_fn(ValueContext())`` once and returns its value as is (one replica,
        as TF's default strategy).

        >>> import jaxdist as jd
        >>> jd.get_strategy().experimental_distribute_values_from_function(
        ...     lambda ctx: ctx.num_replicas_in_sync)
        1
        """
        _context.require_cross_replica(None, "experimental_distribute_values_from_function")
        check_callable(value_fn, "value_fn")
        return value_fn(ValueContext(0, 1))

    def __repr__(self) -> str:
        return "DefaultStrategy()"


@functools.lru_cache(maxsize=1)
def default_strategy() -> Strategy:
    """The default strategy (created on first use: never at import, so JAX does not start)."""
    strategy = object.__new__(_DefaultStrategy)
    replicas = Replicas.of((jax.local_devices()[0],))
    StrategyV1.__init__(
        strategy, StrategyExtended(strategy, replicas, ReductionToOneDevice(), kind=DEFAULT)
    )
    return strategy


def get_strategy() -> Strategy:
    """Returns the current strategy, or the default one outside any scope.

    >>> import jaxdist as jd
    >>> jd.get_strategy().num_replicas_in_sync
    1
    """
    state = _context.current()
    return state.strategy if state.strategy is not None else default_strategy()


def has_strategy() -> bool:
    """Whether a strategy (other than the default one) is current.

    >>> import jaxdist as jd
    >>> jd.has_strategy()
    False
    """
    return _context.current().strategy is not None


def in_cross_replica_context() -> bool:
    """True inside ``strategy.scope()`` or a ``merge_fn``; False in replica/default context.

    >>> import jaxdist as jd
    >>> jd.in_cross_replica_context()
    False
    """
    return _context.current().mode in (Mode.CROSS_REPLICA, Mode.MERGE)


def get_replica_context() -> ReplicaContext | None:
    """The current `ReplicaContext`; None in cross-replica context.

    Outside any scope this is the default strategy's replica context (replica 0
    of 1), as in TF.

    >>> import jaxdist as jd
    >>> ctx = jd.get_replica_context()
    >>> ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync
    (0, 1)
    """
    state = _context.current()
    if state.mode is Mode.REPLICA:
        return state.replica_context
    if state.mode is Mode.DEFAULT:
        return default_replica_context(default_strategy())
    return None


def get_cross_replica_context() -> Strategy | None:
    """The current strategy in cross-replica context, else None.

    In the ``merge_fn`` of the default replica context's ``merge_call`` this is
    the default strategy (as in TF), though `has_strategy` is False there.

    >>> import jaxdist as jd
    >>> jd.get_cross_replica_context() is None
    True
    >>> jd.get_replica_context().merge_call(
    ...     lambda s: jd.get_cross_replica_context() is s is jd.get_strategy())
    True
    """
    if not in_cross_replica_context():
        return None
    strategy = _context.current().strategy
    return strategy if strategy is not None else default_strategy()


def experimental_set_strategy(strategy: Strategy | None) -> None:
    """Makes ``strategy`` current without a ``with`` block (None resets).

    >>> import jaxdist as jd
    >>> s = jd.OneDeviceStrategy("/cpu:0")
    >>> jd.experimental_set_strategy(s)
    >>> jd.get_strategy() is s, jd.in_cross_replica_context()
    (True, True)
    >>> jd.experimental_set_strategy(None)
    >>> jd.has_strategy()
    False

    Raises:
        RuntimeError: inside a ``strategy.scope()`` block or ``strategy.run``.
    """
    if strategy is not None and not isinstance(strategy, Strategy):
        raise TypeError(f"strategy must be a jaxdist Strategy or None; got {strategy!r}.")
    _context.set_strategy(strategy)
