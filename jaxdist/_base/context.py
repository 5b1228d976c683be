"""The mode state machine: default, cross-replica, replica and merge modes.

All mode state is one immutable `State` in one `contextvars.ContextVar`, so it is
per thread (and per asyncio task); every change is entered and restored with
try/finally, or swapped whole by `set_strategy`. This module constructs
nothing: the public getters that build the default strategy live above it.

* default: no strategy; `get_replica_context()` is the default strategy's.
* cross-replica: inside ``strategy.scope()`` (or after `experimental_set_strategy`).
* replica: inside the function passed to ``strategy.run``.
* merge: inside the ``merge_fn`` of `ReplicaContext.merge_call` (cross-replica).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import enum
from collections.abc import Iterator
from typing import Any

from jaxdist._base import integrations as _integrations


class Mode(enum.Enum):
    DEFAULT = "default"
    CROSS_REPLICA = "cross-replica"
    REPLICA = "replica"
    MERGE = "merge"


@dataclasses.dataclass(frozen=True)
class State:
    """The whole mode state: which strategy, which mode, the replica's context.

    ``set_base`` is the state `set_strategy` replaced (None unless this state
    was installed by `experimental_set_strategy`). ``scopes`` are the open
    ``strategy.scope()`` entries, innermost last. ``merge_from`` is, in a
    ``merge_fn`` called from a compiled step, the replica context whose
    ``merge_call`` called it (``call_for_each_replica`` runs on its replicas).
    ``function`` is the ``jd.function`` whose trace is running (`function_state`).
    """

    strategy: Any = None
    mode: Mode = Mode.DEFAULT
    replica_context: Any = None
    set_base: State | None = None
    scopes: tuple[ScopeEntry, ...] = ()
    set_hooks: contextlib.ExitStack | None = None  # `experimental_set_strategy`'s integrations
    merge_from: Any = None
    function: Any = None  # the `jd.function` being traced (its state is read afresh)


@dataclasses.dataclass(eq=False)
class ScopeEntry:
    """One entry of a ``strategy.scope()``: the state it replaced, and whether it is closed."""

    before: State
    closed: bool = False
    hooks: contextlib.ExitStack | None = None

    def close_hooks(self) -> None:
        """Exits the integrations' parts of the scope (`_base.integrations`), once."""
        hooks, self.hooks = self.hooks, None
        if hooks is not None:
            hooks.close()


_STATE: contextvars.ContextVar[State] = contextvars.ContextVar("jaxdist_state", default=State())


def current() -> State:
    return _STATE.get()


@contextlib.contextmanager
def enter(state: State) -> Iterator[State]:
    """Makes ``state`` current for the block and always restores the previous one."""
    token = _STATE.set(state)
    try:
        yield state
    finally:
        _STATE.reset(token)


class Scope:
    """``strategy.scope()``: a reusable, re-entrant context manager.

    The same object may be entered several times, one after the other or
    nested in itself (as TF's scope objects can); each exit restores the state
    its entry replaced. Scopes must be exited innermost first (a ``with``
    block always does): exiting an outer scope while an inner one is open
    raises `RuntimeError` and marks the outer one closed, so the state is the
    default again once every scope has been exited.
    """

    def __init__(self, strategy: Any) -> None:
        self._strategy = strategy
        self._entries: list[ScopeEntry] = []

    def __enter__(self) -> Any:
        state = scope_state(self._strategy)
        entry = ScopeEntry(before=current())
        _STATE.set(dataclasses.replace(state, scopes=(*state.scopes, entry)))
        try:  # optional libraries in use (Keras) get the scope too: `_base.integrations`
            entry.hooks = _integrations.enter_scope(self._strategy)
        except BaseException:
            _STATE.set(entry.before)
            raise
        self._entries.append(entry)
        return self._strategy

    def __exit__(self, *exc: Any) -> None:
        if not self._entries:
            raise RuntimeError(
                f"{self._strategy!r}.scope() was exited more times than it was entered."
            )
        entry = self._entries.pop()
        open_ = current().scopes
        if open_ and open_[-1] is entry:
            _STATE.set(_before(entry))
            entry.close_hooks()  # after: the integrations follow the state now current
            return
        if not any(e is entry for e in open_):
            self._entries.append(entry)  # still open where it was entered: exit it there
            raise RuntimeError(
                f"{self._strategy!r}.scope() was exited in a different thread or context "
                "than the one it was entered in (or inside strategy.run); exit it where it "
                "was entered."
            )
        entry.closed = True
        entry.close_hooks()
        raise RuntimeError(
            f"{self._strategy!r}.scope() was exited while a scope entered after it is "
            "still open; exit scopes innermost first (as `with` blocks do). It is now "
            "closed: the state returns to what it was before it once the inner scopes exit."
        )


def _before(entry: ScopeEntry) -> State:
    """The state to restore when ``entry`` exits: skips entries closed out of order."""
    state = entry.before
    while state.scopes and state.scopes[-1].closed:
        state = state.scopes[-1].before
    return state


def _mixing(strategy: Any, other: Any, what: str) -> RuntimeError:
    return RuntimeError(
        f"Mixing different tf.distribute.Strategy objects: {what} of {strategy!r} was called "
        f"inside the scope (or run) of {other!r}. Call it outside that scope, or use "
        "the current strategy (jaxdist.get_strategy())."
    )


def scope_state(strategy: Any) -> State:
    """The state of ``strategy.scope()``, or a clear error when it cannot be entered."""
    state = current()
    if state.mode is Mode.REPLICA:
        raise RuntimeError(
            "strategy.scope() requires cross-replica context, but it was entered inside "
            "strategy.run. Enter the scope outside the step, or use "
            "get_replica_context().merge_call() to run code in cross-replica context."
        )
    if state.strategy is not None and state.strategy is not strategy:
        raise _mixing(strategy, state.strategy, "scope()")
    if state.strategy is strategy:  # re-entering the same scope changes nothing, as in TF
        return dataclasses.replace(state, set_base=None) if state.set_base else state
    return State(strategy=strategy, mode=Mode.CROSS_REPLICA)


def replica_state(strategy: Any, replica_context: Any) -> State:
    check_can_run(strategy)
    return State(strategy=strategy, mode=Mode.REPLICA, replica_context=replica_context)


def check_can_run(strategy: Any) -> None:
    """Raises unless ``strategy.run`` may be called here (not inside run or merge_fn)."""
    state = _STATE.get()
    if state.strategy is not None and state.strategy is not strategy:
        raise _mixing(strategy, state.strategy, "run()")
    if state.mode in (Mode.REPLICA, Mode.MERGE):
        raise RuntimeError(
            f"{strategy!r}.run() was called inside another run() or merge_call. "
            "Call run() from cross-replica code (outside the step function); inside the "
            "step, call the step's inner functions directly."
        )


def merge_state(strategy: Any, merge_from: Any = None) -> State:
    return State(strategy=strategy, mode=Mode.MERGE, merge_from=merge_from)


def replica_again_state(strategy: Any, replica_context: Any) -> State:
    """Replica mode again inside a ``merge_fn`` (``call_for_each_replica`` there)."""
    return State(strategy=strategy, mode=Mode.REPLICA, replica_context=replica_context)


def require_cross_replica(strategy: Any, what: str) -> None:
    """TF's check of cross-replica methods: not inside run, not in another strategy's scope.

    Raises:
        RuntimeError: inside `Strategy.run`, or while another strategy is current.
    """
    state = current()
    if state.mode is Mode.REPLICA:
        raise RuntimeError(
            f"{what} can only be called in cross-replica context (outside strategy.run, "
            "or inside merge_fn of ReplicaContext.merge_call); it was called inside "
            "strategy.run. Return the value from the step and call it afterwards, or use "
            "ReplicaContext.all_reduce / all_gather inside the step."
        )
    if strategy is not None and state.strategy is not None and state.strategy is not strategy:
        raise _mixing(strategy, state.strategy, what)


def set_strategy(strategy: Any) -> None:
    """``experimental_set_strategy``: swaps in ``strategy``'s cross-replica state (None resets).

    A state installed this way remembers the state it replaced, so the next call
    restores by swapping, from whatever thread or context it is made in.

    Raises:
        RuntimeError: inside a ``strategy.scope()`` block or ``strategy.run``.
    """
    state = current()
    base = state.set_base if state.set_base is not None else state
    if base.strategy is not None or base.mode is not Mode.DEFAULT:
        raise RuntimeError(
            "experimental_set_strategy must not be called inside a strategy.scope() "
            "block or strategy.run; leave the block first."
        )
    if strategy is None:
        _STATE.set(base)
    else:
        new = State(strategy=strategy, mode=Mode.CROSS_REPLICA, set_base=base)
        _STATE.set(new)
        try:  # as a scope: the optional integrations (Keras) follow the set strategy
            hooks = _integrations.enter_scope(strategy)
        except BaseException:
            _STATE.set(state)
            raise
        _STATE.set(dataclasses.replace(new, set_hooks=hooks))
    if state.set_hooks is not None:  # the replaced setting's, after the new state is current
        state.set_hooks.close()


def function_state(fn: Any) -> State:
    """The current state, inside the trace of the ``jd.function`` of ``fn``."""
    return dataclasses.replace(_STATE.get(), function=fn)


def in_function() -> bool:
    """Whether a ``jd.function`` is being traced (its state reads are its inputs)."""
    return _STATE.get().function is not None
