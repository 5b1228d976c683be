# TF oracle, batch Q: TF's variables inside the replica step (issue 45). TF 2.21 + Keras 3
# (KERAS_BACKEND=tensorflow), 8 logical CPUs, MirroredStrategy over the first R of them.
#   vars.tutorial.*   TF's custom-training tutorial in its own shape: the optimizer's apply_gradients and
#                     the metrics' update_state inside the step given to strategy.run, a tf.function
#                     around run + reduce(SUM); 45 rows in batches of 16 (last batch 13 rows), 2 epochs.
#   vars.metric.*     Keras 3 metrics updated per replica with known per-replica data: result() on the
#                     host, the metric variables' host reads, per-replica values, synchronization/aggregation.
#   vars.optimizer.*  a Keras optimizer's apply_gradients per replica with per-replica gradients.
#   vars.tfvar.*      tf.Variable assign/assign_add in a replica context: mirrored (aggregation NONE, MEAN,
#                     SUM, ONLY_FIRST_REPLICA) and ON_READ (SUM, MEAN, ...).
# Run:  /work/tfvenv/bin/python tests/tf_oracle/cases_q.py      (merges into tests/tf_oracle/answers.json;
#       set TF_ORACLE_OUT=/tmp/x.json to write elsewhere), then python3 tests/tf_oracle/gen_md.py
# One process per R (`cases_q.py R PART.json`, started by the run without arguments): strategies over
# different device sets in one process collide in TF's collective group keys (every CollectiveAllReduce
# numbers its groups from 1: "Device CPU:2 is joining a group with size3, but that group has size 2"),
# and each R's cases share one strategy (see `strat`).
import os, sys, subprocess, tempfile
os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # plain Eigen kernels: reproducible numbers
HERE = os.path.dirname(os.path.abspath(__file__)); sys.path.insert(0, HERE)
from common import *  # sets 4 logical CPUs; the runtime is not started yet, so 8 replaces it here
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 8)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)
import keras
assert len(tf.config.list_logical_devices("CPU")) == 8
OUT = os.environ.get("TF_ORACLE_OUT", os.path.join(HERE, "answers.json"))
rc = tf.distribute.get_replica_context
COUNTS = (1, 2, 3, 8)
CHILD = int(sys.argv[1]) if len(sys.argv) > 1 else None   # this process records the cases of R = CHILD


def rs(counts):
    """The replica counts of `counts` this process records."""
    return [n for n in counts if n == CHILD]
VA = tf.VariableAggregation
VS = tf.VariableSynchronization


_STRATEGIES = {}


def strat(n):
    """One MirroredStrategy per process, reused by every case: two strategies in one process number their
    collective instances alike, and the second one's all-reduce then fails ("Shape mismatch in the
    collective instance 100")."""
    if n not in _STRATEGIES:
        _STRATEGIES[n] = tf.distribute.MirroredStrategy(["/cpu:%d" % i for i in range(n)])
    return _STRATEGIES[n]


def fcase(cid, code):
    """case() that, on an error, also keeps the lines of TF's message that name the cause (the first
    line of a graph error says nothing): {"error": ..., "detail": [...]}."""
    def deco(fn):
        def run():
            try:
                return fn()
            except Exception as e:
                lines = [l.strip() for l in str(e).split("\n")]
                detail = [l for l in lines if l and ("INVALID_ARGUMENT" in l or "Error:" in l or "error(s)" in l)
                          and not l.startswith("File ")]
                return {"error": errstr(e), "detail": detail[:6]}
        return case(cid, code)(run)
    return deco


def lst(x):
    return np.asarray(x).tolist()


# ------------------------------------------------------------------ a. the custom-training tutorial
GLOBAL = 16
_rng = np.random.RandomState(0)
W0 = [(_rng.normal(size=(5, 4)) * 0.5).astype(np.float32), (_rng.normal(size=(4,)) * 0.1).astype(np.float32),
      (_rng.normal(size=(4, 3)) * 0.5).astype(np.float32), (_rng.normal(size=(3,)) * 0.1).astype(np.float32)]
_rng = np.random.RandomState(1)
X = _rng.normal(size=(45, 5)).astype(np.float32)
Y = _rng.randint(0, 3, size=(45,)).astype(np.int32)
SETUP_CODE = ("_rng = np.random.RandomState(0); W0 = [(normal(5,4)*0.5), (normal(4,)*0.1), (normal(4,3)*0.5), "
              "(normal(3,)*0.1)] as float32 (in that order from _rng: Dense(4) kernel, bias, Dense(3) kernel, bias); "
              "_rng = np.random.RandomState(1); X = normal((45,5)) float32; Y = randint(0,3,(45,)) int32")


def _setup():
    return {"x": lst(X), "y": lst(Y), "initial_weights": [lst(w) for w in W0], "global_batch": GLOBAL,
            "epochs": 2, "tf": tf.__version__, "keras": keras.__version__}


def tutorial(n, opt, use_function=True, build=False):
    s = strat(n)
    with s.scope():
        model = tf.keras.Sequential([tf.keras.Input((5,)), tf.keras.layers.Dense(4, activation="relu"),
                                     tf.keras.layers.Dense(3)])
        model.set_weights(W0)
        optimizer = tf.keras.optimizers.SGD(0.1) if opt == "sgd" else tf.keras.optimizers.Adam(0.01)
        if build:
            optimizer.build(model.trainable_variables)
        loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
        train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")
        train_loss = tf.keras.metrics.Mean(name="train_loss")  # per-example losses, inside the step

    def compute_loss(labels, predictions):
        per_example_loss = loss_object(labels, predictions)
        return tf.nn.compute_average_loss(per_example_loss, global_batch_size=GLOBAL), per_example_loss

    def train_step(inputs):
        images, labels = inputs
        with tf.GradientTape() as tape:
            predictions = model(images, training=True)
            loss, per_example_loss = compute_loss(labels, predictions)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        train_accuracy.update_state(labels, predictions)
        train_loss.update_state(per_example_loss)
        return loss

    def distributed_train_step(dataset_inputs):
        per_replica_losses = s.run(train_step, args=(dataset_inputs,))
        return s.reduce(SUM, per_replica_losses, axis=None)
    if use_function:
        distributed_train_step = tf.function(distributed_train_step)

    dist = s.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((X, Y)).batch(GLOBAL))
    epochs = []
    for epoch in range(2):
        losses, rows = [], []
        for batch in dist:
            rows.append([int(t.shape[0]) for t in s.experimental_local_results(batch[0])])
            losses.append(float(distributed_train_step(batch)))
        epochs.append({
            "step_losses": losses,                       # strategy.reduce(SUM, per-replica losses) per step
            "train_loss": sum(losses) / len(losses),     # the tutorial's total_loss / num_batches
            "train_accuracy": float(train_accuracy.result()),
            "loss_mean_metric": float(train_loss.result()),   # Mean of the per-example losses
            "accuracy_variables": [lst(v.numpy()) for v in train_accuracy.variables],  # [total, count]
            "loss_mean_variables": [lst(v.numpy()) for v in train_loss.variables],
            "weights": [lst(w) for w in model.get_weights()],
            "iterations": int(optimizer.iterations.numpy()),
            "rows_per_replica": rows,
        })
        train_accuracy.reset_state(); train_loss.reset_state()
    return {"epochs": epochs}


TUT_CODE = ("in scope: Sequential([Input((5,)), Dense(4, relu), Dense(3)]), set_weights(W0) (vars.tutorial.setup); "
            "optimizer %s%s; loss_object = SparseCategoricalCrossentropy(from_logits=True, reduction=None); "
            "train_accuracy = SparseCategoricalAccuracy(); train_loss = Mean(). train_step((x, y)): tape: "
            "pred = model(x, training=True); per_ex = loss_object(y, pred); loss = compute_average_loss(per_ex, "
            "global_batch_size=16); optimizer.apply_gradients(zip(tape.gradient(loss, tv), tv)); "
            "train_accuracy.update_state(y, pred); train_loss.update_state(per_ex); return loss. "
            "%sdistributed_train_step(b) = s.reduce(SUM, s.run(train_step, (b,)), axis=None). "
            "experimental_distribute_dataset(from_tensor_slices((X, Y)).batch(16)): batches 16, 16, 13; 2 epochs, "
            "metrics read then reset_state() after each epoch. MirroredStrategy(['/cpu:0'..'/cpu:%d'])")
UNBUILT = " (not built: the first apply_gradients builds it, as in the tutorial)"
BUILT = ", optimizer.build(model.trainable_variables) in the scope"
for _n in rs(COUNTS):
    for _opt, _oname in (("sgd", "SGD(0.1)"), ("adam", "Adam(0.01)")):
        fcase("vars.tutorial.%s.r%d" % (_opt, _n), TUT_CODE % (_oname, UNBUILT, "@tf.function ", _n - 1))(
            lambda _n=_n, _opt=_opt: tutorial(_n, _opt))
    case("vars.tutorial.adam_built.r%d" % _n, TUT_CODE % ("Adam(0.01)", BUILT, "@tf.function ", _n - 1))(
        lambda _n=_n: tutorial(_n, "adam", build=True))
for _n in rs((2, 8)):
    case("vars.tutorial.sgd_eager.r%d" % _n, TUT_CODE % ("SGD(0.1)", UNBUILT, "(no tf.function: eager) ", _n - 1))(
        lambda _n=_n: tutorial(_n, "sgd", use_function=False))
    case("vars.tutorial.adam_eager.r%d" % _n, TUT_CODE % ("Adam(0.01)", UNBUILT, "(no tf.function: eager) ", _n - 1))(
        lambda _n=_n: tutorial(_n, "adam", use_function=False))


# ------------------------------------------------------------------ b. Keras metrics in the replica step
def metric_data(kind, r):
    """The data replica r passes to update_state."""
    if kind in ("mean", "sum"):
        return (np.arange(r + 1, dtype=np.float32) + 10.0 * r,)
    if kind == "accuracy":
        y_true = np.array([r % 3, (r + 1) % 3], np.int32)
        second = (r + 1) % 3 if r % 2 == 0 else (r + 2) % 3   # row 1 correct on even replicas only
        y_pred = np.zeros((2, 3), np.float32)
        y_pred[0, r % 3] = 1.0
        y_pred[1, second] = 1.0
        return (y_true, y_pred)
    if kind == "mse":
        return (np.zeros((r + 1, 2), np.float32), np.full((r + 1, 2), float(r + 1), np.float32))
    raise ValueError(kind)


METRIC_DATA_CODE = ("replica r's update_state args: mean/sum: (arange(r+1) + 10r,); accuracy: y_true=[r%3, (r+1)%3], "
                    "y_pred one-hot rows [r%3, (r+1)%3 if r even else (r+2)%3] (row 1 right on even replicas); "
                    "mse: (zeros((r+1,2)), full((r+1,2), r+1))")


def var_props(v):
    tv = v.value if hasattr(v, "value") else v
    d = {"path": getattr(v, "path", v.name), "keras_synchronization": getattr(v, "synchronization", "<none>"),
         "keras_aggregation": getattr(v, "aggregation", "<none>"), "tf_type": type(tv).__name__}
    for a in ("synchronization", "aggregation"):
        try:
            d["tf_" + a] = str(getattr(tv, a))
        except Exception as e:
            d["tf_" + a] = errstr(e)
    return d


def metric_case(n, kind, calls=2, use_function=True):
    s = strat(n)
    with s.scope():
        m = {"mean": lambda: keras.metrics.Mean(), "sum": lambda: keras.metrics.Sum(),
             "accuracy": lambda: keras.metrics.SparseCategoricalAccuracy(),
             "mse": lambda: keras.metrics.MeanSquaredError()}[kind]()
    data = s.experimental_distribute_values_from_function(
        lambda ctx: tuple(tf.constant(a) for a in metric_data(kind, ctx.replica_id_in_sync_group)))

    def step(args):
        m.update_state(*args)
        return m.result()  # what a replica reads inside the step, after its own update
    f = (lambda d: s.run(step, args=(d,)))
    if use_function:
        f = tf.function(f)
    out = {"variables": [var_props(v) for v in m.variables]}
    for c in range(calls):
        inside = f(data)
        out["after_call_%d" % (c + 1)] = {
            "result": lst(m.result().numpy()),
            "variables_host": [lst(v.numpy()) for v in m.variables],
            "variables_per_replica": [[lst(x.numpy()) for x in s.experimental_local_results(v.value)]
                                      for v in m.variables],
            "result_inside_step": [lst(x.numpy()) for x in s.experimental_local_results(inside)],
        }
    m.reset_state()
    out["after_reset"] = {"variables_host": [lst(v.numpy()) for v in m.variables],
                          "variables_per_replica": [[lst(x.numpy()) for x in s.experimental_local_results(v.value)]
                                                    for v in m.variables]}
    return out


for _kind, _cls in (("mean", "Mean"), ("accuracy", "SparseCategoricalAccuracy"), ("sum", "Sum"),
                    ("mse", "MeanSquaredError")):
    for _n in rs(COUNTS):
        fcase("vars.metric.%s.r%d" % (_kind, _n),
             "in scope: m = keras.metrics.%s(); tf.function(lambda d: s.run(step, (d,))) called twice, step(args): "
             "m.update_state(*args); return m.result(). %s. Recorded after each call: m.result() on the host, "
             "[v.numpy() for v in m.variables], experimental_local_results(v.value) per variable, the step's "
             "returned result per replica; after m.reset_state(); and each variable's Keras/tf "
             "synchronization/aggregation. R=%d" % (_cls, METRIC_DATA_CODE, _n))(
            lambda _n=_n, _kind=_kind: metric_case(_n, _kind))
for _n in rs((2, 8)):
    fcase("vars.metric.mean_eager.r%d" % _n, "vars.metric.mean with an eager s.run (no tf.function), R=%d" % _n)(
        lambda _n=_n: metric_case(_n, "mean", use_function=False))


# ------------------------------------------------------------------ c. Keras optimizer in the replica step
W_INIT = np.array([1.0, 2.0, 3.0], np.float32)
B_INIT = np.array([[0.5, -0.5], [1.0, 0.0]], np.float32)


def opt_grads(step, r):
    gw = np.array([r + 1.0, -0.5 * (r + 1), 0.1 * r], np.float32) * (step + 1)
    gb = np.array([[r, 1.0], [-r, 0.25 * (r + 1)]], np.float32) * (step + 1)
    return gw, gb


def optimizer_case(n, kind, build_first=True, use_function=True, grads_from_values_fn=False):
    s = strat(n)
    with s.scope():
        w = keras.Variable(W_INIT, name="w")
        b = keras.Variable(B_INIT, name="b")
        opt = {"sgd": lambda: keras.optimizers.SGD(0.1), "momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
               "adam": lambda: keras.optimizers.Adam(0.01)}[kind]()
        if build_first:
            opt.build([w, b])

    def step(k):
        if grads_from_values_fn:
            gw, gb = k   # this replica's gradients, made by experimental_distribute_values_from_function
        else:        # the same numbers as opt_grads(k, r), computed inside the step from the replica id
            r = tf.cast(rc().replica_id_in_sync_group, tf.float32)
            scale = tf.cast(k, tf.float32) + 1.0
            gw = tf.stack([r + 1.0, -0.5 * (r + 1.0), 0.1 * r]) * scale
            gb = tf.stack([tf.stack([r, 1.0]), tf.stack([-r, 0.25 * (r + 1.0)])]) * scale
        opt.apply_gradients([(gw, w), (gb, b)])
        return w.value + 0.0  # what the replica reads after its update
    f = (lambda k: s.run(step, args=(k,)))
    if use_function:
        f = tf.function(f)
    out = {"steps": []}
    for k in range(3):
        if grads_from_values_fn:
            arg = s.experimental_distribute_values_from_function(
                lambda ctx, k=k: tuple(tf.constant(a) for a in opt_grads(k, ctx.replica_id_in_sync_group)))
        else:
            arg = tf.constant(k)
        inside = f(arg)
        out["steps"].append({"w": lst(w.numpy()), "b": lst(b.numpy()),
                             "w_per_replica": [lst(x.numpy()) for x in s.experimental_local_results(w.value)],
                             "w_read_inside_step": [lst(x.numpy()) for x in s.experimental_local_results(inside)],
                             "iterations": int(opt.iterations.numpy())})
    out["iterations"] = int(opt.iterations.numpy())
    out["iterations_per_replica"] = [int(x.numpy()) for x in s.experimental_local_results(opt.iterations.value)]
    out["variables"] = [var_props(v) for v in [w, b] + list(opt.variables)]
    return out


OPT_CODE = ("in scope: w = keras.Variable([1,2,3]), b = keras.Variable([[0.5,-0.5],[1,0]]), opt = %s%s; "
            "step k = 0, 1, 2: replica r's gradients gw = [r+1, -0.5(r+1), 0.1r]*(k+1), gb = [[r, 1], [-r, 0.25(r+1)]]*(k+1) "
            "(%s); %ss.run(step, ...), step: opt.apply_gradients([(gw, w), (gb, b)]); return w.value + 0. Recorded "
            "after each step: w, b (host), w per replica, w read inside the step, opt.iterations; the variables' "
            "(w, b, opt.variables) synchronization/aggregation. R=%d")
IN_STEP = "computed in the step from replica_id_in_sync_group, k passed as a tf.constant"
for _kind, _oname in (("sgd", "SGD(0.1)"), ("momentum", "SGD(0.1, momentum=0.9)"), ("adam", "Adam(0.01)")):
    for _n in rs(COUNTS):
        fcase("vars.optimizer.%s.r%d" % (_kind, _n), OPT_CODE % (_oname, "; opt.build([w, b])", IN_STEP, "tf.function ", _n))(
            lambda _n=_n, _kind=_kind: optimizer_case(_n, _kind))
for _n in rs((1, 2, 8)):
    fcase("vars.optimizer.adam_unbuilt.r%d" % _n,
         OPT_CODE % ("Adam(0.01)", " (not built: apply_gradients builds it inside the replica step)", IN_STEP,
                     "tf.function ", _n))(lambda _n=_n: optimizer_case(_n, "adam", build_first=False))
    fcase("vars.optimizer.adam_unbuilt_eager.r%d" % _n,
         OPT_CODE % ("Adam(0.01)", " (not built: apply_gradients builds it inside the replica step)", IN_STEP,
                     "eager (no tf.function) ", _n))(
        lambda _n=_n: optimizer_case(_n, "adam", build_first=False, use_function=False))
    fcase("vars.optimizer.momentum_eager.r%d" % _n,
         OPT_CODE % ("SGD(0.1, momentum=0.9)", "; opt.build([w, b])", IN_STEP, "eager (no tf.function) ", _n))(
        lambda _n=_n: optimizer_case(_n, "momentum", use_function=False))
    fcase("vars.optimizer.sgd_grads_from_values_fn.r%d" % _n,
         OPT_CODE % ("SGD(0.1)", "; opt.build([w, b])", "made on the host by experimental_distribute_values_from_function "
                     "and passed to run", "tf.function ", _n))(
        lambda _n=_n: optimizer_case(_n, "sgd", grads_from_values_fn=True))


# ------------------------------------------------------------------ d. tf.Variable in a replica context
def tfvar_case(n, sync, agg, op, same=False, use_function=True, init=1.0):
    s = strat(n)
    with s.scope():
        if sync is None:
            v = tf.Variable(init, aggregation=agg)
        else:
            v = tf.Variable(init, synchronization=sync, aggregation=agg)

    def step():
        r = tf.cast(rc().replica_id_in_sync_group, tf.float32)
        val = tf.constant(5.0) if same else r + 2.0
        getattr(v, op)(val)
        return v.read_value()   # what this replica reads after its update
    f = (lambda: s.run(step))
    if use_function:
        f = tf.function(f)
    out = {"type": type(v).__name__, "synchronization": str(v.synchronization), "aggregation": str(v.aggregation)}
    try:
        inside = f()
        out["read_inside_step"] = [lst(x.numpy()) for x in s.experimental_local_results(inside)]
    except Exception as e:
        out["error"] = errstr(e)
        out["error_full_message"] = str(e)[:3000]
    try:
        out["host_read"] = lst(v.numpy())
    except Exception as e:
        out["host_read"] = errstr(e)
    try:
        out["host_read_value"] = lst(v.read_value().numpy())
    except Exception as e:
        out["host_read_value"] = errstr(e)
    out["local_results"] = [lst(x.numpy()) for x in s.experimental_local_results(v)]
    return out


TFVAR_CODE = ("in scope: v = tf.Variable(1.0, %saggregation=%s) (%s); %ss.run(step), step: "
              "v.%s(%s); return v.read_value(). Recorded: the step's read per replica, v.numpy() and v.read_value() "
              "on the host, experimental_local_results(v); or the error. R=%d")
AGGS = (("none", VA.NONE), ("mean", VA.MEAN), ("sum", VA.SUM), ("only_first_replica", VA.ONLY_FIRST_REPLICA))
for _sname, _sync in (("mirrored", None), ("on_read", VS.ON_READ)):
    for _aname, _agg in AGGS:
        for _op in ("assign", "assign_add"):
            for _n in rs(COUNTS):
                case("vars.tfvar.%s.%s.%s.r%d" % (_sname, _aname, _op, _n),
                     TFVAR_CODE % ("" if _sync is None else "synchronization=ON_READ, ", _agg,
                                   "MirroredVariable" if _sync is None else "SyncOnReadVariable", "tf.function ",
                                   _op, "r + 2.0 (replica r)", _n), full_error=False)(
                    lambda _n=_n, _sync=_sync, _agg=_agg, _op=_op: tfvar_case(_n, _sync, _agg, _op))
for _n in rs((2, 8)):
    for _aname, _agg in AGGS:
        case("vars.tfvar.mirrored.%s.assign_same.r%d" % (_aname, _n),
             TFVAR_CODE % ("", _agg, "MirroredVariable", "tf.function ", "assign", "5.0 (every replica the same)", _n))(
            lambda _n=_n, _agg=_agg: tfvar_case(_n, None, _agg, "assign", same=True))
    case("vars.tfvar.mirrored.none.assign.eager.r%d" % _n,
         TFVAR_CODE % ("", VA.NONE, "MirroredVariable", "eager (no tf.function) ", "assign", "r + 2.0 (replica r)", _n))(
        lambda _n=_n: tfvar_case(_n, None, VA.NONE, "assign", use_function=False))
    case("vars.tfvar.on_read.sum.assign_add.eager.r%d" % _n,
         TFVAR_CODE % ("synchronization=ON_READ, ", VA.SUM, "SyncOnReadVariable", "eager (no tf.function) ",
                       "assign_add", "r + 2.0 (replica r)", _n))(
        lambda _n=_n: tfvar_case(_n, VS.ON_READ, VA.SUM, "assign_add", use_function=False))


def int_mean_case(n):
    s = strat(n)
    with s.scope():
        v = tf.Variable(1, aggregation=VA.MEAN)

    def step():
        v.assign(rc().replica_id_in_sync_group + 2)
        return v.read_value()
    try:
        inside = tf.function(lambda: s.run(step))()
    except Exception as e:
        return {"error": errstr(e)}
    return {"read_inside_step": [lst(x.numpy()) for x in s.experimental_local_results(inside)],
            "host_read": lst(v.numpy()), "local_results": [lst(x.numpy()) for x in s.experimental_local_results(v)]}


for _n in rs((2,)):
    case("vars.tfvar.mirrored.mean_int32.assign.r%d" % _n,
         "in scope: v = tf.Variable(1, aggregation=MEAN) (int32 MirroredVariable); tf.function s.run(step), step: "
         "v.assign(replica_id + 2); R=%d" % _n)(lambda _n=_n: int_mean_case(_n))


def host_assign(n, sync, agg, op, value):
    s = strat(n)
    with s.scope():
        v = tf.Variable(1.0, synchronization=sync, aggregation=agg) if sync else tf.Variable(1.0, aggregation=agg)
    try:
        getattr(v, op)(value)
    except Exception as e:
        return {"error": errstr(e)}
    return {"host_read": lst(v.numpy()), "local_results": [lst(x.numpy()) for x in s.experimental_local_results(v)]}


for _n in rs((2, 8)):
    for _aname, _agg in AGGS:
        for _op in ("assign", "assign_add"):
            case("vars.tfvar.on_read.%s.host_%s.r%d" % (_aname, _op, _n),
                 "in scope: v = tf.Variable(1.0, synchronization=ON_READ, aggregation=%s); on the host (cross-replica "
                 "context, in no run): v.%s(12.0); v.numpy(), experimental_local_results(v). R=%d" % (_agg, _op, _n))(
                lambda _n=_n, _agg=_agg, _op=_op: host_assign(_n, VS.ON_READ, _agg, _op, 12.0))
    case("vars.tfvar.mirrored.none.host_assign.r%d" % _n,
         "in scope: v = tf.Variable(1.0) (MirroredVariable, aggregation NONE); on the host: v.assign(12.0); "
         "v.numpy(), experimental_local_results(v). R=%d" % _n)(
        lambda _n=_n: host_assign(_n, None, VA.NONE, "assign", 12.0))


if CHILD is not None:
    json.dump(RESULTS, open(sys.argv[2], "w"))
else:
    case("vars.tutorial.setup", SETUP_CODE + "; recorded here: X, Y, W0 (kernel [in,out], bias)")(_setup)
    with tempfile.TemporaryDirectory() as tmp:
        for n in COUNTS:
            part = os.path.join(tmp, "r%d.json" % n)
            subprocess.run([sys.executable, os.path.abspath(__file__), str(n), part], check=True)
            RESULTS.update(json.load(open(part)))
    dump(OUT)
