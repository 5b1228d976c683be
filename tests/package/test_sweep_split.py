"""The sweep's data-size axis for custom loops: any rows (1..300), batch (1..70), replica count
(1, 2, 3, 4, 8), drop_remainder and path (eager ``run``, jitted ``run``,
``distribute_datasets_from_function``). Each draw trains a linear model for an epoch whose loss
is the global-batch mean (``compute_average_loss`` with the global batch size), so the answer is
one device's, computed with NumPy; and every step's split is TF's (``ceil(b / R)`` consecutive
rows per replica, the last ones possibly none).

CI runs a bounded, derandomized number of draws (the ``ci`` profile of conftest.py);
``make sweep`` runs thousands (``JAXDIST_SWEEP=1``).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import mirrored, require

# the sweep's jitted step closes over constants it never changes: the frozen-state warning is true and not what it checks
pytestmark = [
    pytest.mark.filterwarnings(
        "ignore:strategy.run\\(.*\\) is traced inside your own jax.jit:RuntimeWarning"
    ),
]


hypothesis = require("hypothesis")
from hypothesis import example, given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import jaxdist as jd  # noqa: E402

REPLICAS = (1, 2, 3, 4, 8)
PATHS = ("eager", "jit", "dsfn")
LR = 0.1
_rng = np.random.default_rng(7)
X = _rng.normal(size=(300, 3)).astype(np.float32)
Y = _rng.normal(size=(300,)).astype(np.float32)
W0 = np.array([0.5, -0.25, 0.1], np.float32)


def tf_split(rows, replicas):
    """TF's split of a batch of ``rows``: ceil(rows / replicas) each, in order."""
    each = -(-rows // replicas)
    return [min(each, max(0, rows - i * each)) for i in range(replicas)]


def global_batches(rows, batch, drop):
    """The global batches one device sees: (start, size) of each."""
    out = [(s, min(batch, rows - s)) for s in range(0, rows, batch)]
    return out[:-1] if drop and out and out[-1][1] < batch else out


def dsfn_batches(rows, per, replicas, drop):
    """distribute_datasets_from_function (one worker): replica i of a step reads the step's i-th
    per-replica batch; a step's rows are those batches, consecutive."""
    mine = global_batches(rows, per, drop)
    steps = [mine[i : i + replicas] for i in range(0, len(mine), replicas)]
    sizes = [[n for _, n in s] + [0] * (replicas - len(s)) for s in steps]  # none left: 0 rows
    return [(s[0][0], sum(n for _, n in s)) for s in steps], sizes


def one_device(steps, global_batch):
    """NumPy: SGD on the mean squared error, each step's loss divided by the global batch."""
    w, losses = W0.astype(np.float64), []
    for start, n in steps:
        x, y = X[start : start + n].astype(np.float64), Y[start : start + n].astype(np.float64)
        err = x @ w - y
        losses.append(float(np.sum(err**2) / global_batch))
        w = w - LR * (2 * x.T @ err / global_batch)
    return w, losses


def make_step(strategy, global_batch):
    def replica(w, batch):
        x, y = batch

        def loss(w):
            return jd.nn.compute_average_loss((x @ w - y) ** 2, global_batch_size=global_batch)

        value, grad = jax.value_and_grad(loss)(w)
        grad = jd.get_replica_context().all_reduce(jd.ReduceOp.SUM, grad)
        return value, w - LR * grad

    def step(w, batch):
        value, w = strategy.run(replica, args=(w, batch))
        loss = strategy.reduce(jd.ReduceOp.SUM, value, axis=None)
        return loss, strategy.experimental_local_results(w)[0]

    return step


def sweep(rows, batch, replicas, drop, path):
    s = mirrored(replicas)
    if path == "dsfn":
        per = -(-batch // replicas)
        global_batch = per * replicas
        steps, sizes = dsfn_batches(rows, per, replicas, drop)

        def dataset_fn(ctx):
            assert ctx.get_per_replica_batch_size(global_batch) == per
            return [(X[a : a + n], Y[a : a + n]) for a, n in global_batches(rows, per, drop)]

        dist = s.distribute_datasets_from_function(dataset_fn)
    else:
        global_batch = batch
        steps = global_batches(rows, batch, drop)
        sizes = [tf_split(n, replicas) for _, n in steps]
        dist = s.experimental_distribute_dataset([(X[a : a + n], Y[a : a + n]) for a, n in steps])
    step = make_step(s, global_batch)
    step = jax.jit(step) if path == "jit" else step
    w, losses, got_sizes = jnp.asarray(W0), [], []
    for x, y in dist:
        got_sizes.append([int(np.shape(p)[0]) for p in s.experimental_local_results(x)])
        loss, w = step(w, (x, y))
        losses.append(float(loss))
    assert got_sizes == sizes, "rows per replica, per step"
    want_w, want_losses = one_device(steps, global_batch)
    np.testing.assert_allclose(losses, want_losses, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(w), want_w, rtol=2e-5, atol=1e-6)


@given(
    rows=st.integers(1, 300),
    batch=st.integers(1, 70),
    replicas=st.sampled_from(REPLICAS),
    drop=st.booleans(),
    path=st.sampled_from(PATHS),
)
@example(rows=33, batch=32, replicas=8, drop=False, path="jit")  # a last batch of one row
@example(rows=9, batch=8, replicas=8, drop=False, path="eager")
@example(rows=10, batch=4, replicas=3, drop=False, path="jit")  # every batch: 2, 2, 0
@example(rows=1, batch=70, replicas=8, drop=False, path="dsfn")  # one row in all
@example(rows=5, batch=70, replicas=2, drop=True, path="eager")  # no batch at all
def test_custom_loop_over_any_split_is_one_device(rows, batch, replicas, drop, path):
    sweep(rows, batch, replicas, drop, path)


@pytest.mark.parametrize("path", PATHS)
def test_the_sweep_can_fail(path):
    """The sweep's check is not vacuous: a wrong global batch size is caught."""
    with pytest.raises(AssertionError):
        s = mirrored(2)
        step = make_step(s, 7)  # the answer divides by 8
        dist = s.experimental_distribute_dataset([(X[:8], Y[:8])])
        w = jnp.asarray(W0)
        for batch in dist:
            _, w = step(w, batch)
        np.testing.assert_allclose(np.asarray(w), one_device([(0, 8)], 8)[0], rtol=2e-5)
