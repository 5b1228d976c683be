"""Routes to state that were silently stale (the state review): what a callable
object's ``__call__`` or an operator method reads, a tuple or deque that grows, the
fields of a registered dataclass read by ``jax.tree``, a number read by an
``attrgetter`` made outside the step; and routes jaxdist cannot follow, which are a
RuntimeWarning naming the value, never silent.

Each replica's batch sums to 8 / R, so the all-reduced sum is 8 on every strategy.
"""

import collections
import dataclasses
import operator
import threading
import warnings
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ones_batch, run_local, total


class Scale:
    def __init__(self, k):
        self.k = k

    def __call__(self, y):
        return y * self.k


class Vec:
    def __init__(self, k):
        self.k = k

    def __add__(self, y):
        return y + self.k

    def __getitem__(self, i):
        return self.k * i


class Holder:
    pass


def test_a_callable_objects_attributes_are_current(strat):
    t, x = Holder(), ones_batch(strat)
    t.fn = Scale(2.0)
    step = lambda x: t.fn(total(x))  # noqa: E731
    assert run_local(strat, step, x) == 16.0
    t.fn.k = 3.0
    assert run_local(strat, step, x) == 24.0


def test_operator_methods_reached_by_syntax_read_current_values(strat):
    t, x = Holder(), ones_batch(strat)
    t.v = Vec(1.0)
    step = lambda x: (t.v + total(x)) * t.v[2]  # noqa: E731
    assert run_local(strat, step, x) == 9.0 * 2.0
    t.v.k = 2.0
    assert run_local(strat, step, x) == 10.0 * 4.0


class Stack:
    def __init__(self):
        self.ws = (jnp.ones(()),)
        self.queue = collections.deque([jnp.ones(())])

    def step(self, x):
        return total(x) * (sum(self.ws) + sum(self.queue))


def test_a_tuple_that_grows_and_a_deque_appended_to_are_current(strat):
    t, x = Stack(), ones_batch(strat)
    assert run_local(strat, t.step, x) == 16.0
    t.ws = t.ws + (jnp.full((), 2.0),)
    assert run_local(strat, t.step, x) == 8.0 * 4.0
    t.queue.append(jnp.full((), 5.0))
    assert run_local(strat, t.step, x) == 8.0 * 9.0


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Hyper:
    a: float
    b: float


def test_the_fields_of_a_registered_dataclass_read_by_tree_functions_are_current(strat):
    hp, x = Hyper(1.0, 2.0), ones_batch(strat)
    step = lambda x: total(x) * sum(jax.tree.leaves(hp))  # noqa: E731
    assert run_local(strat, step, x) == 24.0
    hp.a = 10.0
    assert run_local(strat, step, x) == 96.0


def test_a_number_read_by_an_attrgetter_made_outside_the_step_is_current(strat):
    t, x = Holder(), ones_batch(strat)
    t.lr = 0.5
    get_lr = operator.attrgetter("lr")
    step = lambda x: total(x) * get_lr(t)  # noqa: E731
    assert run_local(strat, step, x) == 4.0
    t.lr = 0.25
    assert run_local(strat, step, x) == 2.0


def fresh_or_warned(strat, step, x, change, expected, name):
    """The step's result after ``change()`` is ``expected``, or a RuntimeWarning naming
    ``name`` came at the trace (never a silently stale value)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_local(strat, step, x)
        change()
        now = run_local(strat, step, x)
    warned = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert now == expected or any(name in str(w.message) for w in warned), (now, warned)


@pytest.mark.unchecked  # a route jaxdist names with a warning: the check mode raises
def test_state_behind_a_weakref_proxy_is_current_or_named(strat):
    t, x, target = Holder(), ones_batch(strat), Holder()
    target.w, target.lr = jnp.full((), 2.0), 1.0
    t.p = weakref.proxy(target)
    step = lambda x: total(x) * t.p.w * t.p.lr  # noqa: E731

    def change():
        target.w, target.lr = jnp.full((), 3.0), 2.0

    fresh_or_warned(strat, step, x, change, 48.0, "t.p")


@pytest.mark.unchecked  # a route jaxdist names with a warning: the check mode raises
def test_an_array_on_a_thread_local_is_current_or_named(strat):
    t, x = Holder(), ones_batch(strat)
    t.local = threading.local()
    t.local.w = jnp.full((), 2.0)
    step = lambda x: total(x) * t.local.w  # noqa: E731

    def change():
        t.local.w = jnp.full((), 3.0)

    fresh_or_warned(strat, step, x, change, 24.0, "t.local")


def test_a_row_of_a_fortran_ordered_array_changed_in_place_is_current_or_named(strat):
    t, x = Holder(), ones_batch(strat)
    t.table = np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    step = lambda x: total(x) * jnp.sum(t.table[1])  # noqa: E731

    def change():
        t.table[1] = 1.0

    fresh_or_warned(strat, step, x, change, 24.0, "t.table")


def test_a_row_of_a_strided_view_of_a_view_changed_in_place_is_current_or_named(strat):
    t, x = Holder(), ones_batch(strat)
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    t.view = base[::2][:, ::2]  # a view of a view, not contiguous
    step = lambda x: total(x) * jnp.sum(t.view[1])  # noqa: E731

    def change():
        t.view[1] = 1.0

    fresh_or_warned(strat, step, x, change, 24.0, "t.view")
