"""A value the host assigns to a sync-on-read variable (a metric's restored total, a Keras
variable made with ``synchronization="on_read"``) is spread over the replicas as TF spreads
it: ``value / replicas`` each for ``SUM`` (the sum read back is the value), ``value`` each for
``MEAN`` and ``ONLY_FIRST_REPLICA``. Before, every replica read the whole value, and a
restored metric total came back multiplied by the replica count, silently.

Expected values: TF 2.21's recorded answers (``vars.tfvar.on_read.*.host_assign.r2/r8`` in
tests/tf_oracle/answers.json) and NumPy sums of the batch.
"""

import json
import os
import pathlib

import numpy as np
import pytest
from conftest import mirrored

os.environ.setdefault("KERAS_BACKEND", "jax")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "jax":
    pytest.skip("the Keras integration needs the JAX backend", allow_module_level=True)

import jaxdist as jd  # noqa: E402

ANSWERS = json.loads((pathlib.Path(__file__).parents[1] / "tf_oracle" / "answers.json").read_text())


def _call(how, strategy, step, *args):
    run = lambda *a: strategy.run(step, args=a)  # noqa: E731
    return (jd.function(run) if how == "jd.function" else run)(*args)


@pytest.mark.parametrize("agg", ["sum", "mean", "only_first_replica"])
@pytest.mark.parametrize("n", (2, 8))
@pytest.mark.parametrize("how", ["eager", "jd.function"])
def test_a_host_assigned_on_read_value_is_each_replicas_as_tf_reads_it(how, n, agg):
    tf = ANSWERS[f"vars.tfvar.on_read.{agg}.host_assign.r{n}"]["result"]
    s = mirrored(n)
    with s.scope():
        v = keras.Variable(1.0, synchronization="on_read", aggregation=agg)
    v.assign(12.0)
    out = _call(how, s, lambda: v.value * 1.0)
    assert [float(x) for x in s.experimental_local_results(out)] == tf["local_results"]
    assert float(np.asarray(v.value)) == tf["host_read"]


@pytest.mark.parametrize("n", (1, 2, 4, 8))
@pytest.mark.parametrize("how", ["eager", "jd.function"])
def test_a_restored_metric_total_then_updated_in_the_step_reads_its_sum(how, n):
    s = mirrored(n)
    with s.scope():
        total, mean = keras.metrics.Sum(), keras.metrics.Mean()

    def step(x):
        total.update_state(x)
        mean.update_state(x)
        return x

    run = lambda b: s.run(step, args=(b,))  # noqa: E731
    f = jd.function(run) if how == "jd.function" else run
    x = np.arange(16, dtype=np.float32)
    (batch,) = s.experimental_distribute_dataset([x])
    total.variables[0].assign(10.0)  # (restored: a total of 10)
    mean.variables[0].assign(4.0)  # a total of 4 over 2 values
    mean.variables[1].assign(2.0)
    for k in (1, 2):
        f(batch)
        assert float(total.result()) == pytest.approx(10.0 + k * x.sum())
        assert float(mean.result()) == pytest.approx((4.0 + k * x.sum()) / (2.0 + k * 16))
    if how == "eager":  # the host's plain value and the step's per-replica rows: one trace
        assert jd.experimental.step_count(step) == 1


@pytest.mark.parametrize("n", (1, 2, 3, 8))
def test_a_metric_reset_between_epochs_keeps_one_trace_per_batch_shape(n):
    """TF's tutorial shape under ``jd.function``: a Keras metric updated in the replica step,
    ``reset_state()`` on the host after each epoch, a partial last batch. The host's plain
    zeros and the step's per-replica totals are one form of input (they were two: a second
    trace of every batch shape)."""
    s = mirrored(n)
    with s.scope():
        seen = keras.metrics.Sum()

    def step(x):
        seen.update_state(x)
        return x

    f = jd.function(lambda b: s.run(step, args=(b,)))
    x = np.arange(40, dtype=np.float32)
    batches = [x[i : i + 16] for i in range(0, 40, 16)]  # 16, 16, 8 rows
    data = s.experimental_distribute_dataset(batches)
    for _ in range(3):
        for batch in data:
            f(batch)
        assert float(seen.result()) == pytest.approx(float(x.sum()))
        seen.reset_state()
    assert f.experimental_get_tracing_count() == 2  # the two batch shapes
