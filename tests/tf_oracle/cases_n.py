# TF oracle, batch N: MultiWorkerMirroredStrategy with 2 worker processes on 127.0.0.1 (CPU only), partial global batches.
# Run:  /work/tfvenv/bin/python tests/tf_oracle/cases_n.py      (launcher: picks 2 free loopback ports, starts 2 workers of
#       this same file with --worker I, waits at most 240 s, kills any straggler by pid, merges into answers.json;
#       set TF_ORACLE_OUT=/tmp/x.json to write elsewhere), then python3 tests/tf_oracle/gen_md.py
# Each worker asks for 2 logical CPUs, but note TF's MWMS uses ONE replica per worker on CPU-only hosts
# (CollectiveAllReduceExtended._initialize_local_devices: num_local_devices = 1 when there is no GPU/TPU), so the
# cluster has 2 replicas in sync (one per worker); the answers record num_replicas_in_sync and worker_devices to show it.
# A second run ("mwms_2x2.*" ids) monkeypatches that one TF-internal method so that each worker uses its 2 logical CPUs
# (/job:worker/task:I/device:CPU:0 and CPU:1 -> 4 replicas in sync); everything else is stock TF. Treat those answers
# as "what TF's input/reduce code does with 2 local replicas per worker", not as a configuration TF offers on CPU.
import os, sys, json, socket, subprocess, time

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.environ.get("TF_ORACLE_OUT", os.path.join(HERE, "answers.json"))

def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def launcher(local):
    ports = [free_port(), free_port()]
    cluster = {"worker": ["127.0.0.1:%d" % p for p in ports]}
    tmp = "/tmp/tf_oracle_mwms_local%d" % local
    os.makedirs(tmp, exist_ok=True)
    procs = []
    for i in range(2):
        env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}),
                   TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", GRPC_DNS_RESOLVER="native")
        for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
            env.pop(k, None)
        env["no_proxy"] = env["NO_PROXY"] = "127.0.0.1,localhost"
        log = open(os.path.join(tmp, "worker%d.log" % i), "w")
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", str(i), os.path.join(tmp, "w%d.json" % i), str(local)],
                                      env=env, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.time() + 240
    for p in procs:
        try:
            p.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            pass
    status = []
    for i, p in enumerate(procs):
        if p.poll() is None:
            p.kill()  # only the worker processes this launcher started
            p.wait()
            status.append("worker%d killed after timeout" % i)
        else:
            status.append("worker%d rc=%s" % (i, p.returncode))
    print(status)
    results = {}
    for i in range(2):
        path = os.path.join(tmp, "w%d.json" % i)
        if os.path.exists(path):
            for k, v in json.load(open(path)).items():
                results[k] = v
        else:
            results["%s.worker%d_missing" % (PREFIX[local], i)] = {"code": "worker %d produced no results" % i,
                                                     "result": "no output; see %s/worker%d.log; %s" % (tmp, i, status)}
    old = json.load(open(OUT)) if os.path.exists(OUT) else {}
    old.update(results)
    json.dump(old, open(OUT, "w"), indent=1, sort_keys=True)
    for k in sorted(results):
        print(k, "=>", json.dumps(results[k]["result"])[:300])

PREFIX = {1: "mwms", 2: "mwms_2x2"}

def worker(idx, outpath, local):
    sys.path.insert(0, HERE)
    from common import tf, enc, errstr, np  # common asks for 4 logical CPUs; override to 2 before TF initialises
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    SUM, MEAN = tf.distribute.ReduceOp.SUM, tf.distribute.ReduceOp.MEAN
    note = ""
    if local == 2:
        from tensorflow.python.distribute import collective_all_reduce_strategy as cars
        def two_cpus(self, cluster_resolver, worker_device):
            return tuple("%s/device:CPU:%d" % (worker_device, i) for i in range(2)), "CPU"
        cars.CollectiveAllReduceExtended._initialize_local_devices = two_cpus
        note = " [PATCHED: 2 local CPU replicas per worker]"
    RES = {}
    def rec(cid, code, fn):
        try:
            r = enc(fn())
        except Exception as e:
            r = errstr(e)
        RES["%s.%s.worker%d" % (PREFIX[local], cid, idx)] = {"code": code + "  [recorded on worker %d of 2]%s" % (idx, note), "result": r}
        json.dump(RES, open(outpath, "w"), indent=1)

    s = tf.distribute.MultiWorkerMirroredStrategy()
    rec("setup", "s=tf.distribute.MultiWorkerMirroredStrategy() with TF_CONFIG 2 workers on 127.0.0.1 (each process: 2 logical CPUs); "
        "num_replicas_in_sync, worker_devices, logical CPUs, cross_device_ops type, task",
        lambda: {"num_replicas_in_sync": s.num_replicas_in_sync, "worker_devices": list(s.extended.worker_devices),
                 "logical_cpus": [d.name for d in tf.config.list_logical_devices("CPU")],
                 "task": [s.cluster_resolver.task_type, s.cluster_resolver.task_id],
                 "is_chief": s.extended.should_checkpoint})
    rc = tf.distribute.get_replica_context

    def steps(dd, max_steps=6):
        out = []
        it = iter(dd)
        for _ in range(max_steps):
            try:
                x = next(it)
            except StopIteration:
                out.append("StopIteration")
                return out
            xf = s.run(lambda x: tf.cast(x, tf.float32), args=(x,))
            step = {"local_x": enc(s.experimental_local_results(x))}
            for k, fn in (("run_all_reduce_sum_of_sum", lambda: s.run(lambda x: rc().all_reduce(SUM, tf.reduce_sum(tf.cast(x, tf.float32))), args=(x,))),
                          ("reduce_MEAN_axis0", lambda: s.reduce(MEAN, xf, axis=0)),
                          ("reduce_SUM_axis0", lambda: s.reduce(SUM, xf, axis=0)),
                          ("reduce_SUM_of_run_shape0", lambda: s.reduce(SUM, s.run(lambda x: tf.shape(x)[0], args=(x,)), axis=None)),
                          ("gather_axis0", lambda: s.gather(xf, axis=0))):
                try:
                    step[k] = enc(s.experimental_local_results(fn()) if k == "run_all_reduce_sum_of_sum" else fn())
                except Exception as e:
                    step[k] = errstr(e)
            out.append(step)
        out.append("max_steps reached")
        return out

    AS = tf.data.experimental.AutoShardPolicy
    for name, policy in (("default", None), ("DATA", AS.DATA), ("OFF", AS.OFF), ("AUTO", AS.AUTO)):
        def mk(policy=policy):
            ds = tf.data.Dataset.range(14).batch(6)
            if policy is not None:
                o = tf.data.Options()
                o.experimental_distribute.auto_shard_policy = policy
                ds = ds.with_options(o)
            return s.experimental_distribute_dataset(ds)
        rec("range14_batch6_%s" % name,
            "ds=tf.data.Dataset.range(14).batch(6)%s; dd=s.experimental_distribute_dataset(ds); per step: local_x (this worker's replica "
            "values), run(all_reduce(SUM, reduce_sum(float(x)))) local results, reduce(MEAN, float(x), axis=0), reduce(SUM, float(x), axis=0), "
            "reduce(SUM, run(tf.shape(x)[0]), None), gather(float(x), 0)" % ("" if policy is None else " with auto_shard_policy=%s" % name),
            lambda mk=mk: steps(mk()))

    rec("range14_batch6_dsfn",
        "dd=s.distribute_datasets_from_function(lambda ctx: range(14).shard(ctx.num_input_pipelines, ctx.input_pipeline_id)"
        ".batch(ctx.get_per_replica_batch_size(6))); InputContext fields seen + steps as above",
        lambda: (lambda seen: {"steps": steps(s.distribute_datasets_from_function(
            lambda c: (seen.append([c.num_input_pipelines, c.input_pipeline_id, c.num_replicas_in_sync]),
                       tf.data.Dataset.range(14).shard(c.num_input_pipelines, c.input_pipeline_id).batch(c.get_per_replica_batch_size(6)))[1])),
            "input_contexts": seen})([]))

    rec("uneven_dsfn",
        "dd=s.distribute_datasets_from_function(lambda ctx: range(6 if worker 0 else 2).batch(2)): the workers' datasets "
        "end at different steps (worker 0: 3 batches, worker 1: 1); steps as above (issue 19)",
        lambda: steps(s.distribute_datasets_from_function(
            lambda c: tf.data.Dataset.range(6 if c.input_pipeline_id == 0 else 2).batch(2))))

    @tf.function
    def loop_sum(dd):
        total = tf.constant(0.)
        n = tf.constant(0)
        for x in dd:
            total += s.reduce(SUM, s.run(lambda x: tf.reduce_sum(tf.cast(x, tf.float32)), args=(x,)), axis=None)
            n += 1
        return total, n
    rec("range14_batch6_tf_function_loop",
        "@tf.function: for x in s.experimental_distribute_dataset(range(14).batch(6)): total += s.reduce(SUM, run(reduce_sum(float x))); steps",
        lambda: loop_sum(s.experimental_distribute_dataset(tf.data.Dataset.range(14).batch(6))))
    json.dump(RES, open(outpath, "w"), indent=1)

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
    else:
        launcher(1)
        launcher(2)
