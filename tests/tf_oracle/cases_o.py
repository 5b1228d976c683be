# TF oracle, batch O (issue 20): the fuzz's odd calls. Scopes exited out of order, a hand-built ReplicaContext,
# a ReplicaContext kept past its run, DistributedValues with the wrong number of components, zero-row values,
# mixed dtypes/shapes across replicas, nested PerReplica, merge_fn contexts, call_for_each_replica in a merge_fn,
# experimental_fetch_to_device=False placement, a huge per_replica_buffer_size on an endless dataset.
# Run:  /work/tfvenv/bin/python tests/tf_oracle/cases_o.py      (merges into tests/tf_oracle/answers.json;
#       set TF_ORACLE_OUT=/tmp/x.json to write elsewhere), then python3 tests/tf_oracle/gen_md.py
import os, sys, time, subprocess, textwrap
HERE = os.path.dirname(os.path.abspath(__file__)); sys.path.insert(0, HERE)
from common import *
OUT = os.environ.get("TF_ORACLE_OUT", os.path.join(HERE, "answers.json"))
rc = tf.distribute.get_replica_context
s4 = tf.distribute.MirroredStrategy(DEVS)
s2 = tf.distribute.MirroredStrategy(DEVS[:2])
x = tf.ones(3)

def attempt(fn):
    try:
        return enc(fn())
    except Exception as e:
        return errstr(e)

# ---------------- wrong number of components
p2 = V.PerReplica((x, x))
@case("fuzz.components_2_on_4", "p=PerReplica((x, x)) given to a 4-replica MirroredStrategy's methods")
def _():
    return {
        "reduce": attempt(lambda: s4.reduce(SUM, p2, axis=None)),
        "gather": attempt(lambda: s4.gather(p2, axis=0)),
        "experimental_local_results": attempt(lambda: s4.experimental_local_results(p2)),
        "reduce_to": attempt(lambda: s4.extended.reduce_to(SUM, p2, "/cpu:0")),
        "batch_reduce_to": attempt(lambda: s4.extended.batch_reduce_to(SUM, [(p2, "/cpu:0")])),
        "run": attempt(lambda: s4.run(lambda v: v * 2, args=(p2,))),
    }
@case("fuzz.other_strategy_value", "s2's PerReplica (2 components) given to s4 (4 replicas)")
def _():
    p = pr_f(s2, 1.0)
    return {"reduce": attempt(lambda: s4.reduce(SUM, p, axis=None)),
            "gather": attempt(lambda: s4.gather(s2.run(lambda: tf.ones((1,))), axis=0)),
            "local_results": attempt(lambda: s4.experimental_local_results(p)),
            "run": attempt(lambda: s4.run(lambda v: v * 2, args=(p,)))}

# ---------------- hand-built / stale replica contexts
@case("fuzz.handbuilt_replica_context", "tf.distribute.ReplicaContext(s4, 0) outside run: all_reduce, id, merge_call")
def _():
    r = tf.distribute.ReplicaContext(s4, replica_id_in_sync_group=0)
    return {"all_reduce": attempt(lambda: r.all_reduce(SUM, tf.ones(2))),
            "replica_id_in_sync_group": attempt(lambda: r.replica_id_in_sync_group),
            "num_replicas_in_sync": attempt(lambda: r.num_replicas_in_sync),
            "merge_call": attempt(lambda: r.merge_call(lambda st: 5.0)),
            "all_gather": attempt(lambda: r.all_gather(tf.ones((1, 2)), axis=0))}
@case("fuzz.stale_replica_context", "ctx kept from inside s4.run, used after run returned")
def _():
    kept = []
    s4.run(lambda: kept.append(rc()))
    r = kept[0]
    return {"all_reduce": attempt(lambda: r.all_reduce(SUM, tf.ones(2))),
            "replica_id_in_sync_group": attempt(lambda: r.replica_id_in_sync_group),
            "merge_call": attempt(lambda: r.merge_call(lambda st: 5.0)),
            "in_tf_function": attempt(lambda: tf.function(lambda: r.all_reduce(SUM, tf.ones(2)))())}

# ---------------- zero rows, mixed dtypes and shapes, nested PerReplica, bad kwargs
@case("fuzz.mixed_dtype_and_shapes", "PerReplica((f32, i32)) reduce/run; all_reduce of per-replica shapes (2,3)/(2,4); nested PerReplica")
def _():
    pm = V.PerReplica((tf.ones(2), tf.ones(2, tf.int32)))
    ps = V.PerReplica((tf.ones((2, 3)), tf.ones((2, 4))))
    pn = V.PerReplica((V.PerReplica((x, x)), x))
    return {"mixed_dtype_reduce": attempt(lambda: s2.reduce(SUM, pm, axis=None)),
            "mixed_dtype_run": attempt(lambda: s2.run(lambda v: v, args=(pm,))),
            "mixed_shape_all_reduce": attempt(lambda: s2.run(lambda v: rc().all_reduce(SUM, v), args=(ps,))),
            "mixed_shape_reduce": attempt(lambda: s2.reduce(SUM, ps, axis=None)),
            "nested_reduce": attempt(lambda: s2.reduce(SUM, pn, axis=None)),
            "nested_run": attempt(lambda: s2.run(lambda v: v, args=(pn,))),
            "mismatched_structures_reduce": attempt(lambda: s2.reduce(SUM, V.PerReplica(({"a": x}, (x,))), axis=None)),
            "run_kwargs_int_key": attempt(lambda: s2.run(lambda **k: 1, kwargs={1: 2})),
            "per_replica_batch_size_str": attempt(lambda: tf.distribute.InputContext(1, 0, 8).get_per_replica_batch_size("8"))}

# ---------------- merge_fn contexts, call_for_each_replica in a merge_fn
class Boom(Exception):
    pass
def raiser():
    raise Boom("from the replica fn")
@case("fuzz.merge_fn_contexts", "get_cross_replica_context / call_for_each_replica inside merge_fn (default and s2.run)")
def _():
    d = {}
    d["default_cross_ctx"] = attempt(lambda: type(rc().merge_call(lambda st: distribute_lib.get_cross_replica_context())).__name__)
    d["default_cross_ctx_is_strategy"] = attempt(lambda: rc().merge_call(lambda st: distribute_lib.get_cross_replica_context() is st))
    d["default_cfer"] = attempt(lambda: rc().merge_call(lambda st: st.extended.call_for_each_replica(lambda: tf.constant(3.0))))
    d["default_cfer_raises"] = attempt(lambda: rc().merge_call(lambda st: st.extended.call_for_each_replica(raiser)))
    d["s2_cfer"] = attempt(lambda: s2.experimental_local_results(s2.run(lambda: rc().merge_call(lambda st: st.extended.call_for_each_replica(lambda: rc().replica_id_in_sync_group)))))
    d["s2_cfer_raises"] = attempt(lambda: s2.run(lambda: rc().merge_call(lambda st: st.extended.call_for_each_replica(raiser))))
    d["s2_cross_ctx"] = attempt(lambda: s2.run(lambda: rc().merge_call(lambda st: distribute_lib.get_cross_replica_context() is st)))
    return d

# ---------------- input: no fetch to device, big buffer on an endless dataset
@case("fuzz.fetch_to_device_false", "experimental_fetch_to_device=False: devices of the first batch (dataset, dsfn) on s2")
def _():
    o = tf.distribute.InputOptions(experimental_fetch_to_device=False)
    a = next(iter(s2.experimental_distribute_dataset(tf.data.Dataset.range(8).batch(4), o)))
    b = next(iter(s2.distribute_datasets_from_function(lambda c: tf.data.Dataset.range(8).batch(2), o)))
    return {"dataset": [v.device for v in a.values], "dsfn": [v.device for v in b.values],
            "run_devices": [v.device for v in s2.run(lambda v: v * 2, args=(a,)).values]}
@case("fuzz.endless_big_buffer", "endless dataset (repeat()), InputOptions(experimental_per_replica_buffer_size=10**7): first batch arrives (seconds < 60?)")
def _():
    o = tf.distribute.InputOptions(experimental_per_replica_buffer_size=10 ** 7)
    t0 = time.time()
    it = iter(s2.experimental_distribute_dataset(tf.data.Dataset.range(8).repeat().batch(4), o))
    first = next(it)
    return {"first_under_60s": time.time() - t0 < 60, "first": enc(s2.experimental_local_results(first))}

# ---------------- scopes exited out of order (fresh processes: a failed exit may corrupt TF's strategy stack)
PRELUDE = textwrap.dedent("""
    import os, sys, json
    sys.path.insert(0, %r)
    from common import *
    def probe():
        return {"has_strategy": tf.distribute.has_strategy(), "strategy": type(tf.distribute.get_strategy()).__name__}
    out = {}
    def step(name, fn):
        try:
            fn(); out[name] = "ok"
        except Exception as e:
            out[name] = errstr(e)
        out[name + "_probe"] = probe()
    """ % HERE)
def isolated(body):
    src = PRELUDE + textwrap.dedent(body) + "\nprint('@@RESULT@@' + json.dumps(enc(out)))\n"
    p = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=300)
    for line in p.stdout.splitlines():
        if line.startswith("@@RESULT@@"):
            return json.loads(line[len("@@RESULT@@"):])
    raise RuntimeError("subprocess failed rc=%s: %s" % (p.returncode, p.stderr.strip().split("\n")[-1:]))
@case("fuzz.scope_exit_out_of_order_same", "a, b = s.scope(), s.scope(); enter a, enter b; exit a; exit b; probes [fresh process]")
def _():
    return isolated("""
        s = tf.distribute.MirroredStrategy(DEVS[:2]); a, b = s.scope(), s.scope()
        a.__enter__(); b.__enter__()
        step("exit_a", lambda: a.__exit__(None, None, None))
        step("exit_b", lambda: b.__exit__(None, None, None))
        o = tf.distribute.MirroredStrategy(DEVS[:4])
        step("other_strategy_scope_after", lambda: o.scope().__enter__() and None)
        """)
@case("fuzz.scope_exit_out_of_order_two", "a, b = s.scope(), t.scope() (two strategies); enter a, enter b -> error?; [fresh process]")
def _():
    return isolated("""
        s = tf.distribute.MirroredStrategy(DEVS[:2]); t = tf.distribute.MirroredStrategy(DEVS[:2])
        a = s.scope(); a.__enter__()
        step("enter_other", lambda: t.scope().__enter__())
        step("exit_a", lambda: a.__exit__(None, None, None))
        """)

ZERO = {
    "gather": "s4.gather(s4.run(lambda v: v * 2, args=(tf.zeros((0, 4)),)), axis=0)",
    "reduce_sum_axis0": "s4.reduce(SUM, s4.run(lambda v: v * 2, args=(tf.zeros((0, 4)),)), axis=0)",
    "all_gather": "s4.experimental_local_results(s4.run(lambda: tf.distribute.get_replica_context().all_gather(tf.zeros((0, 2)), axis=0)))",
    "all_reduce": "s4.experimental_local_results(s4.run(lambda: tf.distribute.get_replica_context().all_reduce(SUM, tf.zeros((0, 2)))))",
}
@case("fuzz.zero_rows", "zero-row values (each in a fresh process; a crash is recorded as such): " + "; ".join("%s: %s" % kv for kv in ZERO.items()))
def _():
    res = {}
    for k, expr in ZERO.items():
        try:
            res[k] = isolated("s4 = tf.distribute.MirroredStrategy(DEVS)\nstep('call', lambda: out.__setitem__('value', enc(%s)))\n" % expr)
        except Exception as e:
            res[k] = "process died: " + str(e)[-300:]
    return res

dump(OUT)
