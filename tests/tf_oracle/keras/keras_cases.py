"""Record TF 2.21 + Keras 3 answers for Keras fit/evaluate/predict under MirroredStrategy.

Usage: /work/tfvenv/bin/python keras_cases.py R [OUT_JSON]
Runs every scenario of KERAS_SCENARIOS.md for R replicas (R in 1, 2, 4, 8) in this process
(logical devices can be configured only once per process) and writes {key: answer} to
OUT_JSON (default parts/r{R}.json next to this file). merge.py joins the parts.
"""

import json
import os
import sys
import time

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # deterministic plain Eigen kernels

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

# Must run before any TF op: 8 logical CPUs; few threads (2 shared cores on this machine).
_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(8)]
)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import keras  # noqa: E402
from keras.src.trainers.data_adapters import get_data_adapter  # noqa: E402  (private; oracle only)

HERE = os.path.dirname(os.path.abspath(__file__))

# ---------------------------------------------------------------- data (KERAS_SCENARIOS.md)
_rng = np.random.default_rng(0)
X = _rng.normal(size=(250, 16)).astype("float32")
Y = _rng.integers(0, 2, size=(250,)).astype("int32")
SW = np.linspace(0.5, 1.5, 250).astype("float32")


def fl(a):
    """float32 array/scalar -> nested lists of python floats (exact float32 values)."""
    a = np.asarray(a)
    if a.dtype.kind == "f":
        return np.asarray(a, np.float32).astype(np.float64).tolist()
    return a.tolist()


def build(model_name):
    L = keras.layers
    if model_name == "dense":
        layers = [L.Input((16,)), L.Dense(32, activation="relu"), L.Dense(2)]
    else:
        sync = model_name == "syncbn"
        layers = [L.Input((16,)), L.Dense(32), L.BatchNormalization(synchronized=sync),
                  L.ReLU(), L.Dense(2)]
    model = keras.Sequential(layers)
    rng = np.random.default_rng(1)
    for layer in model.layers:
        if isinstance(layer, L.Dense):
            layer.kernel.assign(rng.normal(0, 0.2, tuple(layer.kernel.shape)).astype("float32"))
            layer.bias.assign(rng.normal(0, 0.1, tuple(layer.bias.shape)).astype("float32"))
    return model


def compile_(model, opt, **kw):
    optimizer = keras.optimizers.SGD(0.1) if opt == "sgd" else keras.optimizers.Adam(0.01)
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], **kw)


def make_model(strategy, model_name, opt, **kw):
    keras.backend.clear_session()
    if strategy is None:
        model = build(model_name)
        compile_(model, opt, **kw)
    else:
        with strategy.scope():
            model = build(model_name)
            compile_(model, opt, **kw)
    return model


def weights_of(model):
    return {"weights": [fl(w) for w in model.get_weights()],
            "weight_names": [w.path for w in model.weights]}


def run_fit(strategy, model_name, opt, variant):
    """One scenario: fit (variant) -> evaluate -> predict; returns the answer dict."""
    kw = {}
    if variant == "spe2":
        kw["steps_per_execution"] = 2
    model = make_model(strategy, model_name, opt, **kw)
    fit_kw = dict(epochs=2, shuffle=False, verbose=0)
    x, y = X, Y
    if variant == "sw":
        fit_kw["sample_weight"] = SW
    elif variant == "val":
        fit_kw["validation_data"] = (X[:50], Y[:50])
    elif variant == "cw":
        fit_kw["class_weight"] = {0: 1.0, 1: 2.0}
    elif variant == "rows256":  # 256 rows: no partial batch (64 divides by every R)
        x, y = np.concatenate([X, X[:6]]), np.concatenate([Y, Y[:6]])
    if variant == "tfdata":
        hist = model.fit(tf.data.Dataset.from_tensor_slices((X, Y)).batch(64), **fit_kw)
    else:
        hist = model.fit(x, y, batch_size=64, **fit_kw)
    out = {"history": {k: fl(v) for k, v in hist.history.items()}}
    out.update(weights_of(model))
    ev = model.evaluate(X, Y, batch_size=64, verbose=0, return_dict=True)
    out["evaluate"] = {k: fl(v) for k, v in ev.items()}
    out["predict"] = fl(model.predict(X[:70], batch_size=64, verbose=0))
    return out


def run_tob(strategy, model_name, opt):
    model = make_model(strategy, model_name, opt)
    init = [fl(w) for w in model.get_weights()]
    res = model.train_on_batch(X[:58], Y[:58], return_dict=True)
    out = {"result": {k: fl(v) for k, v in res.items()}, "initial_weights": init}
    out.update(weights_of(model))
    return out


def split_rows(strategy, n, batch):
    """Which rows each replica gets, per batch: experimental_distribute_dataset (tf.data batch)
    and Keras' own input path (ArrayDataAdapter dataset + experimental_distribute_dataset)."""
    idx = np.arange(n, dtype="int64")
    res = {}
    ds_plain = tf.data.Dataset.from_tensor_slices(idx).batch(batch)
    ds_keras = get_data_adapter(idx, None, batch_size=batch, shuffle=False).get_tf_dataset()
    for name, ds in (("tf_data_batch", ds_plain), ("keras_array_adapter", ds_keras)):
        batches = []
        for elem in strategy.experimental_distribute_dataset(ds):
            if isinstance(elem, tuple):
                elem = elem[0]
            vals = strategy.experimental_local_results(elem)
            batches.append([np.asarray(v).tolist() for v in vals])
        res[name] = batches
    return res


def _first_replica_symbolic_build(self, iterator=None, data_batch=None):
    """Stand-in for TensorFlowTrainer._maybe_symbolic_build (keras/src/backend/tensorflow/trainer.py,
    Keras 3.15) that takes replica 0's part of the first batch instead of reduce("MEAN") over
    replicas, which fails (AddN shape mismatch) when the first batch splits unevenly. It only
    builds shapes; numerics are untouched. Used by the "valpatch" variant only."""
    if self._distribute_strategy is None:
        return
    if iterator is not None:
        for _, _, it in iterator:
            batch = next(it)
            data_batch = tf.nest.map_structure(
                lambda v: self.distribute_strategy.experimental_local_results(v)[0]
                if isinstance(v, tf.distribute.DistributedValues) else v, batch)
            break
    with self.distribute_strategy.scope():
        self._symbolic_build(data_batch=data_batch)


def run_fit_valpatch(strategy, model_name, opt):
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer
    orig = TensorFlowTrainer._maybe_symbolic_build
    TensorFlowTrainer._maybe_symbolic_build = _first_replica_symbolic_build
    try:
        return run_fit(strategy, model_name, opt, "val")
    finally:
        TensorFlowTrainer._maybe_symbolic_build = orig


def evaluate_fresh(strategy, n):
    """evaluate() on a fresh model whose first batch (n rows) may split unevenly."""
    model = make_model(strategy, "dense", "sgd")
    ev = model.evaluate(X[:n], Y[:n], batch_size=64, verbose=0, return_dict=True)
    return {"evaluate": {k: fl(v) for k, v in ev.items()}}


def partial_batch_scaling(strategy, R, split58):
    """dense/sgd, one step on x[:58]: is the gradient the global mean over 58 rows, or the mean
    of the replicas' local means? Computed by hand without a strategy, compared to Keras'
    answers for train_on_batch(x[:58]) and fit(x[:58], batch_size=58, epochs=1)."""
    keras.backend.clear_session()
    model = build("dense")
    w0 = [v.numpy() for v in model.trainable_weights]
    lossf = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    xs, ys = tf.constant(X[:58]), tf.constant(Y[:58])

    def grads(rows):
        with tf.GradientTape() as tape:
            per = lossf(tf.gather(ys, rows), model(tf.gather(xs, rows)))
            loss = tf.reduce_mean(per)
        return [g.numpy() for g in tape.gradient(loss, model.trainable_weights)], per.numpy()

    g_glob, per_all = grads(np.arange(58))
    parts = [grads(np.asarray(r, "int64")) for r in split58]
    g_loc = [sum(p[0][i] for p in parts) / R for i in range(len(w0))]
    w_glob = [w - 0.1 * g for w, g in zip(w0, g_glob)]
    w_loc = [w - 0.1 * g for w, g in zip(w0, g_loc)]
    md = lambda a, b: float(max(np.max(np.abs(p - q)) for p, q in zip(a, b)))  # noqa: E731
    out = {"split_sizes": [len(r) for r in split58],
           "global_mean_loss": float(per_all.mean()),
           "mean_of_local_mean_losses": float(np.mean([p[1].mean() for p in parts]))}
    tob = make_model(strategy, "dense", "sgd")
    res = tob.train_on_batch(X[:58], Y[:58], return_dict=True)
    w_t = [v.numpy() for v in tob.trainable_weights]
    out["train_on_batch"] = {"loss": float(res["loss"]),
                             "max_abs_diff_vs_global_mean_grad": md(w_t, w_glob),
                             "max_abs_diff_vs_mean_of_local_means_grad": md(w_t, w_loc)}
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer
    orig = TensorFlowTrainer._maybe_symbolic_build
    for patched in (False, True):
        name = "fit_one_batch_patched_build" if patched else "fit_one_batch"
        if patched:
            TensorFlowTrainer._maybe_symbolic_build = _first_replica_symbolic_build
        try:
            fm = make_model(strategy, "dense", "sgd")
            h = fm.fit(X[:58], Y[:58], batch_size=58, epochs=1, shuffle=False, verbose=0)
            w_f = [v.numpy() for v in fm.trainable_weights]
            out[name] = {"loss": float(h.history["loss"][0]),
                         "max_abs_diff_vs_global_mean_grad": md(w_f, w_glob),
                         "max_abs_diff_vs_mean_of_local_means_grad": md(w_f, w_loc)}
        except Exception as e:
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        finally:
            TensorFlowTrainer._maybe_symbolic_build = orig
    return out


def return_types(strategy):
    """What history / evaluate / *_on_batch / predict return (types, key order), dense/sgd."""
    model = make_model(strategy, "dense", "sgd")
    hist = model.fit(X, Y, batch_size=64, epochs=1, shuffle=False, verbose=0)
    ev_list = model.evaluate(X, Y, batch_size=64, verbose=0)
    tob = model.train_on_batch(X[:58], Y[:58])
    tst = model.test_on_batch(X[:58], Y[:58], return_dict=True)
    pob = model.predict_on_batch(X[:6])
    pred = model.predict(X[:70], batch_size=64, verbose=0)
    return {"history_keys": list(hist.history), "history_params": {k: v for k, v in hist.params.items()},
            "history_value_type": type(hist.history["loss"][0]).__name__,
            "evaluate_no_dict": fl(ev_list), "evaluate_no_dict_type": type(ev_list).__name__,
            "metrics_names": list(model.metrics_names),
            "train_on_batch_no_dict": fl(tob), "train_on_batch_no_dict_type": type(tob).__name__,
            "test_on_batch_x58": {k: fl(v) for k, v in tst.items()},
            "predict_on_batch_x6": fl(pob), "predict_on_batch_type": type(pob).__name__,
            "predict_type": type(pred).__name__, "predict_dtype": str(pred.dtype),
            "predict_shape": list(pred.shape),
            "weights_after": [fl(w) for w in model.get_weights()]}


def main():
    R = int(sys.argv[1])
    out_path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, "parts", f"r{R}.json")
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(R)])
    ans = {}

    def rec(key, fn, *a):
        t = time.time()
        try:
            ans[key] = fn(*a)
        except Exception as e:  # record TF's refusal as the answer
            msg = str(e)
            ans[key] = {"error": f"{type(e).__name__}: {msg[:300]} ... {msg[-1200:]}"}
        print(f"{key}: {time.time() - t:.1f}s {'ERROR ' + ans[key]['error'][-600:] if 'error' in ans[key] else ''}",
              flush=True)

    ans[f"_split.r{R}"] = {"rows250_batch64": split_rows(strategy, 250, 64),
                           "rows58_batch58": split_rows(strategy, 58, 58),
                           "rows70_batch64": split_rows(strategy, 70, 64),
                           "rows50_batch64": split_rows(strategy, 50, 64)}
    for m in ("dense", "bn", "syncbn"):
        for v in ("plain", "sw", "val"):
            rec(f"{m}.sgd.{v}.r{R}", run_fit, strategy, m, "sgd", v)
        rec(f"{m}.adam.plain.r{R}", run_fit, strategy, m, "adam", "plain")
        rec(f"{m}.sgd.tob.r{R}", run_tob, strategy, m, "sgd")
        rec(f"{m}.adam.tob.r{R}", run_tob, strategy, m, "adam")
    split58 = ans[f"_split.r{R}"]["rows58_batch58"]["keras_array_adapter"][0]
    rec(f"_partial_batch_scaling.r{R}", partial_batch_scaling, strategy, R, split58)
    for m in ("dense", "bn", "syncbn"):
        rec(f"{m}.sgd.valpatch.r{R}", run_fit_valpatch, strategy, m, "sgd")
    for n in (50, 58):
        rec(f"_evaluate_fresh_rows{n}.r{R}", evaluate_fresh, strategy, n)
    # extras (KERAS_SCENARIOS step 5 + a no-partial-batch control)
    for v in ("spe2", "tfdata", "cw", "rows256"):
        rec(f"dense.sgd.{v}.r{R}", run_fit, strategy, "dense", "sgd", v)
    rec(f"_return_types.r{R}", return_types, strategy)
    if R == 1:  # non-distributed reference (no strategy at all)
        for m in ("dense", "bn", "syncbn"):
            for o in ("sgd", "adam"):
                rec(f"{m}.{o}.plain.nodist", run_fit, None, m, o, "plain")
    ans[f"_meta.r{R}"] = {"tf": tf.__version__, "keras": keras.__version__,
                          "numpy": np.__version__,
                          "devices": [d.name for d in tf.config.list_logical_devices("CPU")]}
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w") as f:
        json.dump(ans, f)
    print("wrote", out_path)


if __name__ == "__main__":
    main()
