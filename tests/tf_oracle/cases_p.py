# TF oracle, batch P: collectives inside tf.GradientTape on partial batches (issue 19): the gradient of
# all_reduce / all_gather on a [1, 1, 0, 0] batch, and per-replica values of different non-batch shapes
# from a dataset function passed into a tf.function that calls run.
# Run:  /work/tfvenv/bin/python tests/tf_oracle/cases_p.py      (merges into tests/tf_oracle/answers.json;
#       set TF_ORACLE_OUT=/tmp/x.json to write elsewhere), then python3 tests/tf_oracle/gen_md.py
import os, sys
HERE = os.path.dirname(os.path.abspath(__file__)); sys.path.insert(0, HERE)
from common import *
OUT = os.environ.get("TF_ORACLE_OUT", os.path.join(HERE, "answers.json"))
rc = tf.distribute.get_replica_context
S4 = tf.distribute.MirroredStrategy(DEVS[:4])
S2 = tf.distribute.MirroredStrategy(DEVS[:2])


def partial(s, rows):
    data = tf.data.Dataset.from_tensor_slices(np.asarray(rows, np.float32)).batch(len(rows))
    return next(iter(s.experimental_distribute_dataset(data)))


def grad_of(collective, s, x):
    def step(x):
        w = tf.Variable(1.0)  # one per replica call (eager run: a fresh variable per replica)
        with tf.GradientTape() as tape:
            out = collective(x * w)
        return tape.gradient(out, w)
    return s.run(step, args=(x,))


@case("grad.all_reduce_sum_partial_4r",
      "x = [[1],[2]] over 4 replicas ([1],[2],[],[]); run: tape.gradient(all_reduce(SUM, sum(x*w)), w), w=1")
def _():
    return grad_of(lambda v: rc().all_reduce(SUM, tf.reduce_sum(v)), S4, partial(S4, [[1.], [2.]]))


@case("grad.all_reduce_sum_full_4r",
      "x = [[1],[1],[1],[1]] over 4 replicas; run: tape.gradient(all_reduce(SUM, sum(x*w)), w), w=1")
def _():
    return grad_of(lambda v: rc().all_reduce(SUM, tf.reduce_sum(v)), S4, partial(S4, [[1.]] * 4))


@case("grad.all_reduce_sum_partial_4r_tf_function",
      "the same as grad.all_reduce_sum_partial_4r with the run inside a tf.function")
def _():
    x = partial(S4, [[1.], [2.]])
    ws = [tf.Variable(1.0) for _ in range(4)]

    @tf.function
    def f(x):
        def step(x):
            w = ws[0]
            with tf.GradientTape() as tape:
                out = rc().all_reduce(SUM, tf.reduce_sum(x * w))
            return tape.gradient(out, w)
        return S4.run(step, args=(x,))
    return f(x)


@case("grad.all_gather_partial_4r",
      "x = [[1],[2],[3]] over 4 replicas ([1],[1]? TF split); coef = [1,2,3]; run: tape.gradient(sum(all_gather(x*w, 0) * coef), w)")
def _():
    x = partial(S4, [[1.], [2.], [3.]])
    coef = tf.constant([[1.], [2.], [3.]])
    return {"split": enc(x), "grad": enc(grad_of(lambda v: tf.reduce_sum(rc().all_gather(v, 0) * coef), S4, x))}


@case("ragged.dataset_fn_non_batch_shapes_tf_function_2r",
      "distribute_datasets_from_function(PER_REPLICA): replica 0 gets [[1,2],[1,2]], replica 1 [[1,2,3],[1,2,3]]; tf.function(lambda x: s.run(reduce_mean, (x,)))")
def _():
    def dataset_fn(ctx):
        k = 2 + ctx.input_pipeline_id
        return tf.data.Dataset.from_tensors(np.tile(np.arange(1, k + 1, dtype=np.float32), (2, 1)))
    opts = tf.distribute.InputOptions(
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA,
        experimental_place_dataset_on_device=False, experimental_fetch_to_device=True)
    x = next(iter(S2.distribute_datasets_from_function(dataset_fn, opts)))
    return tf.function(lambda x: S2.run(tf.reduce_mean, args=(x,)))(x)


dump(OUT)
