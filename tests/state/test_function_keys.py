"""What makes two step functions the same step (`jaxdist._state.keys.function_key`): a
capture's key by its type (a number, an array), by its identity (an object) or by what it
holds (a tuple, dict, set, dataclass, function), the same on a type's first value as on
its later ones (the per-type answer is remembered)."""

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdist._state import keys


def _closing(value):
    def step(x):
        return x, value

    return step


class _Obj:
    pass


@dataclasses.dataclass
class _Cfg:
    lr: float


class _IntLike(int):
    pass


@dataclasses.dataclass(init=False, eq=False)
class _Num(float):
    pass


@pytest.mark.parametrize("rounds", [1, 2, 3])
@pytest.mark.parametrize(
    ("make", "same"),
    [
        (lambda k: 0.1 * k, True),  # a Python number: by type
        (lambda k: np.float32(k), True),
        (lambda k: jnp.full((2,), k), True),  # an array: by type
        (lambda k: np.full((2,), k), True),
        (lambda k: _IntLike(k), True),
        (lambda k: _Obj(), False),  # an object: by identity
        (lambda k: {"lr": 0.1 * k}, True),  # a small dict of numbers: by structure
        (lambda k: {"lr": _Obj()}, False),
        (lambda k: (0.1 * k, 2), True),
        (lambda k: (_Obj(),), False),
        (lambda k: _Cfg(0.1 * k), True),  # a dataclass of numbers: by its fields
        (lambda k: _Cfg(_Obj()), False),
        (lambda k: {1.0 * k, 2.0}, True),  # a small set of numbers: by type
        (lambda k: frozenset({_Obj()}), False),
        (lambda k: types.SimpleNamespace(lr=k), False),
    ],
)
def test_a_captures_key_is_the_same_on_every_value_of_its_type(make, same, rounds):
    """The answer for a type, asked again (remembered per type), is the answer computed."""
    for _ in range(rounds):
        a, b = make(1), make(2)
        assert (keys.captured_ids(_closing(a)) == keys.captured_ids(_closing(b))) is same
        # the same value: always the same step
        assert keys.captured_ids(_closing(a)) == keys.captured_ids(_closing(a))


@pytest.mark.parametrize(
    ("value", "other"),
    [
        (1.5, 2.5),
        (np.float32(2), np.float32(3)),
        (jnp.ones(2), jnp.zeros(2)),
        (_IntLike(3), _IntLike(4)),
        ("s", "t"),
        (None, None),
    ],
)
def test_strict_keys_numbers_and_arrays_by_identity(value, other):
    for _ in range(2):
        assert keys.captured_ids(_closing(value), strict=True) == keys.captured_ids(
            _closing(value), strict=True
        )
        if other is not value:
            assert keys.captured_ids(_closing(value), strict=True) != keys.captured_ids(
                _closing(other), strict=True
            )
        assert keys.captured_ids(_closing(value)) == keys.captured_ids(_closing(other))


def test_a_dataclass_number_subclass_is_keyed_by_type():
    a, b = _Num(1.0), _Num(2.0)
    for _ in range(2):
        assert keys.captured_ids(_closing(a)) == keys.captured_ids(_closing(b))


def test_a_tracer_captured_is_keyed_as_an_array():
    seen = []

    @jax.jit
    def f(x, y):
        for _ in range(2):  # (by its type, as an array is: two tracers are one capture)
            seen.append(keys.captured_ids(_closing(x)) == keys.captured_ids(_closing(y * 2)))
        return x

    f(jnp.ones(2), jnp.ones(3))
    assert seen == [True, True]


def test_a_captured_function_is_compared_by_its_code_and_captures():
    def make(value):
        inner = _closing(value)
        return lambda x: inner(x)

    obj = _Obj()
    for _ in range(2):
        assert keys.function_key(make(1.0)) == keys.function_key(make(2.0))
        assert keys.function_key(make(obj)) == keys.function_key(make(obj))
        assert keys.function_key(make(obj)) != keys.function_key(make(_Obj()))
