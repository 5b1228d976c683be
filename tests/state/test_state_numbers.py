"""Python numbers in a step's state (issue 31, item 3): a counter the step changes never
compiles again, a schedule the host changes costs at most one more compile in total, and
10,000 calls keep memory flat.

Each replica's batch sums to 8 / R, so the all-reduced sum is 8 on every strategy: a step
returning ``number * total(x)`` gives 8 times the number it read.
"""

import gc

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import mirrored, ones_batch, run_local, total

import jaxdist as jd


class Counter:
    def __init__(self):
        self.calls = 0

    def step(self, x):
        self.calls += 1
        return self.calls * total(x)


def test_a_counter_on_self_never_compiles_again(strat):
    t, x = Counter(), ones_batch(strat)
    seen = [run_local(strat, t.step, x) for _ in range(200)]
    assert seen == [8.0 * k for k in range(1, 201)]
    assert t.calls == 200 and type(t.calls) is int
    assert jd.experimental.step_count(t.step) == 1


CALLS = 0


def global_counter(x):
    global CALLS
    CALLS += 1
    return CALLS * total(x)


def test_a_global_counter_never_compiles_again(strat):
    global CALLS
    CALLS, x = 0, ones_batch(strat)
    compiled = jd.experimental.step_count(global_counter)  # by the other strategies' tests
    seen = [run_local(strat, global_counter, x) for _ in range(50)]
    assert seen == [8.0 * k for k in range(1, 51)] and CALLS == 50
    assert jd.experimental.step_count(global_counter) == compiled + 1


class Schedule:
    def __init__(self):
        self.lr = 0.5

    def step(self, x):
        return self.lr * total(x)


def test_a_schedule_the_host_changes_costs_one_more_compile_at_most(strat):
    t, x, seen = Schedule(), ones_batch(strat), []
    for k in range(200):
        t.lr = 0.5 + k  # every call a new value
        seen.append(run_local(strat, t.step, x))
    assert seen == [8.0 * (0.5 + k) for k in range(200)]
    assert jd.experimental.step_count(t.step) <= 2


class CountedSchedule:
    def __init__(self):
        self.calls, self.lr = 0, 0.5

    def step(self, x):
        self.calls += 1
        return self.calls * total(x) + self.lr


def test_numbers_on_the_partial_batch_path_are_inputs_too(strat):
    """A dataset whose last batch is partial (ragged over the replicas, 3 rows over 2 or
    8): the counter counts once per call, every replica reads the same count, and
    neither it nor an epoch schedule compiles again per call."""
    t, n = CountedSchedule(), strat.num_replicas_in_sync
    batches = [np.ones((2 * n,), np.float32), np.ones((3,), np.float32)]
    data = strat.experimental_distribute_dataset(batches)
    for epoch in range(6):
        t.lr = 0.5 + epoch
        for b, rows in zip(data, (2 * n, 3)):
            got = strat.experimental_local_results(strat.run(t.step, args=(b,)))
            want = t.calls * rows + t.lr
            assert [float(v) for v in got] == [want] * n, (epoch, rows)
    assert t.calls == 12 and type(t.calls) is int
    assert jd.experimental.step_count(t.step) <= 6  # (full, partial) x (baked, counter, lr)


def test_a_number_the_step_needs_concretely_still_gives_its_answer(strat):
    """``range(self.n)``: the number stays part of the trace (a new value, a new trace)."""

    class T:
        def __init__(self):
            self.n = 1

        def step(self, x):
            return sum(total(x) for _ in range(self.n))

    t, x = T(), ones_batch(strat)
    for n in (1, 2, 3, 2):
        t.n = n
        assert run_local(strat, t.step, x) == 8.0 * n


def test_a_bool_flag_is_part_of_the_trace(strat):
    class T:
        def __init__(self):
            self.training = True

        def step(self, x):
            return total(x) * (2.0 if self.training else 1.0)

    t, x = T(), ones_batch(strat)
    assert run_local(strat, t.step, x) == 16.0
    t.training = False
    assert run_local(strat, t.step, x) == 8.0
    t.training = True
    assert run_local(strat, t.step, x) == 16.0


def _rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


@pytest.mark.unchecked
def test_ten_thousand_calls_with_changing_numbers_keep_memory_flat():
    """A counter, a schedule and a step defined inside each call: 10,000 calls, +20 MB at
    most (each compile kept 1.6-6 MB before)."""
    s, traces = mirrored(2), []

    class Trainer:
        def __init__(self):
            self.calls, self.lr, self.w = 0, 0.0, jnp.zeros(())

        def train_step(self, x):
            def train_fn(x):
                traces.append(1)
                self.calls += 1
                return self.w + self.lr * total(x)

            return s.run(train_fn, args=(x,))

    t, x = Trainer(), ones_batch(s)
    for k in range(200):  # warm: every program this loop needs is compiled
        t.lr = float(k)
        t.train_step(x)
    gc.collect()
    before = _rss_mb()
    for k in range(10_000):
        t.lr = float(k)
        out = t.train_step(x)
    gc.collect()
    assert float(s.experimental_local_results(out)[0]) == 8.0 * 9_999
    assert t.calls == 10_200
    assert len(traces) <= 3  # the counter's trace twice, the schedule's once
    assert _rss_mb() - before < 20.0


def test_past_4096_python_values_the_rest_is_loud_and_the_first_are_current(strat):
    """A step reading 5,000 Python numbers of its state: the first 4,096 are checked on
    every call (a change is seen), the rest are named in a warning at the trace."""

    class Table:
        def __init__(self):
            self.rows = {f"r{i}": 0.0 for i in range(5000)}

        def step(self, x):
            return sum(self.rows[f"r{i}"] for i in range(5000)) + total(x)

    t, x = Table(), ones_batch(strat)
    loud = r"more than 4096 Python values from its state; self.rows\['r40\d\d'\] and 9\d\d more"
    with pytest.warns(RuntimeWarning, match=loud):
        assert run_local(strat, t.step, x) == 8.0
    t.rows["r0"] = 2.0
    assert run_local(strat, t.step, x) == 10.0


BIG = [[object() for _ in range(1000)] for _ in range(210)]  # 210,210 objects


def test_past_the_walks_budget_numbers_are_loud(strat):
    """More objects reachable than the walk's budget (200,000): the numbers past it are
    named as kept in a warning at the trace, never silently."""

    class Big:
        def __init__(self):
            self.items = BIG
            self.lr = 1.0

        def step(self, x):
            return self.lr * total(x)

    with pytest.warns(RuntimeWarning, match="reads beyond them keep the value"):
        assert run_local(strat, Big().step, ones_batch(strat)) == 8.0
