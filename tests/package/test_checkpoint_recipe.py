"""The Keras checkpoint recipe of docs/guides/checkpointing.md, held to TF's
`tf.train.CheckpointManager`: `max_to_keep=N` keeps the newest N checkpoints, the latest
checkpoint names the newest (None before the first save), a restore from the latest resumes
exactly (weights, optimizer iterations and slots, metric state, the step counter, and the
training after it), and a checkpoint saved under 2 replicas restores the same values under 1, 2,
4 or 8.

Expected values come from the run itself before the save, or from an uninterrupted run of the
same steps, never from what was restored; the step numbers from the loop's own count.
"""

import os

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "jax")
from conftest import mirrored, require  # noqa: E402

import jaxdist as jd  # noqa: E402

keras = require("keras")
ocp = require("orbax.checkpoint")
import jax  # noqa: E402

BATCH = 16
_RNG = np.random.default_rng(0)
X = _RNG.normal(size=(BATCH * 6, 5)).astype(np.float32)
Y = _RNG.integers(0, 3, size=(BATCH * 6,)).astype(np.int32)
BATCHES = [(X[i : i + BATCH], Y[i : i + BATCH]) for i in range(0, len(X), BATCH)]


class Trainer:
    """The recipe's objects: a model, an Adam (slots and iterations), two metrics, a step
    counter on the host, and a jd.function around strategy.run."""

    def __init__(self, strategy: jd.MirroredStrategy):
        self.strategy = strategy
        with strategy.scope():
            keras.utils.set_random_seed(0)
            self.model = keras.Sequential(
                [keras.Input((5,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(3)]
            )
            self.optimizer = keras.optimizers.Adam(0.01)
            self.optimizer.build(self.model.trainable_variables)
            self.metrics = [keras.metrics.SparseCategoricalAccuracy(), keras.metrics.Mean()]
        self.loss_object = keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction=None
        )
        self.step = 0
        self.train = jd.function(self._distributed)

    def _replica(self, x, y):
        model, tv = self.model, [v.value for v in self.model.trainable_variables]
        ntv = [v.value for v in model.non_trainable_variables]

        def loss_fn(tv):
            logits, _ = model.stateless_call(tv, ntv, x, training=True)
            per_example = self.loss_object(y, logits)
            loss = jd.nn.compute_average_loss(per_example, global_batch_size=BATCH)
            return loss, (logits, per_example)

        (loss, (logits, per_example)), grads = jax.value_and_grad(loss_fn, has_aux=True)(tv)
        self.optimizer.apply_gradients(zip(grads, model.trainable_variables))
        self.metrics[0].update_state(y, logits)
        self.metrics[1].update_state(per_example)
        return loss

    def _distributed(self, x, y):
        return self.strategy.reduce("SUM", self.strategy.run(self._replica, args=(x, y)), axis=None)

    def fit(self, batches):
        for x, y in self.strategy.experimental_distribute_dataset(batches):
            self.train(x, y)
            self.step += 1

    def state(self) -> dict:
        """The recipe's checkpoint: NumPy arrays (a metric's variables read as their sum)."""
        return {
            "model": [np.asarray(v) for v in self.model.variables],
            "optimizer": [np.asarray(v) for v in self.optimizer.variables],
            "metrics": [np.asarray(v) for m in self.metrics for v in m.variables],
            "step": np.asarray(self.step),
        }

    def load(self, state: dict) -> None:
        variables = [
            *self.model.variables,
            *self.optimizer.variables,
            *(v for m in self.metrics for v in m.variables),
        ]
        for v, a in zip(variables, [*state["model"], *state["optimizer"], *state["metrics"]]):
            v.assign(a)
        self.step = int(state["step"])  # a 0-d int64 array as orbax restores it

    def results(self) -> list[float]:
        return [float(m.result()) for m in self.metrics]


def manager(directory, max_to_keep=2):
    return ocp.CheckpointManager(
        directory, options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep)
    )


def restore_latest(mngr, into: Trainer) -> None:
    template = into.state()
    into.load(mngr.restore(mngr.latest_step(), args=ocp.args.StandardRestore(template)))


def assert_same_state(got: dict, want: dict) -> None:
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("max_to_keep", [1, 2, 3])
def test_max_to_keep_keeps_the_newest_and_latest_names_the_newest(tmp_path, max_to_keep):
    trainer = Trainer(mirrored(2))
    with manager(tmp_path / "ckpt", max_to_keep) as mngr:
        assert mngr.latest_step() is None  # TF: latest_checkpoint is None before a save
        assert mngr.all_steps() == []
        for batch in BATCHES[:5]:
            trainer.fit([batch])
            mngr.save(trainer.step, args=ocp.args.StandardSave(trainer.state()))
        mngr.wait_until_finished()
        newest = list(range(5 - max_to_keep + 1, 6))  # steps 1..5 saved
        assert list(mngr.all_steps()) == newest
        assert mngr.latest_step() == 5
        assert sorted(int(p) for p in os.listdir(tmp_path / "ckpt") if p.isdigit()) == newest


def test_restore_from_latest_resumes_exactly(tmp_path):
    """Train 3 steps, save, train on; a new trainer restored from the latest checkpoint and
    trained on the same batches ends where the uninterrupted one does, bit for bit."""
    strategy = mirrored(2)
    first = Trainer(strategy)
    with manager(tmp_path / "ckpt") as mngr:
        first.fit(BATCHES[:3])
        saved, saved_results = first.state(), first.results()
        mngr.save(first.step, args=ocp.args.StandardSave(saved))
        mngr.wait_until_finished()
        first.fit(BATCHES[3:])

        resumed = Trainer(strategy)
        assert resumed.step == 0 and int(resumed.optimizer.iterations.value) == 0
        restore_latest(mngr, resumed)
    assert resumed.step == 3 and type(resumed.step) is int
    assert int(resumed.optimizer.iterations.value) == 3
    assert resumed.results() == saved_results
    assert_same_state(resumed.state(), saved)
    resumed.fit(BATCHES[3:])
    assert resumed.step == first.step == len(BATCHES)
    assert resumed.results() == first.results()
    assert_same_state(resumed.state(), first.state())


@pytest.mark.parametrize("replicas", [1, 2, 4, 8])
def test_saved_under_2_replicas_restores_the_same_values(tmp_path, replicas):
    """TF restores a checkpoint into any replica count: mirrored variables as saved, a metric's
    sync-on-read totals spread so that their sum (the result) is the saved one."""
    saver = Trainer(mirrored(2))
    saver.fit(BATCHES[:3])
    saved, saved_results = saver.state(), saver.results()
    with manager(tmp_path / "ckpt") as mngr:
        mngr.save(saver.step, args=ocp.args.StandardSave(saved))
        mngr.wait_until_finished()
        other = Trainer(mirrored(replicas))
        restore_latest(mngr, other)
    assert other.step == 3
    assert int(other.optimizer.iterations.value) == 3
    assert other.results() == saved_results
    assert_same_state(other.state(), saved)
    # it trains on: the same batches from the same state give the 2-replica answer up to rounding
    other.fit(BATCHES[3:])
    saver.fit(BATCHES[3:])
    for a, b in zip(other.model.get_weights(), saver.model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_a_numpy_scalar_in_the_template_is_what_fails(tmp_path):
    """Why the recipe keeps the step as a 0-d array: orbax restores a saved `int` or NumPy
    scalar as a 0-d int64 array through a template of arrays, and refuses a template that holds
    a NumPy scalar."""
    with manager(tmp_path / "ckpt") as mngr:
        mngr.save(1, args=ocp.args.StandardSave({"step": np.int64(7)}))
        mngr.wait_until_finished()
        with pytest.raises(ValueError, match="Unsupported type"):
            mngr.restore(1, args=ocp.args.StandardRestore({"step": np.int64(0)}))
        step = mngr.restore(1, args=ocp.args.StandardRestore({"step": np.asarray(0)}))["step"]
    assert type(step) is np.ndarray and step.dtype == np.int64 and int(step) == 7
