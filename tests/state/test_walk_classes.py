"""The state walk's per-class reads (`jaxdist._state.capture`): what it keeps of a class
(its data attributes, its method links) follows the class when the class changes."""

import argparse

import jax.numpy as jnp

from jaxdist._state import capture


def _class_reads(fn):
    return {c[-1][1] for c, _ in capture.walk(fn, set()) if c[-1][0] == "getattr"}


def test_a_class_attribute_added_or_retyped_after_a_walk_is_found():
    class T:
        w = jnp.zeros(())

        def helper(self):
            return 0.0

        def step(self, x):
            return x * self.w

    t = T()
    assert _class_reads(t.step) == {"w"}
    T.b = jnp.ones(())  # a new name
    assert _class_reads(t.step) == {"w", "b"}
    T.helper = jnp.ones(())  # the same names, a method now data
    assert _class_reads(t.step) == {"w", "b", "helper"}
    T.w = lambda self: 0.0  # data now a method
    assert _class_reads(t.step) == {"b", "helper"}
    t.b = 1.0  # the instance's own shadows the class's
    assert _class_reads(t.step) == {"helper"}


def test_a_users_subclass_of_a_library_class_keeps_its_method_links():
    class Users(argparse.Namespace):  # one of the program's classes over a library's
        def scaled(self, x):
            return x * self.lr

        def step(self, x):
            return self.scaled(x)

    t = Users(lr=0.1, options=argparse.Namespace(beta=0.9))  # (a library's object inside)
    chains = [c for c, _ in capture.walk(t.step, set())]
    assert (("self", None), ("meth", ("scaled", 0))) in chains
    # the program's methods, on the program's object only (none under the library's)
    assert {c for c in chains if c[-1][0] == "meth"} == {
        (("self", None), ("meth", ("scaled", 0))),
        (("self", None), ("meth", ("step", 0))),
    }
