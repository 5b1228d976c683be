"""Every route by which a step reads state gives the state as it is at the call (issue 31,
item 1), and finding it runs no user code (item 2).

Each step adds the all-reduced batch sum (8 on every strategy) to the state it read, or
multiplies it by a Python number it read; the expected values follow from that alone.
"""

import collections
import operator
import sys
import types
import warnings
import weakref

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ones_batch, run_local, total


class T:
    def __init__(self):
        self.lr = 1.0


def _getattr_const(t):
    return getattr(t, "lr")  # noqa: B009 - the route under test


def _getattr_name(t):
    name = "lr"
    return getattr(t, name)


NAME, PREFIX, NAMES = "lr", "l", ["lr"]


def _helper(o, name):
    return getattr(o, name)


class Keyed:
    """The attribute's name kept on the object, read through a method."""

    key = "lr"

    def get(self, t):
        return getattr(t, self.key)


def _closure_name():
    name = NAME

    def read(t):
        return getattr(t, name)

    return read


NUMBER_ROUTES = {
    "getattr": _getattr_const,
    "getattr_name": _getattr_name,
    "__dict__": lambda t: t.__dict__["lr"],
    "vars": lambda t: vars(t)["lr"],
    "attrgetter": lambda t: operator.attrgetter("lr")(t),
    # the name comes from outside the code that reads by it
    "getattr_global": lambda t: getattr(t, NAME),
    "getattr_cell": _closure_name(),
    "getattr_default": lambda t, name=NAME: getattr(t, name),
    "getattr_computed": lambda t: getattr(t, PREFIX + "r"),
    "getattr_loop": lambda t: sum(getattr(t, n) for n in NAMES),
    "vars_computed": lambda t: vars(t)[PREFIX + "r"],
    "__dict___computed": lambda t: t.__dict__[PREFIX + "r"],
    "attrgetter_global": lambda t: operator.attrgetter(NAME)(t),
    "helper_function": lambda t: _helper(t, PREFIX + "r"),
    "method_and_key": Keyed().get,
}


def test_a_number_two_objects_down_read_by_computed_names_is_current(strat):
    t, x = T(), ones_batch(strat)
    t.inner = T()

    def step(x):
        return getattr(getattr(t, "in" + "ner"), PREFIX + "r") * total(x)

    assert run_local(strat, step, x) == 8.0
    t.inner.lr = 3.0
    assert run_local(strat, step, x) == 24.0


def test_a_python_number_read_by_a_name_given_as_an_argument_is_current(strat):
    t, x = T(), ones_batch(strat)

    def step(x, name):
        return getattr(t, name) * total(x)

    assert run_local(strat, step, x, "lr") == 8.0
    t.lr = 3.0
    assert run_local(strat, step, x, "lr") == 24.0


@pytest.mark.parametrize("route", sorted(NUMBER_ROUTES))
def test_a_python_number_read_by_name_is_current(strat, route):
    t, x, read = T(), ones_batch(strat), NUMBER_ROUTES[route]

    def step(x):
        return read(t) * total(x)

    # a code of its own per route: what jaxdist learns about a step is kept by its code
    step.__code__ = step.__code__.replace(co_name=f"step_{route.strip('_')}")
    assert run_local(strat, step, x) == 8.0
    t.lr = 3.0
    assert run_local(strat, step, x) == 24.0


def test_a_module_imported_inside_the_step_is_current(strat):
    module = types.ModuleType("jaxdist_test_config")
    module.LR, module.W = 1.0, jnp.zeros(())
    sys.modules["jaxdist_test_config"] = module
    try:

        def step(x):
            import jaxdist_test_config as config

            return config.W + config.LR * total(x)

        x = ones_batch(strat)
        assert run_local(strat, step, x) == 8.0
        module.W = jnp.float32(1.0)
        assert run_local(strat, step, x) == 9.0
        module.LR = 2.0
        assert run_local(strat, step, x) == 17.0
    finally:
        del sys.modules["jaxdist_test_config"]


def _object_array(v):
    out = np.empty(1, dtype=object)
    out[0] = v
    return out


CONTAINERS = {
    "deque": (lambda v: collections.deque([v]), lambda c: c[0]),
    "object ndarray": (_object_array, lambda c: c[0]),
    "MappingProxyType": (lambda v: types.MappingProxyType({"w": v}), lambda c: c["w"]),
    "weakref": (lambda box: weakref.ref(box), lambda c: c().w),
}


class Box:
    def __init__(self, w):
        self.w = w


@pytest.mark.parametrize("kind", sorted(CONTAINERS))
def test_an_array_in_a_container_is_current(strat, kind):
    make, read = CONTAINERS[kind]
    keep = []  # the weakref's object stays alive here

    def put(v):
        if kind == "weakref":
            keep[:] = [Box(v)]
            return make(keep[0])
        return make(v)

    state = {"c": put(jnp.zeros(()))}

    def step(x):
        return read(state["c"]) + total(x)

    x, seen = ones_batch(strat), []
    for _ in range(3):
        out = run_local(strat, step, x)
        state["c"] = put(jnp.float32(out))
        seen.append(out)
    assert seen == [8.0, 16.0, 24.0]


def test_function_attributes_are_current(strat):
    def step(x):
        return step.w + step.lr * total(x)

    step.w, step.lr = jnp.zeros(()), 1.0
    x = ones_batch(strat)
    assert run_local(strat, step, x) == 8.0
    step.w = jnp.float32(1.0)
    assert run_local(strat, step, x) == 9.0
    step.lr = 2.0
    assert run_local(strat, step, x) == 17.0


@pytest.mark.parametrize("layout", ["fortran", "strided"])
def test_a_numpy_view_of_a_non_contiguous_array_changed_in_place(strat, layout):
    """JAX copies such a view: the copy cannot be traced back, so jaxdist warns at the
    trace, naming what to do; the answer is current when it did not warn."""
    if layout == "fortran":
        table = np.asfortranarray(np.zeros((2, 3), np.float32))
    else:
        table = np.zeros(12, np.float32)[::2].reshape(2, 3)

    def step(x):
        return jnp.sum(jnp.asarray(table[1])) + total(x)

    x = ones_batch(strat)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert run_local(strat, step, x) == 8.0
    warned = [w for w in caught if "jnp.asarray(table)[1]" in str(w.message)]
    table[1] = [1.0, 2.0, 3.0]
    assert warned or run_local(strat, step, x) == 14.0


def test_a_numpy_function_of_numpy_state_warns_once_at_the_trace(strat):
    class M:
        def __init__(self):
            self.w = np.zeros(3, np.float32)

        def step(self, x):
            return jnp.sum(jnp.asarray(np.exp(self.w))) + total(x)

    m, x = M(), ones_batch(strat)
    with pytest.warns(RuntimeWarning, match=r"float32\[3\].*jnp.exp\(self.w\)"):
        assert run_local(strat, m.step, x) == 11.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run_local(strat, m.step, x)  # not again: the step is not traced again


def test_the_tail_of_a_list_of_3000_parameters(strat):
    class M:
        def __init__(self):
            self.params = [jnp.zeros(()) for _ in range(3000)]

        def step(self, x):
            return self.params[-1] + total(x)

    m, x, seen = M(), ones_batch(strat), []
    for _ in range(3):
        out = run_local(strat, m.step, x)
        m.params[-1] = jnp.float32(out)
        seen.append(out)
    assert seen == [8.0, 16.0, 24.0]


def test_a_number_seven_attributes_deep(strat):
    root = Box(None)
    node = root
    for _ in range(6):
        node.w = Box(None)
        node = node.w
    node.w = 1.0

    def step(x):
        return root.w.w.w.w.w.w.w * total(x)

    x = ones_batch(strat)
    assert run_local(strat, step, x) == 8.0
    node.w = 3.0
    assert run_local(strat, step, x) == 24.0


# -- finding state runs no user code --------------------------------------------------------

CALLS: list = []


class Recording:
    """Records every attribute read beyond the object protocol's own."""

    def __getattribute__(self, name):
        if not (name.startswith("__") and name.endswith("__")):
            CALLS.append(("__getattribute__", name))
        return object.__getattribute__(self, name)

    def __getattr__(self, name):
        CALLS.append(("__getattr__", name))
        raise AttributeError(name)


class Slotted:
    __slots__ = ("a",)

    def __init__(self):
        self.a = jnp.ones(())

    def __getattr__(self, name):
        CALLS.append(("slots __getattr__", name))
        raise AttributeError(name)


class DictProperty:
    @property
    def __dict__(self):
        CALLS.append(("__dict__ property", None))
        return {}


class Base:
    __slots__ = ("value",)


class Shadowed(Base):
    @property
    def value(self):
        CALLS.append(("property over a slot", None))
        return 1.0


class LazyDict(dict):
    def __len__(self):
        CALLS.append(("dict __len__", None))
        return 0

    def __iter__(self):
        CALLS.append(("dict __iter__", None))
        return iter(())

    def __getitem__(self, key):
        CALLS.append(("dict __getitem__", key))
        raise KeyError(key)

    def __eq__(self, other):
        CALLS.append(("dict __eq__", None))
        return False

    __hash__ = object.__hash__


class LazyList(list):
    def __len__(self):
        CALLS.append(("list __len__", None))
        return 0

    def __iter__(self):
        CALLS.append(("list __iter__", None))
        return iter(())

    def __getitem__(self, index):
        CALLS.append(("list __getitem__", index))
        raise IndexError(index)


class Cursor:
    def __iter__(self):
        return self

    def __next__(self):
        CALLS.append(("cursor consumed", None))
        raise StopIteration


def test_finding_state_runs_no_user_code(strat):
    class Trainer:
        def __init__(self):
            self.w = jnp.zeros(())
            self.recording, self.slotted = Recording(), Slotted()
            self.proxy, self.shadowed = DictProperty(), Shadowed()
            self.lazy_dict = LazyDict(w=jnp.ones(()))
            self.lazy_list = LazyList([jnp.ones(())])
            self.cursor, self.rows = Cursor(), (i for i in range(3))

        def step(self, x):
            return self.w + total(x)

    t, x, seen = Trainer(), ones_batch(strat), []
    CALLS.clear()
    for _ in range(3):
        t.w = jnp.float32(run_local(strat, t.step, x))
        seen.append(float(t.w))
    assert seen == [8.0, 16.0, 24.0]
    assert CALLS == []
    assert next(t.rows) == 0  # the generator was not consumed


def test_an_array_jaxdist_cannot_find_is_loud_not_silent(strat, monkeypatch):
    """An installed package's global (not the program's state: jaxdist does not look
    there) read by the step: a constant of its program, and a warning says so."""
    pkg = types.ModuleType("installed_pkg")
    pkg.__file__ = "/usr/lib/python3/site-packages/installed_pkg/__init__.py"
    pkg.W = jnp.ones(8)
    monkeypatch.setitem(sys.modules, "installed_pkg", pkg)

    def step(x):
        import installed_pkg

        return jnp.sum(installed_pkg.W) * total(x)

    with pytest.warns(RuntimeWarning, match=r"read 1 JAX array\(s\) \(float32\[8\]\) that jaxdist"):
        assert run_local(strat, step, ones_batch(strat)) == 64.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # arrays made inside the step are not state
        assert run_local(strat, lambda x: jnp.arange(3.0).sum() * total(x), ones_batch(strat)) == 24


def test_a_number_of_an_installed_package_the_step_names_is_current(strat, monkeypatch):
    pkg = types.ModuleType("installed_config")
    pkg.__file__ = "/usr/lib/python3/site-packages/installed_config/__init__.py"
    pkg.LR = 1.0
    monkeypatch.setitem(sys.modules, "installed_config", pkg)

    def step(x):
        import installed_config

        return installed_config.LR * total(x)

    x = ones_batch(strat)
    assert run_local(strat, step, x) == 8.0
    pkg.LR = 3.0
    assert run_local(strat, step, x) == 24.0
