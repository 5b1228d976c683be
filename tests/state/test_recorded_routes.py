"""Routes the walk before a trace does not follow, seen by the trace as it reads them
(`jaxdist._state.record`): a class attribute holding a config, an Enum or a namespace; a
descriptor's storage; a metaclass property; an object behind a delegating
``__getattr__``; a global read in a ``NamedTuple`` method, in a ``custom_vjp`` backward
function or through ``globals()``; a ``Decimal``; a global strategy rebound. Each is
fresh on every call, eager and under ``jd.function``, against the same code run as plain
Python; an iterator or a random generator the trace draws from is named at the trace.

Each case: ``make()`` gives the step (``x -> value``) and ``change(i)``, run after call
``i``; the expected value of call ``i`` is ``i + 1``.
"""

import collections
import dataclasses
import decimal
import enum
import types
import warnings

import jax
import jax.numpy as jnp
import pytest
from conftest import mirrored

import jaxdist as jd


class Config:
    def __init__(self, lr):
        self.lr = lr


class ClassConfig:
    config = Config(1.0)

    def step(self, x):
        return x * self.config.lr


def class_config_replaced():
    ClassConfig.config = Config(1.0)
    return ClassConfig().step, lambda i: setattr(ClassConfig, "config", Config(i + 2.0))


def class_config_mutated():
    ClassConfig.config = Config(1.0)
    return ClassConfig().step, lambda i: setattr(ClassConfig.config, "lr", i + 2.0)


class Phase(enum.Enum):
    ONE = 1
    TWO = 2


class ClassEnum:
    phase = Phase.ONE

    def step(self, x):
        return x * (1.0 if self.phase is Phase.ONE else 2.0)


def class_enum():
    ClassEnum.phase = Phase.ONE
    return ClassEnum().step, lambda i: setattr(ClassEnum, "phase", Phase.TWO)


class ClassNamespace:
    ns = types.SimpleNamespace(lr=1.0)

    def step(self, x):
        return x * self.ns.lr


def class_namespace():
    ClassNamespace.ns = types.SimpleNamespace(lr=1.0)
    return ClassNamespace().step, lambda i: setattr(ClassNamespace.ns, "lr", i + 2.0)


class Stored:
    def __set_name__(self, owner, name):
        self.name = "_" + name

    def __get__(self, obj, owner=None):
        return getattr(obj, self.name)

    def __set__(self, obj, value):
        setattr(obj, self.name, value)


class WithDescriptor:
    lr = Stored()

    def __init__(self):
        self.lr = 1.0

    def step(self, x):
        return x * self.lr


def descriptor():
    t = WithDescriptor()
    return t.step, lambda i: setattr(t, "lr", i + 2.0)


class Meta(type):
    @property
    def lr(cls):
        return cls._lr


class WithMetaProperty(metaclass=Meta):
    _lr = 1.0

    def step(self, x):
        return x * type(self).lr


def metaclass_property():
    WithMetaProperty._lr = 1.0
    return WithMetaProperty().step, lambda i: setattr(WithMetaProperty, "_lr", i + 2.0)


class Optimizer:
    def __init__(self):
        self.lr = 1.0


class Delegating:
    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)


class WithDelegate:
    def __init__(self):
        self.opt = Delegating(Optimizer())

    def step(self, x):
        return x * self.opt.lr


def delegating_getattr():
    t = WithDelegate()
    return t.step, lambda i: setattr(t.opt._inner, "lr", i + 2.0)


SCALE = 1.0


def set_scale(i):
    global SCALE
    SCALE = i + 2.0


class Scaled(collections.namedtuple("Scaled", "k")):
    def scale(self, x):
        return x * SCALE * self.k


def namedtuple_method_global():
    set_scale(-1)
    held = Scaled(1.0)
    return (lambda x: held.scale(x)), set_scale


@jax.custom_vjp
def passthrough(x):
    return x


def _forward(x):
    return x, None


def _backward(_, g):
    return (g * SCALE,)


passthrough.defvjp(_forward, _backward)


def custom_vjp_backward_global():
    set_scale(-1)
    return (lambda x: jax.grad(passthrough)(x)), set_scale


def _by_globals(x):
    return x * globals()["SCALE"]


def globals_item():
    set_scale(-1)
    return _by_globals, set_scale


class WithDecimal:
    def __init__(self):
        self.lr = decimal.Decimal("1")

    def step(self, x):
        return x * float(self.lr)


def a_decimal():
    t = WithDecimal()
    return t.step, lambda i: setattr(t, "lr", decimal.Decimal(i + 2))


CASES = {
    "class_config_replaced": class_config_replaced,
    "class_config_mutated": class_config_mutated,
    "class_enum": class_enum,
    "class_namespace": class_namespace,
    "descriptor": descriptor,
    "metaclass_property": metaclass_property,
    "delegating_getattr": delegating_getattr,
    "namedtuple_method_global": namedtuple_method_global,
    "custom_vjp_backward_global": custom_vjp_backward_global,
    "globals_item": globals_item,
    "a_decimal": a_decimal,
}
EXPECTED = {"class_enum": [1.0, 2.0, 2.0]}


def _calls(s, mode, step):
    if mode == "eager":
        return lambda x: s.run(step, args=(x,))
    return jd.function(lambda x: s.run(step, args=(x,)))


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("n", [1, 2, 8], ids=lambda n: f"r{n}")
def test_a_route_the_walk_misses_is_read_afresh(case, mode, n):
    s = mirrored(n)
    step, change = CASES[case]()
    plain = [None] * 3
    call = _calls(s, mode, step)
    got = []
    for i in range(3):
        out = call(jnp.float32(1.0))
        got.append([float(v) for v in s.experimental_local_results(out)])
        plain[i] = float(step(jnp.float32(1.0)))  # the same code as plain Python
        change(i)
    want = EXPECTED.get(case, [1.0, 2.0, 3.0])
    assert plain == want
    assert got == [[w] * n for w in want]


class Drawing:
    def __init__(self, source):
        self.source = source

    def step(self, x):
        return x * next(self.source)


class Random:
    def __init__(self):
        import numpy as np

        self.rng = np.random.default_rng(0)

    def step(self, x):
        return x * self.rng.standard_normal()


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("make", [lambda: Drawing(iter([1.0, 2.0])), Random], ids=["next", "rng"])
def test_an_iterator_or_a_random_generator_drawn_at_the_trace_is_named(make, mode):
    s = mirrored(2)
    t = make()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _calls(s, mode, t.step)(jnp.float32(1.0))
    said = [str(w.message) for w in seen if "iterator or a random generator" in str(w.message)]
    assert said and ("self.source" in said[0] or "self.rng" in said[0])


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_a_global_strategy_rebound_to_another_is_a_new_program(mode):
    held = {"s": mirrored(2)}

    def step(x):
        return jd.get_replica_context().all_reduce("SUM", x)

    if mode == "eager":
        call = lambda x: held["s"].run(step, args=(x,))  # noqa: E731
    else:
        call = jd.function(lambda x: held["s"].run(step, args=(x,)))
    first = held["s"].experimental_local_results(call(jnp.ones(())))
    held["s"] = mirrored(4)
    second = held["s"].experimental_local_results(call(jnp.ones(())))
    assert [float(v) for v in first] == [2.0, 2.0]
    assert [float(v) for v in second] == [4.0] * 4


def test_a_number_read_through_a_class_attribute_traces_at_most_twice():
    s = mirrored(2)
    ClassConfig.config = Config(1.0)
    t = ClassConfig()
    f = jd.function(lambda x: s.run(t.step, args=(x,)))
    for i in range(5):
        assert float(s.experimental_local_results(f(jnp.float32(1.0)))[0]) == 1.0 + i
        ClassConfig.config.lr = i + 2.0
    assert f.experimental_get_tracing_count() <= 2


def test_recording_leaves_the_program_s_classes_as_they_were():
    s = mirrored(2)
    ClassConfig.config = Config(1.0)
    f = jd.function(lambda x: s.run(ClassConfig().step, args=(x,)))
    f(jnp.float32(1.0))
    assert "__getattribute__" not in vars(ClassConfig)
    assert "__getattribute__" not in vars(Config)
    assert "__getattribute__" not in vars(Meta)


# -- numbers that change: at most two traces, and back as the type Python gives -------------


class SlottedCounter:
    __slots__ = ("n",)

    def __init__(self):
        self.n = 0

    def step(self, x):
        self.n += 1
        return x * self.n


@dataclasses.dataclass(slots=True)
class Schedule:
    lr: float = 1.0


class WithSchedule:
    def __init__(self):
        self.schedule = Schedule()

    def step(self, x):
        return x * self.schedule.lr


class WithHistory:
    def __init__(self):
        self.history = collections.deque([1.0, 1.0, 1.0], maxlen=3)

    def step(self, x):
        return x * sum(self.history)


def _traces(mode, step, f):
    return (
        jd.experimental.step_count(step) if mode == "eager" else f.experimental_get_tracing_count()
    )


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("n", [1, 2, 8], ids=lambda n: f"r{n}")
def test_a_slotted_counter_counts_in_one_trace(mode, n):
    s, t = mirrored(n), SlottedCounter()
    call = _calls(s, mode, t.step)
    got = [float(s.experimental_local_results(call(jnp.float32(1.0)))[0]) for _ in range(4)]
    assert got == [1.0, 2.0, 3.0, 4.0] and t.n == 4 and type(t.n) is int
    assert _traces(mode, t.step, call) == 1


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("n", [1, 2, 8], ids=lambda n: f"r{n}")
@pytest.mark.parametrize("kind", ["dataclass_slots", "deque"])
def test_numbers_that_change_every_call_trace_at_most_twice(kind, mode, n):
    s = mirrored(n)
    t = WithSchedule() if kind == "dataclass_slots" else WithHistory()
    call = _calls(s, mode, t.step)
    got, want = [], []
    for i in range(5):
        want.append(float(t.step(jnp.float32(1.0))))  # plain Python, before the call
        got.append(float(s.experimental_local_results(call(jnp.float32(1.0)))[0]))
        if kind == "deque":
            t.history.append(i + 2.0)
        else:
            t.schedule.lr = i + 2.0
    assert got == want
    assert _traces(mode, t.step, call) <= 2


class Remembers:
    def __init__(self):
        self.lr = 1.0
        self.last_lr = None

    def step(self, x):
        self.last_lr = self.lr
        return x * self.lr


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("n", [1, 2, 8], ids=lambda n: f"r{n}")
def test_a_number_assigned_as_it_is_comes_back_a_python_number(mode, n):
    s, t = mirrored(n), Remembers()
    call = _calls(s, mode, t.step)
    for i in range(3):
        call(jnp.float32(1.0))
        assert t.last_lr == 1.0 + i and type(t.last_lr) is float
        t.lr = i + 2.0


class Key:
    hashes = 0

    def __hash__(self):
        Key.hashes += 1
        return 7

    def __eq__(self, other):
        return self is other


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_a_dict_keyed_by_a_program_s_object_runs_no_hash_per_call(mode):
    s, key = mirrored(2), Key()
    table = {key: 2.0}
    call = _calls(s, mode, lambda x: x * table[key])
    call(jnp.float32(1.0))
    call(jnp.float32(1.0))
    Key.hashes = 0
    for _ in range(4):
        assert float(s.experimental_local_results(call(jnp.float32(1.0)))[0]) == 2.0
    assert Key.hashes == 0
    table[key] = 3.0
    assert float(s.experimental_local_results(call(jnp.float32(1.0)))[0]) == 3.0
