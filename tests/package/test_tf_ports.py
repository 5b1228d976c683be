"""What ports of TF's own distribute tests and tutorials need (issue 12), with TF's answers.

TF 2.21's answers: tests/tf_oracle/answers.json (ids named in each test).
"""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import devices_of, mirrored

import jaxdist as jd

ANSWERS = json.loads((pathlib.Path(__file__).parents[1] / "tf_oracle" / "answers.json").read_text())


def tf(case):
    return ANSWERS[case]["result"]


# -- experimental_local_results of what run returns (local_results_run.*) -----------------


def test_local_results_of_plain_results_like_tf(strategy):
    n = strategy.num_replicas_in_sync
    for kind, fn in (
        ("dict", lambda: {"a": 1.0}),
        ("tuple", lambda: (1.0, 2.0)),
        ("int", lambda: 3),
    ):
        out = strategy.run(fn)
        local = strategy.experimental_local_results(out)
        if n in (1, 2, 4):
            answer = tf(f"local_results_run.{kind}_{n}r")
            assert len(local) == answer["len"]
        expected = (fn(),) * n if kind != "int" else (3,)
        assert local == expected
    t = jnp.array([1.0, 2.0])
    out = strategy.run(lambda: t)
    assert out is t and strategy.experimental_local_results(out) == (t,)  # captured_tensor_*


# -- mixing strategies (mixing.*) ---------------------------------------------------------------


def test_another_strategys_methods_inside_a_scope_raise_like_tf():
    a, b = mirrored(2), jd.MirroredStrategy(["/cpu:2", "/cpu:3"])
    pa = a.experimental_distribute_values_from_function(
        lambda c: jnp.float32(c.replica_id_in_sync_group)
    )
    answers = tf("mixing.mirrored_A_in_B_scope")
    calls = {
        "A.reduce(SUM, pa, None)": lambda: a.reduce("SUM", pa, None),
        "A.extended.reduce_to(SUM, pa, pa)": lambda: a.extended.reduce_to("SUM", pa, pa),
        "A.extended.batch_reduce_to(SUM, [(pa, pa)])": lambda: a.extended.batch_reduce_to(
            "SUM", [(pa, pa)]
        ),
        "A.extended.broadcast_to(tf.constant(1.), pa)": lambda: a.extended.broadcast_to(1.0, pa),
        "A.gather(pa_vec, 0)": lambda: a.gather(pa, 0),
        "A.run(lambda: rc().replica_id_in_sync_group)": lambda: a.run(lambda: 0),
        "A.experimental_distribute_dataset(range(8).batch(4)) + first step": lambda: (
            a.experimental_distribute_dataset([np.arange(4)])
        ),
        "A.scope() entry": lambda: a.scope().__enter__(),
    }
    with b.scope():
        for name, call in calls.items():
            assert answers[name].startswith("error:RuntimeError: Mixing different")
            with pytest.raises(
                RuntimeError, match="Mixing different tf.distribute.Strategy objects"
            ):
                call()
        with pytest.raises(RuntimeError, match="Mixing different"):
            with pytest.warns(DeprecationWarning):  # a TF1 method (gone in TF 2)
                a.experimental_make_numpy_dataset(np.arange(4.0))
        # As TF: these two work inside another strategy's scope.
        assert len(a.experimental_local_results(pa)) == 2
        v = a.experimental_distribute_values_from_function(lambda c: c.replica_id_in_sync_group)
        assert [int(x) for x in v.values] == [0, 1]
    with pytest.raises(RuntimeError, match="Mixing different"):
        b.run(lambda: a.run(lambda: 1.0))  # mixing.A_run_inside_B_run


# -- scope objects (scope_reuse.*) -----------------------------------------------------------


@pytest.mark.parametrize("make", [lambda: mirrored(2), lambda: jd.OneDeviceStrategy("/cpu:0")])
def test_a_scope_object_can_be_entered_again_and_nested(make):
    s = make()
    sc = s.scope()
    with sc as x:
        assert x is s and jd.get_strategy() is s
    assert not jd.has_strategy()
    with sc:  # TF raised AttributeError here (and left the strategy current)
        with sc:
            assert jd.get_strategy() is s
        assert jd.has_strategy() and jd.in_cross_replica_context()  # after_inner_exit
    assert not jd.has_strategy()  # after_outer
    answer = tf("scope_reuse.mirrored_nested_same_object")
    assert answer["after_inner_exit"]["has_strategy"] is True


def test_the_default_strategys_scope_changes_nothing():
    d = jd.get_strategy()
    with d.scope() as x:
        assert x is d and not jd.has_strategy() and not jd.in_cross_replica_context()
    assert tf("scope_reuse.default_strategy_scope_twice")["first"]["has_strategy"] is False


# -- merge_call from the default replica context (merge_default.*) ---------------------------


def test_merge_fn_of_the_default_replica_context():
    seen = {}

    def merge_fn(strategy, *args):
        seen.update(
            has_strategy=jd.has_strategy(),
            in_cross_replica_context=jd.in_cross_replica_context(),
            get_replica_context_is_None=jd.get_replica_context() is None,
            first_arg_is_default=strategy is jd.get_strategy(),
            num_replicas_in_sync=strategy.num_replicas_in_sync,
            args=args,
        )
        return args[0] * 2

    out = jd.get_replica_context().merge_call(merge_fn, args=(3.0,))
    inside = tf("merge_default.no_args")["inside"]
    for key in (
        "has_strategy",
        "in_cross_replica_context",
        "get_replica_context_is_None",
        "num_replicas_in_sync",
    ):
        assert seen[key] == inside[key], key
    assert seen["first_arg_is_default"] and seen["args"] == (3.0,) and out == 6.0
    after = tf("merge_default.after_merge")
    assert jd.has_strategy() == after["has_strategy"]
    assert jd.in_cross_replica_context() == after["in_cross_replica_context"]


# -- Mirrored is usable as an array, PerReplica is not (mirrored_as_tensor.*) ----------------


def test_mirrored_values_read_their_local_component(strategy):
    n = strategy.num_replicas_in_sync
    per = strategy.experimental_distribute_values_from_function(lambda c: jnp.float32(1.5))
    m = strategy.extended.reduce_to("SUM", per, per) if n > 1 else jd.Mirrored((jnp.float32(1.5),))
    total = 1.5 * n
    assert float(m + 1) == total + 1 and float(1 + m) == total + 1 and float(-m) == -total
    assert (
        float(m * m) == total * total and bool(m > 1) and m.shape == () and m.dtype == jnp.float32
    )
    assert float(jnp.asarray(m)) == total and float(jnp.sum(m)) == total
    assert float(jnp.maximum(m, 0.0)) == total and float(np.asarray(m)) == total
    with pytest.raises(TypeError):
        float(m)  # mirrored_scalar_eager: float(x) is a TypeError in TF too
    if n > 1:  # inside run, a captured Mirrored is each replica's component (in_run_replica_ctx)
        out = strategy.run(lambda: m + 1)
        assert [float(x) for x in out.values] == [total + 1] * n


def test_perreplica_values_are_not_arrays():
    s = mirrored(2)
    pr = s.experimental_distribute_values_from_function(
        lambda c: jnp.float32(c.replica_id_in_sync_group)
    )
    answers = tf("mirrored_as_tensor.perreplica_scalar_eager")
    for name, call in {"x + 1": lambda: pr + 1, "1 + x": lambda: 1 + pr, "-x": lambda: -pr}.items():
        assert answers[name].startswith("error:TypeError")
        with pytest.raises(TypeError):
            call()
    for call in (lambda: jnp.asarray(pr), lambda: np.asarray(pr), lambda: len(pr)):
        with pytest.raises(TypeError):
            call()
    assert not hasattr(pr, "shape")


# -- colocate_vars_with a value built inside the scope (colocate_vars_with.*) ----------------


def test_colocate_vars_with_a_user_built_value(strategy):
    n = strategy.num_replicas_in_sync
    with strategy.scope():
        anchor = jd.PerReplica(tuple(jnp.zeros(2) for _ in range(n)))  # all on the default device
        with strategy.extended.colocate_vars_with(anchor):
            v = strategy.experimental_distribute_values_from_function(lambda c: jnp.ones(2))
    assert list(devices_of(v)) == list(strategy.extended.replicas.devices)


def test_colocate_vars_with_a_value_on_other_devices():
    s = mirrored(2)
    other = jd.MirroredStrategy(["/cpu:6", "/cpu:7"])
    anchor = other.extended.broadcast_to(jnp.zeros(()))
    with s.scope(), s.extended.colocate_vars_with(anchor):
        v = s.extended.broadcast_to(jnp.ones(()))
    assert [d.id for d in devices_of(v)] == [6, 7]
    with pytest.raises(TypeError, match="colocate_vars_with takes a distributed value"):
        s.extended.colocate_vars_with("/cpu:3")


# -- distributed values are ordinary pytrees ----------------------------------------------


def test_every_tree_idiom_works_on_distributed_values(strategy):
    n = strategy.num_replicas_in_sync
    state = strategy.run(
        lambda: {"w": jnp.ones((2, 3)) * jd.get_replica_context().replica_id_in_sync_group}
    )
    nones = jax.tree.map(lambda x: None, state)
    assert jax.tree.structure(nones).num_leaves == 0
    shapes = jax.eval_shape(lambda t: t, state)
    assert jax.tree.structure(shapes) == jax.tree.structure(state)
    leaf = jax.tree.leaves(shapes)[0]
    assert leaf.shape == ((n, 2, 3) if n > 1 else (2, 3))
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(state)]
    assert paths == (["['w'].stacked"] if n > 1 else ["['w']"])
    doubled = jax.tree.map(lambda x: 2 * x, state)
    assert [np.asarray(x).tolist() for x in strategy.experimental_local_results(doubled["w"])] == [
        [[2.0 * r] * 3] * 2 for r in range(n)
    ]
    if n > 1:
        assert [v.shape for v in shapes["w"].values] == [(2, 3)] * n


# -- broadcast_to and values_from_function take any pytree ----------------------------------


def test_broadcast_to_and_values_from_function_take_pytrees(strategy):
    n = strategy.num_replicas_in_sync
    m = strategy.extended.broadcast_to({"w": jnp.ones(2), "b": (jnp.zeros(()), 3.0)})
    assert set(m) == {"w", "b"} and isinstance(m["b"], tuple) and len(m["b"]) == 2
    kind = jd.Mirrored if n > 1 else jax.Array
    assert all(
        isinstance(x, kind)
        for x in jax.tree.leaves(m, is_leaf=jd.DistributedValues.__instancecheck__)
    )
    v = strategy.experimental_distribute_values_from_function(
        lambda c: (jnp.ones(2) * c.replica_id_in_sync_group, {"k": c.replica_id_in_sync_group})
    )
    assert isinstance(v, tuple) and set(v[1]) == {"k"}
    assert [int(x) for x in strategy.experimental_local_results(v[1]["k"])] == list(range(n))


# -- found by porting TF's unit tests and tutorials a second time -------------------------------


def test_the_default_strategy_hands_values_from_function_back_as_they_are():
    s = jd.get_strategy()
    v = s.experimental_distribute_values_from_function(lambda ctx: jnp.ones(2) * 3)
    assert not isinstance(v, jd.DistributedValues)  # TF: a plain tensor
    np.testing.assert_array_equal(s.run(lambda x: x + 1, args=(v,)), [4.0, 4.0])
    step = jax.jit(lambda v: s.run(lambda x: jd.get_replica_context().all_reduce("SUM", x), (v,)))
    np.testing.assert_array_equal(step(v), [3.0, 3.0])


def test_the_default_strategys_run_inside_merge_fn_is_in_a_replica_context():
    def inner():
        ctx = jd.get_replica_context()
        return ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync, jd.has_strategy()

    def merge_fn(strategy):
        return strategy.extended.call_for_each_replica(inner), strategy.run(inner)

    out = jd.get_replica_context().merge_call(merge_fn)
    assert out == ((0, 1, False), (0, 1, False))  # TF's default ReplicaContext(0)


def test_reading_an_iterator_while_jax_traces_is_a_clear_error(strategy):
    n = strategy.num_replicas_in_sync
    data = [np.full((2 * n, 2), i, np.float32) for i in range(3)]
    it = iter(strategy.experimental_distribute_dataset(data))
    read = jax.jit(lambda: strategy.run(jnp.sum, args=(it.get_next(),)))
    for call in (read, jax.jit(lambda: it.get_next_as_optional()), jax.jit(lambda: next(it))):
        with pytest.raises(RuntimeError, match="read while JAX was tracing"):
            call()
    first = strategy.experimental_local_results(next(it))  # nothing consumed, no tracer kept
    assert [float(x.sum()) for x in first] == [0.0] * n
    dist = strategy.experimental_distribute_dataset(data)
    with pytest.raises(RuntimeError, match="pass the batch in"):
        jax.jit(lambda: [strategy.run(jnp.sum, args=(x,)) for x in dist])()


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("outer_jit", [False, True], ids=["eager", "jit"])
def test_a_jitted_replica_fn_with_collectives_on_a_partial_batch(n, outer_jit):
    s = mirrored(n)
    data = np.arange(2 * n - 1, dtype=np.float32)  # TF's split: [2, ..., 2, 1]
    (x,) = s.experimental_distribute_dataset([data])

    @jax.jit
    def step(x):
        ctx = jd.get_replica_context()
        total = ctx.all_reduce("SUM", jnp.sum(x))
        gathered = ctx.all_gather(x, axis=0)
        merged = ctx.merge_call(lambda st, v: st.reduce("SUM", v, axis=None), args=(x.sum(),))
        return total, gathered, merged

    run = (
        (lambda x: s.run(step, args=(x,)))
        if not outer_jit
        else jax.jit(lambda x: s.run(step, (x,)))
    )
    total, gathered, merged = run(x)
    assert [float(t) for t in s.experimental_local_results(total)] == [data.sum()] * n
    for g in s.experimental_local_results(gathered):
        np.testing.assert_array_equal(g, data)
    assert float(merged) == data.sum()


def test_a_collective_inside_lax_cond_of_a_partial_batch_step_is_the_full_batch_answer():
    s = mirrored(2)
    (x,) = s.experimental_distribute_dataset([np.arange(3, dtype=np.float32)])  # [2, 1]

    def step(x):
        ctx = jd.get_replica_context()
        # a traced predicate: lax.cond traces both branches inside the step's trace
        return jax.lax.cond(
            jnp.sum(x) > 0, lambda: ctx.all_reduce("SUM", jnp.sum(x)), lambda: jnp.float32(0)
        )

    for run in (lambda x: s.run(step, (x,)), jax.jit(lambda x: s.run(step, (x,)))):
        assert [float(v) for v in s.experimental_local_results(run(x))] == [3.0] * 2
    (full,) = s.experimental_distribute_dataset([np.arange(4, dtype=np.float32)])
    assert [float(v) for v in s.experimental_local_results(s.run(step, (full,)))] == [6.0] * 2


def test_a_hand_built_perreplica_on_its_devices_goes_into_jax_jit(strategy):
    n = strategy.num_replicas_in_sync
    devices = jax.devices()[:n]  # the strategy's devices (conftest: /cpu:0..n-1)
    p = jd.PerReplica(tuple(jax.device_put(jnp.float32(i + 1), d) for i, d in enumerate(devices)))
    assert [v.devices() for v in p.values] == [{d} for d in devices]  # each stays where it was
    want = n * (n + 1) / 2
    assert float(jax.jit(lambda p: strategy.reduce("SUM", p, axis=None))(p)) == want
    assert float(strategy.reduce("SUM", p, axis=None)) == want
    out = jax.jit(lambda p: strategy.run(lambda v: v * 2, args=(p,)))(p)
    assert [float(v) for v in strategy.experimental_local_results(out)] == [
        2.0 * (i + 1) for i in range(n)
    ]


def test_a_perreplica_whose_components_share_a_device_as_destinations():
    s = mirrored(2)
    p = jd.PerReplica((jnp.ones(3), jnp.ones(3) * 2))  # both on the default device
    for out in (
        s.extended.reduce_to(jd.ReduceOp.SUM, p, p),
        s.extended.batch_reduce_to(jd.ReduceOp.SUM, [(p, p)])[0],
    ):
        assert isinstance(out, jd.Mirrored) and len(out.values) == 2  # TF: a Mirrored of 2
        for v in out.values:
            np.testing.assert_array_equal(v, [3.0, 3.0, 3.0])
    b = s.extended.broadcast_to(jnp.ones(2), p)
    assert isinstance(b, jd.Mirrored) and [v.tolist() for v in b.values] == [[1.0, 1.0]] * 2


def test_dataset_function_cardinality_is_the_datasets_as_in_tf(strategy):
    r = strategy.num_replicas_in_sync
    batched = strategy.distribute_datasets_from_function(
        lambda ctx: [np.arange(64)[i : i + 2] for i in range(0, 64, 2)]
    )
    assert batched.cardinality == 32 and len(batched) == sum(1 for _ in batched) == -(-32 // r)
    scalars = strategy.distribute_datasets_from_function(
        lambda c: [np.float32(i) for i in range(10)]
    )
    assert scalars.cardinality == 10 and len(scalars) == sum(1 for _ in scalars) == 10 // r


# -- found by composing jaxdist with the rest of JAX ----------------------------------------------


def test_typed_prng_keys_are_values_like_any_other(strategy):
    n = strategy.num_replicas_in_sync
    keys = strategy.experimental_distribute_values_from_function(
        lambda c: jax.random.fold_in(jax.random.key(0), c.replica_id_in_sync_group)
    )
    out = strategy.run(lambda k: jax.random.normal(k, (3,)), args=(keys,))
    want = [jax.random.normal(jax.random.fold_in(jax.random.key(0), i), (3,)) for i in range(n)]
    for got, w in zip(strategy.experimental_local_results(out), want):
        np.testing.assert_allclose(got, w)
    same = strategy.run(lambda k: jax.random.normal(k, (3,)), args=(jax.random.key(0),))
    assert len(strategy.experimental_local_results(same)) == n
    split = jax.jit(lambda k: strategy.run(lambda k: jax.random.split(k)[0], args=(k,)))
    for k in (jax.random.key(0), keys):
        (first, *_) = strategy.experimental_local_results(split(k))
        assert jax.dtypes.issubdtype(first.dtype, jax.dtypes.prng_key)


def test_tree_map_to_non_arrays_gives_a_printable_value_and_a_clear_error(strategy):
    n = strategy.num_replicas_in_sync
    for rows in (2 * n, 2 * n - 1):  # a full and (from 2 replicas) a partial batch
        (x,) = strategy.experimental_distribute_dataset([np.ones((rows, 2), np.float32)])
        out = strategy.run(lambda v: v * 2, args=(x,))
        if n == 1:  # one replica: run returns a plain array, mapped as one
            assert isinstance(out, jax.Array) and np.asarray(out).tolist() == [[2.0, 2.0]] * rows
            assert jax.tree.map(lambda a: a.shape, out) == (rows, 2)
            assert jax.tree.map(lambda a: None, out) is None
            continue
        shapes = jax.tree.map(lambda a: a.shape, out)
        assert repr(shapes).startswith("PerReplica(") and f"({n}, " in repr(shapes)
        with pytest.raises(TypeError, match="experimental_local_results"):
            _ = shapes.values
        assert "None" in repr(jax.tree.map(lambda a: None, out))
        per_replica = jax.tree.map(lambda a: a.shape, strategy.experimental_local_results(out))
        assert sum(s[0] for s in per_replica) == rows


def test_one_device_values_from_function_are_committed_so_a_jitted_step_traces_once():
    s = jd.OneDeviceStrategy("/cpu:3")
    traces = []

    def step(w, x):
        traces.append(1)
        return w + x.sum()

    w = s.experimental_distribute_values_from_function(lambda c: jnp.ones(3))
    assert w.devices() == {jax.devices()[3]} and w.committed
    update = jax.jit(lambda w, x: s.run(step, args=(w, x)), donate_argnums=0)
    for x in s.experimental_distribute_dataset([np.ones(4, np.float32)] * 5):
        w = update(w, x)
    assert len(traces) == 1 and w.tolist() == [21.0] * 3


def test_end_of_data_raises_tfs_error_classes(strategy):
    """TF: get_next() past the end is OutOfRangeError, an empty optional's get_value() is
    InvalidArgumentError; jaxdist's subclass StopIteration / ValueError (Python's protocol)."""
    n = strategy.num_replicas_in_sync
    it = iter(strategy.experimental_distribute_dataset([np.ones((n, 2), np.float32)]))
    it.get_next()
    with pytest.raises(jd.errors.OutOfRangeError):
        it.get_next()
    with pytest.raises(StopIteration):
        next(it)
    assert next(it, "end") == "end"
    empty = it.get_next_as_optional()
    assert not empty.has_value()
    with pytest.raises(jd.errors.InvalidArgumentError):
        empty.get_value()
    assert issubclass(jd.errors.InvalidArgumentError, ValueError)


@pytest.mark.parametrize(
    "make", [lambda: mirrored(2), lambda: jd.OneDeviceStrategy("/cpu:0"), jd.get_strategy]
)
def test_extended_flags_as_tf_on_one_worker(make):
    e = make().extended
    assert e.experimental_between_graph is False and e.experimental_require_static_shapes is False
    assert e.experimental_should_init and e.should_checkpoint and e.should_save_summary
