"""Bad and odd calls of the public API (issue 20's fuzz), by class.

* clear: a bad call raises TypeError/ValueError/RuntimeError in jaxdist's own words,
  naming what was wrong, before any work starts (`CLEAR`, one row per call);
* wrong: an odd but valid call gives the right answer, never a silently wrong one
  (`test_odd_calls_give_right_answers`, and the per-item tests below);
* leak: no internal error (NameError, IndexError, AssertionError, KeyError, NumPy or XLA
  text) reaches the user: `test_public_methods_never_leak_internal_errors` calls every
  public method of a strategy, its ``extended`` and a `ReplicaContext` with odd
  arguments, so a new method gets the same treatment without a new row;
* hang: what once never returned returns at once (`test_endless_dataset_*`), and every
  probe of the sweep must return within `HANG_S` seconds.

TF's answers for the same calls are in tests/tf_oracle/answers.json (``fuzz.*``, batch O,
TensorFlow 2.21 with 4 logical CPU devices); where jaxdist's answer differs, notebook 03
lists the difference.
"""

import json
import pathlib
import signal
import sys
import typing
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import mirrored

import jaxdist as jd

# the fuzz calls one step code with many odd arguments: the retrace warning is true and not what it checks
pytestmark = [
    pytest.mark.filterwarnings("ignore:strategy.run has compiled .* 8 times:UserWarning"),
]


ANSWERS = json.loads((pathlib.Path(__file__).parents[1] / "tf_oracle" / "answers.json").read_text())
rc = jd.get_replica_context


def tf(case):
    return ANSWERS[case]["result"]


def per_replica(s, fn=lambda i: jnp.full(3, float(i))):
    return s.experimental_distribute_values_from_function(lambda c: fn(c.replica_id_in_sync_group))


# -- clear: one row per bad call: (id, call, exception type, fragment of jaxdist's message) ------

S2 = mirrored(2)
S8 = mirrored(8)
X = jnp.ones(3)


def _kept_context():
    kept = []
    S2.run(lambda: kept.append(rc()))
    return kept[0]


def _acc_none(s):
    ops = jd.ReductionToOneDevice(accumulation_fn=lambda rows: None)
    return jd.MirroredStrategy(s.extended.worker_devices, cross_device_ops=ops)


CLEAR = [
    # section 2: wrong answers that are now errors
    ("hand_built_context_all_reduce",
     lambda: jd.ReplicaContext(S8, 0).all_reduce("SUM", jnp.ones(2)),
     RuntimeError, "not the current one (built with ReplicaContext"),
    ("hand_built_context_merge_call",
     lambda: jd.ReplicaContext(S8, 0).merge_call(lambda s: 1),
     RuntimeError, "ReplicaContext.merge_call"),
    ("hand_built_context_all_gather",
     lambda: jd.ReplicaContext(S8, 0).all_gather(jnp.ones((1, 2)), axis=0),
     RuntimeError, "ReplicaContext.all_gather"),
    ("from_stacked_scalar", lambda: jd.PerReplica.from_stacked(jnp.float32(1.0)),
     ValueError, "needs a leading replica axis"),
    ("from_stacked_list", lambda: jd.PerReplica.from_stacked([1.0, 2.0]),
     TypeError, "takes an array whose leading axis is the replica axis"),
    ("accumulation_fn_returns_none",
     lambda: _acc_none(S2).extended.batch_reduce_to("SUM", [(per_replica(S2), "/cpu:0")]),
     TypeError, "accumulation_fn must return one array"),
    ("accumulation_fn_returns_none_in_step",
     lambda: _acc_none(S2).run(lambda: rc().all_reduce("SUM", jnp.ones(2))),
     TypeError, "returned NoneType None"),
    ("reduce_wrong_components", lambda: S8.reduce("SUM", jd.PerReplica((X, X)), axis=None),
     ValueError, "strategy.reduce: the PerReplica has 2 components, but the strategy has 8"),
    ("gather_wrong_components", lambda: S8.gather(jd.PerReplica((X, X)), axis=0),
     ValueError, "strategy.gather: the PerReplica has 2 components"),
    ("local_results_wrong_components",
     lambda: S8.experimental_local_results(jd.PerReplica((X, X))),
     ValueError, "experimental_local_results: the PerReplica has 2 components"),
    ("reduce_to_wrong_components",
     lambda: S8.extended.reduce_to("SUM", jd.PerReplica((X, X)), "/cpu:0"),
     ValueError, "reduce_to: the PerReplica has 2 components"),
    ("batch_reduce_to_wrong_components",
     lambda: S8.extended.batch_reduce_to("SUM", [(jd.PerReplica((X, X)), "/cpu:0")]),
     ValueError, "batch_reduce_to: the PerReplica has 2 components"),
    ("run_wrong_components", lambda: S8.run(lambda v: v, args=(jd.PerReplica((X, X)),)),
     ValueError, "strategy.run (argument leaf 0): the PerReplica has 2 components"),
    ("other_strategys_value", lambda: S8.reduce("SUM", per_replica(S2), axis=None),
     ValueError, "has 2 components, but the strategy has 8 replicas"),
    ("nested_in_structure_wrong_components",
     lambda: S8.reduce("SUM", {"a": jd.PerReplica((X, X))}, axis=None),
     ValueError, "PerReplica (leaf 0) has 2 components"),
    # section 3: internal errors that leaked
    ("kept_context_all_reduce", lambda: _kept_context().all_reduce("SUM", jnp.ones(2)),
     RuntimeError, "(kept after its run)"),
    ("kept_context_replica_id", lambda: _kept_context().replica_id_in_sync_group,
     RuntimeError, "ReplicaContext.replica_id_in_sync_group"),
    ("kept_context_merge_call", lambda: _kept_context().merge_call(lambda s: 1),
     RuntimeError, "ReplicaContext.merge_call"),
    ("kept_context_in_jit",
     lambda: jax.jit(lambda: _kept_context().all_reduce("SUM", jnp.ones(2)))(),
     RuntimeError, "call jaxdist.get_replica_context() inside the step"),
    ("per_replica_of_mismatched_structures",
     lambda: S2.reduce("SUM", jd.PerReplica(({"a": X}, (X,))), axis=None),
     TypeError, "component 0 is a dict (a nested structure)"),
    ("per_replica_of_structures_in_jit",
     lambda: jax.jit(lambda: S2.reduce("SUM", jd.PerReplica(({"a": X}, (X,))), axis=None))(),
     TypeError, "takes one array per replica"),
    ("per_replica_mixed_dtypes", lambda: jd.PerReplica((jnp.ones(2), jnp.ones(2, jnp.int32))),
     TypeError, "component 0 is float32 and component 1 is int32"),
    ("per_replica_of_none", lambda: jd.PerReplica((None, None)),
     TypeError, "component 0 is None"),
    ("per_replica_nested", lambda: jd.PerReplica((jd.PerReplica((X, X)), X)),
     TypeError, "component 0 is itself a PerReplica"),
    ("all_reduce_of_different_shapes",
     lambda: S2.run(
         lambda v: rc().all_reduce("SUM", v),
         args=(jd.PerReplica((jnp.ones((2, 3)), jnp.ones((2, 4)))),),
     ),
     ValueError, "replica 0 gave float32[2, 3] and replica 1 gave float32[2, 4]"),
    ("run_kwargs_not_str", lambda: S2.run(lambda **k: 1, kwargs={1: 2}),
     TypeError, "kwargs must map argument names (str) to values; got the key int 1"),
    ("merge_call_kwargs_not_str", lambda: S2.run(lambda: rc().merge_call(lambda s, **k: 1,
                                                                        kwargs={1: 2})),
     TypeError, "kwargs must map argument names"),
    ("per_replica_batch_size_str",
     lambda: jd.InputContext(1, 0, 8).get_per_replica_batch_size("8"),
     TypeError, "global_batch_size must be a number"),
    ("call_for_each_replica_in_partial_batch_merge_fn",
     lambda: S2.run(
         lambda x: rc().merge_call(lambda st: st.extended.call_for_each_replica(lambda: 1)),
         args=(next(iter(S2.experimental_distribute_dataset([np.arange(3.0)]))),),
     ),
     RuntimeError, "works in full-batch steps; this merge_fn runs in a partial-batch step"),
    ("step_count_not_a_function", lambda: jd.experimental.step_count(3),
     TypeError, "step_count(fn) takes the function given to strategy.run"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("call", "error", "fragment"), [c[1:] for c in CLEAR], ids=[c[0] for c in CLEAR]
)
def test_bad_calls_raise_clear_errors(call, error, fragment):
    with pytest.raises(error) as info:
        call()
    assert fragment in str(info.value)
    assert not jd.has_strategy()


# -- wrong: odd but valid calls give the right answer ------------------------------------------


def test_odd_calls_give_right_answers():
    z = S8.run(lambda x: x * 2, args=(jnp.zeros((0, 4)),))  # a replica with no examples
    assert S8.gather(z, axis=0).shape == (0, 4)
    assert S8.gather(z, axis=1).shape == (0, 32)
    assert S8.reduce("SUM", z, axis=None).shape == (0, 4)
    assert S8.reduce("SUM", z, axis=0).tolist() == [0.0] * 4
    assert S8.extended.reduce_to("SUM", z, "/cpu:0").shape == (0, 4)
    out = S8.run(lambda: rc().all_gather(jnp.zeros((0, 2)), axis=0))
    assert [v.shape for v in S8.experimental_local_results(out)] == [(0, 2)] * 8
    jitted = jax.jit(lambda: S8.gather(S8.run(lambda x: x * 2, args=(jnp.zeros((0, 4)),)), 0))
    assert jitted().shape == (0, 4)
    # TF 2.21 crashes (SIGSEGV) on the gather and the all_gather; its reduce matches ours
    assert tf("fuzz.zero_rows")["gather"].startswith("process died")
    assert tf("fuzz.zero_rows")["reduce_sum_axis0"]["value"]["value"] == [0.0] * 4


# -- section 2 -----------------------------------------------------------------------------------


def test_scopes_exited_out_of_order_raise_and_end_in_the_default_state():
    s, other = mirrored(2), mirrored(2)
    a, b = s.scope(), s.scope()
    a.__enter__()
    b.__enter__()
    with pytest.raises(RuntimeError, match="exit scopes innermost first"):
        a.__exit__(None, None, None)
    assert jd.get_strategy() is s  # b is still open
    b.__exit__(None, None, None)
    assert not jd.has_strategy()
    with other.scope():  # no "Mixing different tf.distribute.Strategy objects"
        assert jd.get_strategy() is other
    # TF exits silently and is in its default state after a's exit already
    answer = tf("fuzz.scope_exit_out_of_order_same")
    assert answer["exit_a"] == "ok" and answer["exit_b_probe"]["has_strategy"] is False


def test_scope_exit_in_another_thread_or_twice_is_clear():
    import threading

    s = mirrored(2)
    sc = s.scope()
    sc.__enter__()
    errors = []
    t = threading.Thread(target=lambda: errors.append(_exit_error(sc)))
    t.start()
    t.join()
    assert "different thread or context" in errors[0]
    sc2 = s.scope()
    with pytest.raises(RuntimeError, match="exited more times than it was entered"):
        sc2.__exit__(None, None, None)
    assert jd.get_strategy() is s  # still open here: it exits where it was entered
    sc.__exit__(None, None, None)
    assert not jd.has_strategy()


def _exit_error(sc):
    try:
        sc.__exit__(None, None, None)
    except RuntimeError as e:
        return str(e)
    return "no error"


def test_hand_built_replica_context_matches_tf():
    answer = tf("fuzz.handbuilt_replica_context")
    for what in ("all_reduce", "merge_call", "all_gather"):
        assert answer[what].startswith("error:RuntimeError: Mismatching")
    ctx = jd.ReplicaContext(mirrored(4), 0)
    assert ctx.replica_id_in_sync_group == answer["replica_id_in_sync_group"]["value"] == 0
    assert ctx.num_replicas_in_sync == answer["num_replicas_in_sync"] == 4


def test_wrong_number_of_components_tf_has_no_one_rule():
    answer = tf("fuzz.components_2_on_4")
    # TF sums (reduce, reduce_to) or lists (experimental_local_results) whatever is there,
    # and fails with an IndexError in gather, batch_reduce_to and run: jaxdist raises the
    # same ValueError everywhere (the CLEAR rows above)
    assert answer["reduce"]["value"] == [2.0, 2.0, 2.0]
    assert "IndexError" in answer["run"] and "IndexError" in answer["gather"]


def test_from_stacked_still_takes_stacked_arrays():
    v = jd.PerReplica.from_stacked(jnp.arange(8.0).reshape(8, 1))
    assert S8.reduce("SUM", v, axis=None).tolist() == [28.0]
    assert jd.Mirrored.from_stacked(np.ones((2, 3))).values[1].shape == (3,)


class _Counting:
    """An endless source that counts how many elements were read."""

    def __init__(self):
        self.pulled = 0

    def __iter__(self):
        while True:
            self.pulled += 1
            yield np.full((4, 2), float(self.pulled), np.float32)


def test_endless_dataset_with_a_huge_buffer_yields_the_first_batch_at_once():
    s = mirrored(2)
    source = _Counting()
    options = jd.InputOptions(experimental_per_replica_buffer_size=10**7)
    it = iter(s.experimental_distribute_dataset(source, options))
    first = next(it)  # before the fix: never returned (the buffer filled first)
    assert s.experimental_local_results(first)[0].tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert source.pulled <= 6
    for _ in range(10):
        next(it)
    assert source.pulled <= 6 + 2 * 10  # the buffer fills as the loop advances
    assert tf("fuzz.endless_big_buffer")["first_under_60s"] is True


# -- section 3 -----------------------------------------------------------------------------------


def test_kept_replica_context_is_clear_and_tf_raises_too():
    answer = tf("fuzz.stale_replica_context")
    for what in ("all_reduce", "merge_call", "in_tf_function"):
        assert answer[what].startswith("error:RuntimeError")
    # TF's kept context still answers its replica id (0): jaxdist traces one context for
    # every replica, so it has no id after run (a CLEAR row; notebook 03 lists it)
    assert answer["replica_id_in_sync_group"]["value"] == 0


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_zero_row_values_are_ordinary(n):
    s = mirrored(n)
    z = s.run(lambda x: x * 2, args=(jnp.zeros((0, 4)),))
    assert s.gather(z, axis=0).shape == (0, 4)
    assert s.reduce("MEAN", z, axis=None).shape == (0, 4)
    out = s.run(lambda: rc().all_gather(jnp.zeros((0, 2)), axis=1))
    assert s.experimental_local_results(out)[0].shape == (0, 2 * n)
    out = s.run(lambda: rc().all_reduce("SUM", jnp.zeros((0, 2))))
    assert s.experimental_local_results(out)[0].shape == (0, 2)


def test_attribute_probes_only_raise_attribute_error():
    v = per_replica(S2)
    mapped = jax.tree.map(lambda a: "x", v)
    assert not hasattr(mapped, "values")
    with pytest.raises(TypeError, match="holds a str where its stacked array"):
        _ = mapped.values  # still a TypeError for code that catches that
    m = jax.tree.map(lambda a: "x", jd.Mirrored.from_stacked(jnp.ones((2, 3))))
    assert not hasattr(m, "shape") and not hasattr(m, "dtype")

    @typing.runtime_checkable
    class HasValues(typing.Protocol):
        values: typing.Any

    # the probe orbax's restore makes; Python 3.12+ looks protocol members up statically
    # (inspect.getattr_static: the property exists on the class), so there it is True
    assert isinstance(mapped, HasValues) is (sys.version_info >= (3, 12))
    assert isinstance(v, HasValues)


def test_per_replica_still_takes_numbers_strings_and_ragged_shapes():
    assert [float(x) for x in jd.PerReplica((1.0, 2.0)).values] == [1.0, 2.0]
    assert jd.PerReplica(("a", "b")).values == ("a", "b")
    ragged = jd.PerReplica((jnp.ones((2, 3)), jnp.ones((1, 3))))
    assert S2.reduce("SUM", ragged, axis=0).tolist() == [3.0, 3.0, 3.0]


def test_tf_answers_for_the_clear_rows():
    answer = tf("fuzz.mixed_dtype_and_shapes")
    assert "InvalidArgumentError" in answer["mixed_dtype_reduce"]
    assert "Shape mismatch" in answer["mixed_shape_all_reduce"]
    assert answer["run_kwargs_int_key"] == "error:TypeError: keywords must be strings"
    assert answer["per_replica_batch_size_str"].startswith("error:TypeError")
    assert "AttributeError" in answer["nested_reduce"]
    assert "AttributeError" in answer["mismatched_structures_reduce"]


# -- section 6 -----------------------------------------------------------------------------------


def test_cross_replica_context_in_default_merge_fn_is_the_default_strategy():
    answer = tf("fuzz.merge_fn_contexts")
    assert answer["default_cross_ctx"] == "_DefaultDistributionStrategy"
    assert answer["default_cross_ctx_is_strategy"] is True
    got = rc().merge_call(lambda s: jd.get_cross_replica_context() is s)
    assert got is True and not jd.has_strategy()
    s = mirrored(2)
    out = s.run(lambda: rc().merge_call(lambda st: jd.get_cross_replica_context() is st))
    assert out is True and answer["s2_cross_ctx"] is True


class Boom(Exception):
    pass


def _raiser():
    raise Boom("from the replica fn")


@pytest.mark.parametrize("n", [1, 2, 4])
def test_call_for_each_replica_in_merge_fn_runs_on_every_replica(n):
    s = mirrored(n)

    def merge_fn(st, v):
        return st.extended.call_for_each_replica(
            lambda u: rc().all_reduce("SUM", u) * 10 + rc().replica_id_in_sync_group, args=(v,)
        )

    x = per_replica(s, lambda i: jnp.float32(1.0))
    out = s.run(lambda u: rc().merge_call(merge_fn, args=(u,)), args=(x,))
    assert [float(v) for v in s.experimental_local_results(out)] == [10.0 * n + i for i in range(n)]
    jitted = jax.jit(lambda u: s.run(lambda w: rc().merge_call(merge_fn, args=(w,)), args=(u,)))
    assert [float(v) for v in s.experimental_local_results(jitted(x))] == [
        10.0 * n + i for i in range(n)
    ]
    if n == 2:  # TF: the per-replica ids, as a PerReplica unpacked for each replica
        answer = tf("fuzz.merge_fn_contexts")["s2_cfer"]
        ids = s.run(
            lambda: rc().merge_call(
                lambda st: st.extended.call_for_each_replica(lambda: rc().replica_id_in_sync_group)
            )
        )
        assert [int(v) for v in s.experimental_local_results(ids)] == [
            item["value"] for item in answer["items"]
        ]


def test_call_for_each_replica_in_merge_fn_raises_the_replica_fns_exception():
    answer = tf("fuzz.merge_fn_contexts")
    assert (
        answer["s2_cfer_raises"]
        == answer["default_cfer_raises"]
        == ("error:Boom: from the replica fn")
    )
    with pytest.raises(Boom):
        mirrored(2).run(
            lambda: rc().merge_call(lambda st: st.extended.call_for_each_replica(_raiser))
        )
    with pytest.raises(Boom):
        rc().merge_call(lambda st: st.extended.call_for_each_replica(_raiser))
    assert (
        rc().merge_call(lambda st: st.extended.call_for_each_replica(lambda: 3.0))
        == (tf("fuzz.merge_fn_contexts")["default_cfer"]["value"])
    )


def test_make_dataset_iterator_and_initialize_as_tf1():
    s = mirrored(4)
    it = s.make_dataset_iterator([np.arange(8)])
    answer = tf("tf1.make_dataset_iterator")["result"]
    assert type(it).__name__ == answer["it_type"] == "DatasetIterator"
    want = [v["value"] for v in answer["get_next"]["values"]]
    assert [x.tolist() for x in s.experimental_local_results(it.get_next())] == want
    with pytest.raises(jd.errors.OutOfRangeError):
        it.get_next()
    assert it.initialize() is None  # TF's eager initialize: back to the start
    assert [x.tolist() for x in s.experimental_local_results(next(it))] == want
    assert it.initializer is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        out = s.experimental_run(lambda x: x * 2, it)
    answer = tf("tf1.experimental_run_make_dataset_iterator")["result"]
    assert [x.tolist() for x in s.experimental_local_results(out)] == [
        v["value"] for v in answer["values"]
    ]


def test_fetch_to_device_false_keeps_values_on_the_host_as_tf():
    answer = tf("fuzz.fetch_to_device_false")
    host = "/job:localhost/replica:0/task:0/device:CPU:0"
    assert answer["dataset"] == answer["dsfn"] == [host, host]
    s = mirrored(2)
    o = jd.InputOptions(experimental_fetch_to_device=False)
    a = next(iter(s.experimental_distribute_dataset([np.arange(8.0).reshape(4, 2)], o)))
    b = next(iter(s.distribute_datasets_from_function(lambda c: [np.arange(2.0)], o)))
    for v in (a, b):
        assert all(isinstance(p, np.ndarray) for p in s.experimental_local_results(v))
    out = s.run(lambda v: v * 2, args=(a,))  # run moves them to the replicas, as TF's
    assert [x.devices() for x in s.experimental_local_results(out)] == [
        {d} for d in s.extended.replicas.devices
    ]


# -- leak: every public method, odd arguments ----------------------------------------------------

CLEAR = (TypeError, ValueError, RuntimeError, NotImplementedError)
LEAKS = (NameError, IndexError, KeyError, AssertionError, ZeroDivisionError, UnboundLocalError)
INTERNAL_TEXT = (
    "could not broadcast", "entry not a", "unbound axis name", "Cannot lower jaxpr",
    "Input buffers to `Array`", "incompatible shapes for broadcasting", "object has no attribute",
)  # fmt: skip


def _odd_arguments(s):
    wrong = jd.PerReplica((X,) * (s.num_replicas_in_sync + 1))
    zero = s.run(lambda x: x * 2, args=(jnp.zeros((0, 4)),))  # a replica with no examples
    mapped = jax.tree.map(lambda a: "x", per_replica(s))  # a tree.map that gave no arrays
    odd = [(), (None,), ("x",), (-1,), (object(),), ({"a": [1]},), (jnp.float32(1.0),)]
    odd += [(float("nan"), None), ("MEAN", jnp.ones((2, 0)), 0), (lambda: 1, (1,), {"k": 1})]
    for v in (wrong, zero, mapped):
        odd += [(v,), (v, 0), (v, None), ("SUM", v), ("SUM", v, None), ("SUM", v, "/cpu:0")]
    return odd


def _public_members(obj):
    """(name, call) for every public method, and every property (read, no arguments)."""
    for name in sorted(dir(obj)):
        attr = getattr(type(obj), name, None)
        if name.startswith("_") or isinstance(attr, type):
            continue
        if isinstance(attr, property):
            yield name, (lambda name=name: getattr(obj, name)), False
        elif callable(attr):
            yield name, getattr(obj, name), True


class _Hang(BaseException):
    pass


def _alarm(signum, frame):
    raise _Hang


HANG_S = 20  # a probe still running after this long is a hang (a bad call fails at once)


def _probe(target, name, call, args):
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, HANG_S)
    try:
        _call(target, name, call, args)
    except _Hang:
        pytest.fail(f"{target}.{name}{args!r} did not return within {HANG_S}s (a hang)")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _call(target, name, call, args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            call(*args)
        except CLEAR as e:  # the house convention (TF's classes where TF names one)
            if isinstance(e, LEAKS):
                pytest.fail(f"{target}.{name}{args!r} leaked {type(e).__name__}: {e}")
            leaked = [t for t in INTERNAL_TEXT if t in str(e)]
            assert not leaked, f"{target}.{name}{args!r}: internal text {leaked}: {e}"
        except Exception as e:  # any other class is a leak, whatever its text
            pytest.fail(f"{target}.{name}{args!r} raised {type(e).__name__}, not one of "
                        f"{[c.__name__ for c in CLEAR]}: {e}")  # fmt: skip
    assert not jd.has_strategy(), f"{target}.{name}{args!r} left a strategy current"


SKIP = {"scope"}  # returns a context manager without entering it: nothing to probe


TARGETS = [
    "strategy",
    "extended",
    "replica_context",
    "kept_replica_context",
    "iterator",
    "dataset",
    "reduction_to_one_device",
    "nccl_all_reduce",
    "input_context",
    "per_replica",
    "mirrored",
    "default_strategy",
]


@pytest.mark.parametrize("target", TARGETS)
def test_public_methods_never_leak_internal_errors(target):
    s = mirrored(2)
    kept = []
    s.run(lambda: kept.append(rc()))
    obj = {
        "strategy": s,
        "extended": s.extended,
        "replica_context": jd.ReplicaContext(s, 0),
        "kept_replica_context": kept[0],
        "iterator": iter(s.experimental_distribute_dataset([np.ones((4, 2))] * 3)),
        "dataset": s.experimental_distribute_dataset([np.ones((4, 2))] * 3),
        "reduction_to_one_device": jd.ReductionToOneDevice(),
        "nccl_all_reduce": jd.NcclAllReduce(),
        "input_context": jd.InputContext(1, 0, 2),
        "per_replica": per_replica(s),
        "mirrored": s.extended.broadcast_to(jnp.ones(3)),
        "default_strategy": jd.get_strategy(),
    }
    probed = 0
    for name, call, takes_args in _public_members(obj[target]):
        if name in SKIP:
            continue
        for args in _odd_arguments(s) if takes_args else [()]:
            probed += 1
            _probe(target, name, call, args)
    assert probed > 10
