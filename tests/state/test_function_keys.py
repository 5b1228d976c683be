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


# -- KeyWatch: a function's key kept while what made it is the same --------------------------


def _times(v):
    def step(x):
        return x * v

    return step


def _nested(v):
    def inner(x):
        return x * v

    def step(x):
        return inner(x)

    return step, inner


def _with_default(v):
    return lambda x, v=v: x


def _case_nested(v, change):
    step, inner = _nested(v)
    return step, lambda: change(inner)


# name -> (a function made anew, its change), and whether the change makes its key differ
_CHANGES = {
    "cell rebound to another object": (lambda: _rebinding(_times(_Obj()), _Obj()), True),
    "cell rebound to another float": (lambda: _rebinding(_times(1.0), 2.0), False),
    "cell rebound to an int": (lambda: _rebinding(_times(1.0), 2), True),
    "cell rebound to another array": (
        lambda: _rebinding(_times(jnp.ones(2)), jnp.zeros(3)),
        False,
    ),
    "cell rebound to a NumPy array": (lambda: _rebinding(_times(jnp.ones(2)), np.ones(2)), True),
    "code replaced by the same code": (lambda: _recoding(_times(1.0), _times(2.0)), False),
    "code replaced by other code": (lambda: _recoding(_times(1.0), _nested(1.0)[1]), True),
    "default replaced": (lambda: _redefaulting(_with_default(_Obj()), (_Obj(),)), True),
    "default float replaced": (lambda: _redefaulting(_with_default(1.0), (3.0,)), False),
    "default removed": (lambda: _redefaulting(_with_default(1.0), None), True),
    "a nested function's cell": (
        lambda: _case_nested(_Obj(), lambda inner: _rebinding(inner, _Obj())[1]()),
        True,
    ),
    "a nested function's code": (
        lambda: _case_nested(1.0, lambda inner: _recoding(inner, _times(1.0))[1]()),
        True,
    ),
    "a captured dict's entry": (lambda: _updating(_times({"lr": 1.0}), _Obj()), True),
}
_KEPT = []  # the values replaced, kept alive (a new object never takes a freed one's id)


def _rebinding(f, value):
    def change():
        _KEPT.append(f.__closure__[0].cell_contents)
        f.__closure__[0].cell_contents = value

    return f, change


def _recoding(f, other):
    return f, lambda: setattr(f, "__code__", other.__code__)


def _redefaulting(f, defaults):
    def change():
        _KEPT.append(f.__defaults__)
        f.__defaults__ = defaults

    return f, change


def _updating(f, value):
    return f, lambda: f.__closure__[0].cell_contents.update(lr=value)


@pytest.mark.parametrize("name", sorted(_CHANGES))
@pytest.mark.parametrize("strict", [False, True])
def test_a_key_watch_says_what_function_key_says_after_each_change(name, strict):
    make, differs = _CHANGES[name]
    f, change = make()
    watch = keys.KeyWatch(keys.function_key(f, strict), strict)
    assert [watch.differs(f) for _ in range(3)] == [False] * 3  # (kept after the first)
    change()
    now = keys.function_key(f, strict) != watch.key
    assert watch.differs(f) is now and watch.differs(f) is now
    if not strict:
        assert now is differs, name


def test_a_key_watch_of_captures_reads_a_methods_function_and_holds_nothing_strongly():
    import gc
    import weakref

    step = _times(_Obj())  # (the only reference to its object: its cell)
    obj = _Obj()
    bound = types.MethodType(_times(step), obj)  # (a method whose function captures step)
    watch = keys.KeyWatch(keys.captured_ids(bound), captures=True)
    assert not watch.differs(bound) and not watch.differs(types.MethodType(bound.__func__, obj))
    dead = weakref.ref(step.__closure__[0].cell_contents)
    step.__closure__[0].cell_contents = _Obj()
    gc.collect()
    assert dead() is None  # the watch kept no capture alive
    assert watch.differs(bound) is (keys.captured_ids(bound) != watch.key)


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("where", ["cell", "default", "nested function"])
def test_a_key_watch_of_a_capture_that_died_and_was_replaced_by_none(strict, where):
    """The object a kept answer was for is gone (its weak reference gives None) and the
    place holds None now: never taken for the same capture."""
    import gc

    if where == "cell":
        f = _times(_Obj())
    elif where == "default":
        f = _with_default(_Obj())
    else:
        f = _nested(1.0)[0]
    watch = keys.KeyWatch(keys.function_key(f, strict), strict)
    assert not watch.differs(f) and not watch.differs(f) and watch.held is not None
    if where == "default":
        f.__defaults__ = (None,)
    else:
        f.__closure__[0].cell_contents = None
    gc.collect()
    assert watch.differs(f) is (keys.function_key(f, strict) != watch.key) is True


def test_a_key_watch_of_an_object_whose_class_is_reassigned():
    """``obj.__class__ = Other``: the same object, keyed now as its new class says (a
    dataclass is keyed by its fields): the kept answer does not hold."""

    class Plain:
        pass

    @dataclasses.dataclass
    class Fields(Plain):
        w: float = 0.0

    obj = Plain()
    obj.w = 1.0
    f = _times(obj)
    watch = keys.KeyWatch(keys.function_key(f))
    assert not watch.differs(f) and watch.held is not None
    obj.__class__ = Fields
    assert watch.differs(f) is (keys.function_key(f) != watch.key) is True
