"""What one object of a step's state reaches (`jaxdist._state.reach.children`): the links
the walk follows from it, by its kind, decided per type and the same on a type's later
values, and read without running the object's code."""

import collections
import functools
import types
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdist as jd
from jaxdist._state import reach


def _kinds(obj):
    return [link[0] for link, _ in reach.children(obj)]


class _Slots:
    __slots__ = ("a", "b")

    def __init__(self):
        self.a = 1.0


class _Plain:
    scale = 2.0  # class data, read as the instance's

    def __init__(self):
        self.w = jnp.ones(())


class _Nosy:
    def __init__(self):
        self.w = 1.0

    def __getattr__(self, name):
        raise RuntimeError("user code")

    def __getattribute__(self, name):
        if name not in ("__dict__", "__class__"):
            raise RuntimeError("user code")
        return object.__getattribute__(self, name)


def _fn(x, k=3.0):
    return x * k * np.pi


class _Tagged(dict):
    pass


def _cases():
    obj = _Plain()
    return [
        ("method", obj.__init__, ["self", "func"]),
        ("partial", functools.partial(_fn, 1.0, k=2.0), ["pfunc", "parg", "pkw"]),
        ("function", _fn, ["global", "default"]),  # (``np``, a module global)
        ("list", [1, 2], ["item", "item"]),
        ("tuple", (1,), ["item"]),
        ("deque", collections.deque([1]), ["item"]),
        ("dict", {"a": 1}, ["item"]),
        ("dict subclass", _Tagged(a=1), ["item"]),
        ("mapping proxy", types.MappingProxyType({"a": 1}), ["item"]),
        ("weak reference", weakref.ref(obj), ["deref"]),
        ("object array", np.array([obj, None], dtype=object), ["flat", "flat"]),
        ("number array", np.zeros(2), []),
        ("object", obj, ["attr", "getattr"]),
        ("slots", _Slots(), ["getattr"]),
        ("no user code", _Nosy(), ["attr"]),
    ]


@pytest.mark.parametrize(("name", "obj", "kinds"), _cases(), ids=[c[0] for c in _cases()])
def test_each_kind_of_object_is_opened_by_its_links(name, obj, kinds):
    for _ in range(2):  # the type's answer, remembered, is the same
        got = _kinds(obj)
        assert [k for k in got if k != "meth"] == kinds, (name, got)


def test_a_class_is_opened_as_its_data():
    assert _kinds(_Plain) == ["getattr"]


def test_a_distributed_value_is_its_local_value_or_its_stacked_array():
    strategy = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    value = strategy.experimental_distribute_values_from_function(lambda ctx: jnp.ones(()))
    kinds = set(_kinds(value))
    assert "stacked" in kinds


def test_a_tracer_is_opened_as_an_object_its_type_decides():
    """Not as an array's elements or a container's items (JAX's instance check makes it a
    `jax.Array`, not a list or a NumPy array); the walk does not look into it at all."""
    seen = []

    @jax.jit
    def f(x):
        for _ in range(2):
            seen.append(set(_kinds(x)))
        return x

    f(jnp.ones(2))
    assert len(seen) == 2 and seen[0] == seen[1] and seen[0] <= {"attr", "getattr"}
