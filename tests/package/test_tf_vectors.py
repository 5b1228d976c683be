"""Test vectors recorded from TensorFlow 2.21 (tests/tf_oracle/answers.json), 4 replicas."""

import json
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdist as jd

ANSWERS = json.loads((pathlib.Path(__file__).parents[1] / "tf_oracle" / "answers.json").read_text())
SPLITS = sorted(k for k in ANSWERS if k.startswith("dataset.split_lengths_"))


def strategy4():
    return jd.MirroredStrategy([f"/cpu:{i}" for i in range(4)])


@pytest.mark.parametrize("case", SPLITS)
def test_dataset_split_lengths_match_tf(case):
    n, b = map(int, re.match(r"dataset.split_lengths_n(\d+)_b(\d+)", case).groups())
    s = strategy4()
    data = [np.arange(i, min(i + b, n)) for i in range(0, n, b)]
    got = [
        [len(v) for v in s.experimental_local_results(x)]
        for x in s.experimental_distribute_dataset(data)
    ]
    assert got == ANSWERS[case]["result"]


@pytest.mark.parametrize("n", [1, 3, 5])
def test_partial_batch_reductions_match_tf(n):
    s = strategy4()
    x = next(iter(s.experimental_distribute_dataset([np.arange(n)])))

    def tf(kind):
        return ANSWERS[f"dataset.{kind}_n{n}"]["result"]["value"]

    mean, total = s.reduce("MEAN", x, axis=0), s.reduce("SUM", x, axis=0)
    assert float(mean) == pytest.approx(tf("reduce_mean_axis0"))
    assert int(total) == tf("reduce_sum_axis0")
    # TF: the MEAN of an integer batch is a float (float64 there, float32 without x64)
    assert jnp.issubdtype(mean.dtype, jnp.floating) and jnp.issubdtype(total.dtype, jnp.integer)
    assert s.gather(x, axis=0).tolist() == tf("gather_axis0")


def test_run_outputs_collapse_like_tf():
    s = strategy4()
    assert s.run(lambda: 3) == ANSWERS["run.python_constant"]["result"] == 3
    assert s.run(lambda x: x, args=([1.0, 2.0],)) == ANSWERS["run.python_list_arg"]["result"]["out"]


def test_onedevice_reductions_match_tf():
    """OneDeviceStrategy.reduce's doc example (seed 003), with TF's answers."""
    od = jd.OneDeviceStrategy("/cpu:0")
    t = jnp.arange(10)
    assert (
        od.reduce(jd.ReduceOp.SUM, t, axis=None).tolist()
        == ANSWERS["onedevice.reduce_sum_range10_axisNone"]["result"]["value"]
    )
    assert (
        od.reduce("SUM", t, axis=0)
        == ANSWERS["onedevice.reduce_sum_range10_axis0"]["result"]["value"]
    )
    assert (
        float(od.reduce("MEAN", t, axis=0))
        == ANSWERS["onedevice.reduce_mean_range10_axis0"]["result"]["value"]
    )
    assert (
        od.reduce("MEAN", t, axis=None).tolist()
        == ANSWERS["onedevice.reduce_mean_range10_axisNone"]["result"]["value"]
    )


def _tf_values(result):
    return [v["value"] for v in result["values"]]


@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])
def test_collective_gradients_on_a_partial_batch_match_tf(jitted):
    """Issue 19: TF's gradient of all_reduce / all_gather inside a tape on a partial batch is
    the collective of the cotangents over every replica, empty ones included."""
    s = strategy4()

    def run(step, rows):
        x = next(iter(s.experimental_distribute_dataset([np.asarray(rows, np.float32)])))
        call = (
            jax.jit(lambda x: s.run(step, args=(x,)))
            if jitted
            else (lambda x: s.run(step, args=(x,)))
        )
        return [float(v) for v in s.experimental_local_results(call(x))]

    def reduce_grad(x):
        ctx = jd.get_replica_context()
        return jax.grad(lambda w: ctx.all_reduce("SUM", jnp.sum(x * w)))(jnp.float32(1.0))

    def gather_grad(x):
        coef = jnp.asarray([[1.0], [2.0], [3.0]])
        ctx = jd.get_replica_context()
        return jax.grad(lambda w: jnp.sum(ctx.all_gather(x * w, axis=0) * coef))(jnp.float32(1.0))

    partial = _tf_values(ANSWERS["grad.all_reduce_sum_partial_4r"]["result"])
    assert run(reduce_grad, [[1.0], [2.0]]) == partial == [4.0, 8.0, 0.0, 0.0]
    assert partial == _tf_values(ANSWERS["grad.all_reduce_sum_partial_4r_tf_function"]["result"])
    full = _tf_values(ANSWERS["grad.all_reduce_sum_full_4r"]["result"])
    assert run(reduce_grad, [[1.0]] * 4) == full
    gathered = _tf_values(ANSWERS["grad.all_gather_partial_4r"]["result"]["grad"])
    assert run(gather_grad, [[1.0], [2.0], [3.0]]) == gathered == [4.0, 16.0, 36.0, 0.0]
