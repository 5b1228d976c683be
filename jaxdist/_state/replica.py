"""TF's variables in a replica step: distributed state read per replica, assignments as updates.

A TF replica step (the function given to ``strategy.run``) reads its variables where they
are (``self.w``, a Keras model's weights) and updates them there (``optimizer.apply_gradients``,
``metric.update_state``). A mirrored variable is one value that every replica reads; a
per-replica (sync-on-read) one holds each replica's own. jaxdist gives state the same meaning,
with no variable type of its own:

* a distributed value (`PerReplica`, `Mirrored`) held in the step's state (``self.state =
  strategy.run(...)``, a value made by ``experimental_distribute_values_from_function``) is read
  per replica: each replica's trace finds its own component at that place (`places` finds them;
  the trace puts a row of the stacked array there, as it puts tracers at other places);
* what the step assigns there (``self.w = self.w - lr * g``) is written back after the call as
  a distributed value: one array the host reads where it is the same on every replica (computed
  from replicated state and all-reduced values: `jaxdist._state.varying` reads that off the step's
  jaxpr, as JAX's ``check_vma`` types it), a `PerReplica` where it differs (each replica then
  reads its own on the next call, and the host reduces it), never one replica's value chosen.

`Replica` is the record of a traced replica step this needs: its axis, which inputs are
mapped, how an output becomes the value written back.

>>> import jax.numpy as jnp, jaxdist as jd
>>> strategy = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
>>> class Counter:
...     def __init__(self):
...         self.seen = jnp.zeros(())
...     def step(self, x):
...         self.seen = self.seen + x           # each replica its own: a PerReplica
...         return x
>>> c = Counter()
>>> x = strategy.experimental_distribute_values_from_function(
...     lambda ctx: jnp.float32(ctx.replica_id_in_sync_group + 1))
>>> _ = strategy.run(c.step, args=(x,))
>>> [float(v) for v in c.seen.values], float(strategy.reduce("SUM", c.seen, axis=None))
([1.0, 2.0], 3.0)
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxdist._base.validate import describe
from jaxdist._state import aggregation as _aggregation
from jaxdist._state import assign as _assign
from jaxdist._state import capture as _capture
from jaxdist._state import chains as _chains
from jaxdist._state import peek as _peek
from jaxdist._state import promote as _promote
from jaxdist._state import varying as _varying
from jaxdist._state.chains import Chain
from jaxdist._values.layout import num_components, parts, stacked
from jaxdist._values.trees import combine_parts
from jaxdist._values.values import DistributedValues, is_distributed


@dataclasses.dataclass(frozen=True)
class Replica:
    """A body traced as one replica's step (`jaxdist._state.stage.Staged`'s ``replica``).

    Attributes:
        axis: the replica axis the body's collectives name.
        num: how many replicas there are.
        mapped: for each argument of the body, whether it is one replica's row.
        written: ``written(output, varies, rule)``: the value to write back for an output
            of an assignment (``varies``: it can differ across replicas; ``rule``: its
            place's, `rule`).
    """

    axis: str
    num: int
    mapped: tuple[bool, ...]
    written: Callable[[Any, bool, str | None], Any]


class NotStacked:
    """What a place holds when it no longer holds a distributed value of stacked rows."""

    shape: tuple = ()
    dtype: Any = None


NOT_STACKED = NotStacked()


def _readable(value: Any, num: int) -> bool:
    """Whether ``value`` is a distributed value a replica step can read its row of."""
    if num_components(value) != num or parts(value) is not None:
        return False
    data = stacked(value)
    return isinstance(data, jax.Array) and data.shape[:1] == (num,)


_EXPLICIT = "_jaxdist_explicit_state"


def explicit_state(fn: Callable) -> Callable:
    """Marks ``fn`` (a function, or a method's function) as a replica step that takes all of
    its state as arguments and returns it (jaxdist's own Keras steps): its objects hold no
    variable it reads or assigns, so none is looked for (`places`, `is_explicit`). Walking
    the objects such a step reaches (a Keras model, its optimizer, the strategy) would cost
    seconds at every trace and find nothing."""
    setattr(fn, _EXPLICIT, True)
    return fn


def is_explicit(fn: Callable) -> bool:
    """Whether ``fn`` is a step marked by `explicit_state` (a bound method: its function)."""
    inner = fn.__func__ if type(fn) is types.MethodType else fn
    return type(inner) is types.FunctionType and inner.__dict__.get(_EXPLICIT, False) is True


def places(fn: Callable, num: int) -> list[tuple[Chain, Any]]:
    """The distributed values of ``num`` components in ``fn``'s state, at places whose
    names its code uses: ``[(chain, value)]`` (a value inside another is not listed; none
    for a step that takes its state as arguments, `explicit_state`)."""
    if is_explicit(fn):
        return []
    named: set[str] = set()
    found: list[tuple[Chain, Any]] = []
    for chain, value in _capture.walk(fn, named):
        if any(chain[: len(c)] == c for c, _ in found):
            continue
        if _peek.is_a(value, jax.Array) and not _peek.is_a(value, DistributedValues):
            value = _aggregation.on_read_rows(fn, chain, value, num)  # (an on-read variable)
        if not _peek.is_a(value, DistributedValues):
            continue
        if _readable(value, num) and _capture.is_named(chain, named):
            if not _assign.can_replace(fn, chain):  # (read whole: named as before)
                continue
            found.append((chain, value))
    return found


def row_spec(value: Any) -> jax.ShapeDtypeStruct:
    """One replica's row of a distributed value's stacked array, abstractly."""
    data = stacked(value)
    return jax.ShapeDtypeStruct(data.shape[1:], data.dtype)


def stacked_of(value: Any, num: int, fn: Any = None, chain: Chain = ()) -> Any:
    """The stacked array a place's distributed value is read from on a call (`NOT_STACKED`
    when the place holds something else now: the trace does not fit). A plain array at a
    sync-on-read variable's place (``fn``'s ``chain``) is read as `on_read_rows` gives it."""
    if fn is not None and _peek.is_a(value, jax.Array) and not is_distributed(value):
        value = _aggregation.on_read_rows(fn, chain, value, num)
    if is_distributed(value) and _readable(value, num):
        return stacked(value)
    return NOT_STACKED


def varies(replica: Replica, jaxpr: Any, swapped: list[bool], n_numbers: int) -> list[bool]:
    """For each output of a replica step's ``jaxpr`` (its inputs: the body's arguments, the
    swapped state, the numbers), whether it can differ across replicas."""
    inputs = [*replica.mapped, *swapped, *[False] * n_numbers]
    return _varying.varying(jaxpr, inputs, replica.axis)


def with_state(fn: Callable, body: Callable, chains: list[Chain], info: dict) -> Callable:
    """``body`` (a replica step traced inside a caller's trace) reading the rows given after
    its arguments at ``chains`` (distributed values of ``fn``'s state), and returning, after
    its outputs, what it assigned in ``fn``'s state (``info["assigned"]``: the records of
    `jaxdist._state.assign.take_assigned`); the state is put back as it was. A step that
    takes its state as arguments (`explicit_state`) is ``body`` itself: it assigns nothing."""
    if is_explicit(fn):
        info["assigned"], info["n_assigned"] = [], 0
        return body

    def stateful(*arrays: Any) -> list:
        k = len(arrays) - len(chains)
        with _assign.Swapped(fn, chains, list(arrays[k:])):
            before = _assign.snapshot(fn)
            skip = _assign.number_places(before, _promote.swapped())
            try:
                outs = list(body(*arrays[:k]))
            except BaseException:
                with contextlib.suppress(RuntimeError):  # (the step's own error is the one)
                    _assign.take_assigned(fn, before, skip, _nothing)
                raise
            info["assigned"], extra = _assign.take_assigned(fn, before, skip, _nothing)
        info["n_assigned"] = len(extra)
        return outs + extra

    return stateful


def _nothing(fn: Callable, places: list) -> None:
    del fn, places


def write_traced(
    fn: Callable,
    info: dict,
    outs: list,
    varies: Callable[[], list | None],
    row: Callable,
    tail: int,
) -> None:
    """Writes back, in the caller's trace, what a replica step traced there assigned
    (`with_state`): ``row(output, varies, rule)`` of each assigned output, which come before the
    last ``tail`` outputs; ``varies()`` tells which outputs can differ across replicas (None:
    all may)."""
    end = len(outs) - tail
    start = end - info["n_assigned"]
    flags, how = varies(), _aggregation.rules(fn, info["assigned"])
    it = iter(
        row(x, True if flags is None else flags[start + j], how[j])
        for j, x in enumerate(outs[start:end])
    )
    for chain, treedef, leaves in info["assigned"]:
        value = treedef.unflatten([next(it) if x is None else x for x in leaves])
        _assign.replace(fn, chain, value)


def assigned_under_jit(fn: Callable, chain: Chain) -> RuntimeError:
    """The error for a replica step that assigned its state at ``chain`` inside a trace
    that cannot write it back (a user's ``jax.jit``, a ``lax`` loop): the state is as it
    was."""
    where = _chains.describe(fn, chain)
    return RuntimeError(
        f"The replica step {describe(fn)} assigned {where} while strategy.run was traced by "
        "a JAX transformation (jax.jit, a lax loop) that cannot write state back after the "
        "call. Decorate the function that calls strategy.run with @jd.function (TF's "
        "tf.function) instead of jax.jit, or call strategy.run eagerly: both write back "
        "what the replica step assigns. Or return the new value from the step and assign "
        f"it after strategy.run ({where} = ...)."
    )


# -- partial batches: each replica traced with its own rows --------------------------------------


class StateRows:
    """The distributed values of a step's state at ``chains``, given to a partial-batch step
    as its first argument (`jaxdist._partial.ragged` splits them per replica, as it splits
    the batch): a replica's trace finds its own rows at those places (`swapped`)."""

    def __init__(self, chains: tuple, values: tuple) -> None:
        self.chains, self.values = chains, values


jax.tree_util.register_pytree_node(
    StateRows, lambda s: (s.values, s.chains), lambda chains, values: StateRows(chains, values)
)


def with_rows(fn: Callable, num: int, args: tuple) -> tuple:
    """``args`` of a partial-batch step, led by the `StateRows` of ``fn``'s distributed
    state when it has any."""
    found = places(fn, num)
    if not found:
        return args
    return (StateRows(tuple(c for c, _ in found), tuple(v for _, v in found)), *args)


def swapped(fn: Callable, args: tuple) -> tuple[Any, tuple]:
    """A context putting a replica's `StateRows` (``args[0]``, if it is one) at their places
    while the step runs, and the step's own arguments."""
    if args and _peek.is_a(args[0], StateRows):
        rows = args[0]
        return _assign.Swapped(fn, list(rows.chains), list(rows.values)), args[1:]
    return _assign.Swapped(fn, [], []), args


def combined(fn: Callable, records: list, columns: list, varies: list) -> list:
    """What a partial-batch step assigned, as its places keep it: ``[(chain, value)]`` from
    the ``records`` (`jaxdist._state.assign.take_assigned`'s), each computed leaf's values
    per replica (``columns``) and whether it can differ across replicas (``varies``)."""
    how = _aggregation.rules(fn, records)
    it = iter(_kept_column(c, v, r) for c, v, r in zip(columns, varies, how))
    return [
        (chain, treedef.unflatten([next(it) if x is None else x for x in leaves]))
        for chain, treedef, leaves in records
    ]


def _kept_column(column: list, varies: bool, how: str | None) -> Any:
    same = len({(jnp.shape(x), jnp.result_type(x)) for x in column}) == 1
    if not same:  # (shapes per replica: each its own value)
        return combine_parts(column, None)
    kept_value = _aggregation.kept(jnp.stack(column), varies, how, lambda a: a[0])
    if kept_value is not None:
        return kept_value
    return combine_parts(column, None) if varies else column[0]
