"""The state review: numbers come back as Python computes them (a counter past int32, a
clock at 2**24), numbers that must stay concrete are found one by one, and a decline
says why.

Each replica's batch sums to 8 / R, so the all-reduced sum is 8 on every strategy.
"""

import gc
import threading
import types
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ones_batch, run_local, total

import jaxdist as jd


class Tokens:
    def __init__(self, start=0):
        self.tokens = start

    def step(self, x):
        self.tokens += 1_000_000_000
        return total(x)


def test_a_counter_past_int32_counts_as_python_does(strat):
    t, x = Tokens(), ones_batch(strat)
    seen = []
    for _ in range(5):
        run_local(strat, t.step, x)
        seen.append(t.tokens)
    assert seen == [k * 1_000_000_000 for k in range(1, 6)]
    assert type(t.tokens) is int
    assert jd.experimental.step_count(t.step) == 1


class Clock:
    def __init__(self):
        self.clock = float(2**24)
        self.lr = 1.0
        self.k = -5

    def step(self, x):
        self.clock += 0.1
        self.lr *= 0.99
        self.k = (self.k * 7 - 100) // 3 % 11 - self.k
        return total(x)


def test_written_floats_and_ints_follow_python_arithmetic(strat):
    t, x = Clock(), ones_batch(strat)
    clock, lr, k = float(2**24), 1.0, -5
    for _ in range(30):
        run_local(strat, t.step, x)
        clock, lr = clock + 0.1, lr * 0.99
        k = (k * 7 - 100) // 3 % 11 - k
    assert (t.clock, t.lr, t.k) == (clock, lr, k)  # exactly: double floats, floor division
    assert t.clock > 2**24 + 2.9 and type(t.k) is int
    assert jd.experimental.step_count(t.step) == 1


class Halves:
    def __init__(self):
        self.n = 7

    def step(self, x):
        self.n = self.n / 2
        return total(x)


def test_a_true_division_of_an_int_writes_a_float(strat):
    t, x = Halves(), ones_batch(strat)
    run_local(strat, t.step, x)
    run_local(strat, t.step, x)
    assert t.n == 1.75 and type(t.n) is float


def fresh(cls, tag):
    """``cls`` with a step of its own code (jaxdist remembers by code which numbers stay
    static: each parametrization starts afresh)."""
    code = cls.step.__code__.replace(co_name=f"step_{tag}")
    step = types.FunctionType(code, cls.step.__globals__, closure=cls.step.__closure__)
    return type(cls.__name__, (cls,), {"step": step})


class Scaled:
    def __init__(self, start):
        self.calls = start

    def step(self, x):
        self.calls += 1
        return self.calls * total(x)


def test_a_counter_the_device_reads_past_int32_is_loud_never_wrapped(strat):
    start = 2**31 - 4
    t, x = fresh(Scaled, id(strat))(start), ones_batch(strat)
    seen = [run_local(strat, t.step, x) for _ in range(3)]
    assert seen == [float(np.float32(start + k) * 8) for k in range(1, 4)]  # f32 on device
    # 2**31 would wrap on the device: part of the trace, where JAX itself refuses a
    # Python int past int32 in an array operation (as in jax.jit); never a wrapped count
    with pytest.warns(RuntimeWarning, match=r"self\.calls = 2147483647: the device would wrap"):
        with pytest.raises(OverflowError):
            run_local(strat, t.step, x)
    assert t.calls >= 2**31


class Loop:
    def __init__(self):
        self.n, self.lr, self.calls = 3, 0.5, 0

    def step(self, x):
        self.calls += 1
        out = total(x)
        for _ in range(self.n):  # needs the value of self.n
            out = out * self.lr
        return out


def test_one_number_needed_as_a_value_leaves_the_others_inputs(strat):
    t, x = fresh(Loop, id(strat))(), ones_batch(strat)
    assert run_local(strat, t.step, x) == 8 * 0.5**3
    t.n = 2  # traced again: self.n is needed as a value, static; self.calls stays an input
    assert run_local(strat, t.step, x) == 8 * 0.5**2
    t.lr = 0.25  # traced again once: self.lr becomes an input
    assert run_local(strat, t.step, x) == 8 * 0.25**2
    counted = jd.experimental.step_count(t.step)
    for lr in (0.125, 1.0, 2.0):
        t.lr = lr
        assert run_local(strat, t.step, x) == 8 * lr**2
    assert jd.experimental.step_count(t.step) == counted  # self.lr, self.calls: inputs
    assert t.calls == 6
    t.n = 3
    assert run_local(strat, t.step, x) == 8 * 2.0**3 and t.calls == 7


class Moded:
    def __init__(self):
        self.mode = "a"

    def step(self, x):
        return total(x) * (2.0 if self.mode == "a" else 3.0)


def test_the_retrace_warning_says_which_value_changed(strat):
    t, x = Moded(), ones_batch(strat)
    with pytest.warns(UserWarning, match=r"because self\.mode changed \('m\d' -> 'm[78]'\)"):
        for k in range(9):
            t.mode = f"m{k}"
            run_local(strat, t.step, x)


class Counting:
    def __init__(self):
        self.calls = 0

    def step(self, x):
        self.calls += 1
        return total(x)


@pytest.mark.unchecked
def test_two_threads_counting_lose_no_count(strat):
    t, x = Counting(), ones_batch(strat)
    run_local(strat, t.step, x)  # traced once, before the threads start
    errors = []

    def work():
        try:
            for _ in range(100):
                strat.run(t.step, args=(x,))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert t.calls == 201


class Nosy:
    """Counts every attribute read, hash and comparison that goes through its code."""

    seen = 0

    def __getattribute__(self, name):
        type(self).seen += 1
        return object.__getattribute__(self, name)

    def __hash__(self):
        type(self).seen += 1
        return 1

    def __eq__(self, other):
        type(self).seen += 1
        return True


class NosyTrainer(Nosy):
    def __init__(self):
        object.__setattr__(self, "other", Nosy())  # on self, never read by the step
        object.__setattr__(self, "w", 2.0)

    def step(self, x):
        return total(x) * object.__getattribute__(self, "w")


def test_looking_for_state_runs_no_user_code_of_objects_it_does_not_read(strat):
    t, x = NosyTrainer(), ones_batch(strat)
    bound = NosyTrainer.step.__get__(t)
    Nosy.seen = 0
    assert run_local(strat, bound, x) == 16.0
    assert run_local(strat, NosyTrainer.step.__get__(t), x) == 16.0
    assert Nosy.seen == 0


class Equal:
    def __init__(self, w):
        self.w = w

    def __eq__(self, other):
        return True

    def __hash__(self):
        return 1

    def step(self, x):
        return total(x) * self.k()

    def k(self):
        return self.w


def test_two_equal_trainers_get_programs_of_their_own(strat):
    a, b, x = Equal(2.0), Equal(3.0), ones_batch(strat)
    assert run_local(strat, a.step, x) == 16.0
    assert run_local(strat, b.step, x) == 24.0
    assert jd.experimental.step_count(a.step) == 1
    assert jd.experimental.step_count(b.step) == 1


class Actor:
    def __init__(self):
        self.w = jnp.full((), 2.0)
        self.act = jax.jit(self._act)

    def _act(self, y):
        return y * 2.0

    def step(self, x):
        return self.act(total(x)) * self.w


def test_a_trainer_holding_a_jitted_bound_method_is_freed(strat):
    x = ones_batch(strat)
    refs = []
    for _ in range(20):
        t = Actor()
        assert run_local(strat, t.step, x) == 32.0
        refs.append(weakref.ref(t))
        del t
    gc.collect()
    assert sum(r() is not None for r in refs) == 0


def test_argument_shapes_share_one_placed_copy_of_the_state(strat):
    gc.collect()  # arrays of this shape an earlier test left to JAX's caches are not counted
    earlier = {id(a) for a in jax.live_arrays() if a.shape == (256, 1024)}
    t = Actor()
    t.w = jnp.ones((256, 1024), jnp.float32)  # 1 MiB
    n = strat.num_replicas_in_sync
    step = lambda x: t.w[0, 0] * total(x)  # noqa: E731
    for rows in range(1, 7):  # 6 argument shapes
        x = strat.experimental_distribute_values_from_function(
            lambda c, rows=rows: jnp.ones(rows * 8 // n)
        )
        assert run_local(strat, step, x) == 8.0 * rows
    gc.collect()
    big = [a for a in jax.live_arrays() if a.shape == (256, 1024) and id(a) not in earlier]
    assert len(big) <= 2  # t.w, and its copy placed on the replicas (one, not six)


def test_kept_old_weights_do_not_keep_their_placed_copies(strat):
    """A loop keeping its last 5 weights (``history.append(t.w)``): each kept array kept its
    copy placed on the replicas (a copy per device each), though the state held another;
    the copy lives while a place of the state holds the array."""
    gc.collect()
    earlier = {id(a) for a in jax.live_arrays() if a.shape == (128, 1024)}
    t = Actor()
    t.w = jnp.zeros((128, 1024), jnp.float32)
    step = lambda x: t.w[0, 0] + total(x)  # noqa: E731
    history, x = [], ones_batch(strat)
    for i in range(6):
        assert run_local(strat, step, x) == 8.0 + i
        history = (history + [t.w])[-5:]
        t.w = t.w + 1.0
    gc.collect()
    big = [a for a in jax.live_arrays() if a.shape == (128, 1024) and id(a) not in earlier]
    # the 5 kept, t.w, and for each cached trace the copy of the last array it read (one a
    # trace, not one a kept array: six)
    traces = jd.experimental.step_count(step)
    assert len(big) <= 6 + traces, (len(big), traces)


def test_a_compiled_step_does_not_keep_the_state_it_read_alive(strat):
    """The array a step read at its trace is freed once the state holds another (JAX 0.12's
    jaxpr carries its constants' values: every cached trace kept the state as it was)."""
    t = Actor()
    t.w = jnp.ones((64, 64), jnp.float32)
    step = lambda x: t.w[0, 0] * total(x)  # noqa: E731
    x = ones_batch(strat)
    assert run_local(strat, step, x) == 8.0
    first = weakref.ref(t.w)
    t.w = jnp.full((64, 64), 2.0, jnp.float32)
    assert run_local(strat, step, x) == 16.0
    gc.collect()
    assert first() is None


class Explained:
    def __init__(self):
        self.params = {"w": jnp.ones(())}
        self.lr, self.calls, self.mode = 0.5, 0, "train"

    def step(self, x):
        self.calls += 1
        scale = 2.0 if self.mode == "train" else 1.0
        return total(x) * self.params["w"] * self.lr * scale


def test_explain_names_what_is_read_again(strat):
    t, x = fresh(Explained, id(strat))(), ones_batch(strat)
    run_local(strat, t.step, x)
    t.lr = 0.25  # an input from now on
    run_local(strat, t.step, x)
    text = jd.experimental.explain(t.step)
    newest = text.split("trace 2:")[0]
    assert "arrays read afresh on every call: self.params['w']" in newest
    assert "given to the program on every call: self.calls, self.lr" in newest
    assert "self.calls (Python's arithmetic)" in newest
    assert "self.mode == 'train'" in newest
    assert text.startswith("Explained.step: 2 cached traces") and "trace 2:" in text


class Divider:
    def __init__(self):
        self.x, self.d = 1.0, 2.0

    def step(self, x):
        self.x = self.x / self.d
        return total(x)


def test_a_written_number_divided_by_zero_raises_as_python_does(strat):
    t, x = fresh(Divider, id(strat))(), ones_batch(strat)
    run_local(strat, t.step, x)
    run_local(strat, t.step, x)
    assert t.x == 0.25
    t.d = 0.0
    with pytest.raises(ZeroDivisionError):
        run_local(strat, t.step, x)
    assert t.x == 0.25  # unchanged, as after Python's failed division


class Fresh:
    def __init__(self):
        self.w = jnp.ones((64,))
        self.calls = 0

    def step(self, x):
        self.calls += 1
        return total(x) * self.w[0]


@pytest.mark.unchecked
def test_many_calls_with_new_state_each_keep_memory_flat(strat):
    t, x = Fresh(), ones_batch(strat)
    for _ in range(20):
        t.w = t.w + 0
        run_local(strat, t.step, x)
    gc.collect()
    before = len(jax.live_arrays())
    for _ in range(500):
        t.w = t.w + 0  # a new array every call: its placed copy goes with the old one
        run_local(strat, t.step, x)
    gc.collect()
    assert len(jax.live_arrays()) <= before + 2
    assert t.calls == 520 and jd.experimental.step_count(t.step) == 1


class Printing:
    def __init__(self):
        self.calls = 0

    def step(self, x):
        self.calls += 1
        jax.debug.callback(SEEN.append, self.calls)
        return total(x)


SEEN = []


def test_an_effect_reading_a_number_sees_its_value(strat):
    t, x = fresh(Printing, id(strat))(), ones_batch(strat)
    SEEN.clear()
    for _ in range(3):
        run_local(strat, t.step, x)
    jax.effects_barrier()
    assert sorted({int(v) for v in SEEN}) == [1, 2, 3] and t.calls == 3


# -- the compiled walk of a step's state (`jaxdist._state.chains.Fetcher`) -------------------


def _chains_module():
    import importlib

    return importlib.import_module("jaxdist._state.chains")


def test_the_compiled_walk_reads_what_each_chain_reads_alone():
    """Every chain of a Keras-sized tree (2,000 arrays under ``self.params``, a global, a
    closure cell, a default) read by the compiled walk is the object Python reads there."""
    ch = _chains_module()

    class Model:
        def __init__(self):
            self.params = [{"w": np.full(2, i), "b": (i, float(i))} for i in range(1000)]

    model, scale = Model(), 3.0

    def make(limit=7):
        def step(x, k=5):
            return x * scale + limit + k + len(GLOBAL_TABLE)

        return types.MethodType(step, model)

    fn = make()
    chains = [(("self", None), ("attr", "params"), ("item", i), ("item", "w")) for i in range(1000)]
    chains += [
        (("self", None), ("attr", "params"), ("item", i), ("item", "b"), ("item", 1))
        for i in range(1000)
    ]
    chains += [(("func", None), ("global", "GLOBAL_TABLE")), (("func", None), ("cell", 0))]
    chains += [(("func", None), ("cell", 1)), (("func", None), ("default", 0)), (("self", None),)]
    values = ch.Fetcher(chains).values(fn)
    assert len(values) == len(chains)
    for chain, value in zip(chains, values):
        assert value is ch.fetch(fn, chain)
    assert values[0] is model.params[0]["w"] and values[1999] == 999.0
    assert values[-5:] == [GLOBAL_TABLE, 7, scale, 5, model]  # cells: limit, scale


GLOBAL_TABLE = {"a": 1}


def test_the_compiled_walk_raises_gone_where_a_link_is_missing():
    ch = _chains_module()

    class Model:
        pass

    model = Model()
    model.params = {"w": 1}
    fn = types.MethodType(lambda self: self.params["w"], model)
    fetcher = ch.Fetcher([(("self", None), ("attr", "params"), ("item", "w"))])
    assert fetcher.values(fn) == [1]
    model.params = {"v": 2}  # the key is gone
    with pytest.raises(ch.Gone):
        fetcher.values(fn)
    del model.params  # the attribute is gone
    with pytest.raises(ch.Gone):
        fetcher.values(fn)
    with pytest.raises(ch.Gone):  # a link of a kind the walk does not know
        ch.Fetcher([(("self", None), ("no such kind", 0))]).values(fn)
    assert ch.Fetcher([]).values(fn) == []
