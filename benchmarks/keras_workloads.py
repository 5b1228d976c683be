"""The Keras workloads `benchmarks.bench_keras` times: the models (an MLP, a small conv net with
batch norm, a tiny dense model), their data and compile settings, a model whose own
``train_step`` is Keras' (run as an override), and jaxdist's jitted custom loop on the same
model (the recipe of docs/guides/keras.md)."""

R, BATCH = 8, 256
MODELS = {"mlp": 40, "conv": 16}  # steps per timed epoch
TINY_BATCH, TINY_STEPS = 32, 300


def build_model(kind, keras):
    L = keras.layers
    if kind == "mlp":
        layers = [keras.Input((784,)), L.Dense(512, activation="relu"), L.Dense(512, "relu")]
        layers.append(L.Dense(10))
    elif kind == "conv":
        layers = [keras.Input((28, 28, 1)), L.Conv2D(16, 3, padding="same"), L.BatchNormalization()]
        layers += [L.ReLU(), L.Conv2D(32, 3, strides=2, padding="same"), L.BatchNormalization()]
        layers += [L.ReLU(), L.GlobalAveragePooling2D(), L.Dense(10)]
    else:  # tiny
        layers = [keras.Input((16,)), L.Dense(16, activation="relu"), L.Dense(4)]
    model = keras.Sequential(layers)
    return model


def compile_model(model, keras, spe):
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=spe,
    )


def fit_data(kind, steps, np):
    rng = np.random.default_rng(0)
    shape = {"mlp": (784,), "conv": (28, 28, 1), "tiny": (16,)}[kind]
    batch = TINY_BATCH if kind == "tiny" else BATCH
    x = rng.normal(size=(steps * batch, *shape)).astype(np.float32)
    y = rng.integers(0, 4 if kind == "tiny" else 10, size=(steps * batch,)).astype(np.int32)
    return x, y, batch


def own_step(keras):
    class OwnStep(keras.Sequential):
        def train_step(self, state, data):
            return super().train_step(state, data)

    return OwnStep


def custom_epoch(kind, devices):
    """jaxdist's jitted custom loop on the same Keras model (the recipe of docs/guides/keras.md; batch-norm
    statistics kept per replica, as TF's mirrored variables are updated per replica)."""
    # isort: off
    import jaxdist as jd  # before Keras starts JAX: jaxdist sizes XLA's CPU pool
    import jax
    import keras
    import numpy as np

    # isort: on
    x, y, batch = fit_data(kind, MODELS[kind], np)
    strategy = jd.MirroredStrategy([f"/cpu:{i}" for i in range(devices)])
    with strategy.scope():
        model = build_model(kind, keras)
        optimizer = keras.optimizers.SGD(0.1)
        optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def step(state, x, y):
        tv, ntv, ov = state

        def loss_of(tv):
            logits, ntv2 = model.stateless_call(tv, ntv, x, training=True)
            return jd.nn.compute_average_loss(loss_fn(y, logits)), ntv2

        (loss, ntv), grads = jax.value_and_grad(loss_of, has_aux=True)(tv)
        grads = jd.get_replica_context().all_reduce(jd.ReduceOp.SUM, grads)
        tv, ov = optimizer.stateless_apply(ov, grads, tv)
        return (tv, ntv, ov), loss

    train = jax.jit(lambda state, x, y: strategy.run(step, args=(state, x, y)))
    values = [model.trainable_variables, model.non_trainable_variables, optimizer.variables]
    state = tuple([v.value for v in vs] for vs in values)
    box = [strategy.run(lambda s: s, args=(state,))]
    batches = [(x[i : i + batch], y[i : i + batch]) for i in range(0, len(x), batch)]
    dist = strategy.experimental_distribute_dataset(batches)

    def epoch():
        loss = None
        for xb, yb in dist:
            box[0], loss = train(box[0], xb, yb)
        return strategy.reduce(jd.ReduceOp.SUM, loss, axis=None)

    return epoch
