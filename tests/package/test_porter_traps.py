"""A porter's first hour: traps that were silent (or worded for someone else) are loud, and the
docs' advice is what jaxdist does.

Expected values come from the replica count and from one device's arithmetic, and TF's
behaviour from its recorded answers (tests/tf_oracle), never from jaxdist's own output.
"""

import functools
import json
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import mirrored

import jaxdist as jd

ROOT = pathlib.Path(__file__).resolve().parents[2]
ANSWERS = json.loads((ROOT / "tests" / "tf_oracle" / "answers.json").read_text())


def ids(strategy):
    """A `PerReplica` holding each replica's id as a float32 scalar."""
    return strategy.experimental_distribute_values_from_function(
        lambda ctx: jnp.float32(ctx.replica_id_in_sync_group)
    )


# -- a bare array is not a dataset ---------------------------------------------------------


@pytest.mark.parametrize("make", [np.ones, jnp.ones], ids=["numpy", "jax"])
def test_a_bare_array_given_as_the_dataset_is_a_type_error(strategy, make):
    x = make((64, 3), np.float32)
    with pytest.raises(TypeError) as info:
        strategy.experimental_distribute_dataset(x)
    text = str(info.value)
    assert text.startswith("dataset must be an iterable of batches, not one array")
    assert "of shape (64, 3)" in text and "[x]" in text and "NumpyDataset(x).batch(B)" in text


def test_a_bare_array_from_dataset_fn_is_a_type_error():
    s = mirrored(2)
    for dataset_fn in (lambda ctx: np.ones((8, 3)), lambda ctx: lambda: np.ones((8, 3))):
        with pytest.raises(TypeError, match=r"not one array .* shape \(8, 3\)"):
            s.distribute_datasets_from_function(dataset_fn)


def test_what_the_array_error_advises_works(strategy):
    """``[x]`` is one global batch, ``NumpyDataset(x).batch(B)`` batches of B: every row once."""
    n = strategy.num_replicas_in_sync
    x = np.arange(64.0 * 3, dtype=np.float32).reshape(64, 3)
    (one,) = list(strategy.experimental_distribute_dataset([x]))
    assert [p.shape for p in strategy.experimental_local_results(one)] == [(64 // n, 3)] * n
    steps = list(strategy.experimental_distribute_dataset(jd.NumpyDataset(x).batch(16)))
    assert len(steps) == 4
    got = np.concatenate([np.concatenate(strategy.experimental_local_results(b)) for b in steps])
    np.testing.assert_array_equal(got, x)


def test_datasets_that_are_not_arrays_still_pass():
    """A list, a generator function, a `NumpyDataset` and unbatched scalars from a dataset_fn."""
    s = mirrored(2)
    assert len(list(s.experimental_distribute_dataset([np.ones(4)] * 3))) == 3
    assert len(list(s.experimental_distribute_dataset(lambda: iter([np.ones(4)] * 2)))) == 2
    assert len(list(s.experimental_distribute_dataset(jd.NumpyDataset(np.ones(8)).batch(4)))) == 2
    scalars = list(
        s.distribute_datasets_from_function(lambda ctx: [np.float32(i) for i in range(4)])
    )
    assert len(scalars) == 2


# -- the default strategy's reduce of another strategy's value -------------------------------


def test_default_strategy_reduce_of_a_distributed_value_says_no_scope_is_active():
    s = mirrored(8)
    v = ids(s)
    calls = {
        "strategy.reduce": lambda: jd.get_strategy().reduce("SUM", v, axis=None),
        "strategy.gather": lambda: jd.get_strategy().gather(v, axis=0),
        "strategy.extended.reduce_to": lambda: jd.get_strategy().extended.reduce_to(
            "SUM", v, "/cpu:0"
        ),
    }
    for what, call in calls.items():
        with pytest.raises(ValueError) as info:
            call()
        text = str(info.value)
        assert text.startswith(f"{what}: no strategy scope is active"), text
        assert "default strategy" in text and "has 8 components" in text
        assert "with strategy.scope():" in text
    with s.scope():  # the fix the message gives
        assert float(jd.get_strategy().reduce("SUM", v, axis=None)) == sum(range(8))
    assert float(s.reduce("SUM", v, axis=None)) == sum(range(8))


def test_another_strategys_mismatch_keeps_its_own_message():
    v = ids(mirrored(8))
    with pytest.raises(ValueError, match="has 8 components, but the strategy has 2 replicas"):
        mirrored(2).reduce("SUM", v, axis=None)


# -- float() and format() of distributed values ----------------------------------------------


def test_format_of_a_per_replica_names_strategy_reduce():
    s = mirrored(2)
    pr = ids(s)
    assert ANSWERS["mirrored_as_tensor.perreplica_scalar_eager"]["result"]["'%.1f' % x"].startswith(
        "error:TypeError"
    )
    formats = (lambda: f"{pr:.4f}", lambda: format(pr, ".1f"), lambda: "{:.2f}".format(pr))  # noqa: UP032
    for call in formats:
        with pytest.raises(TypeError, match=r"of a PerReplica: .*strategy\.reduce"):
            call()
    with pytest.raises(TypeError, match=r"float\(strategy\.reduce"):
        float(pr)
    assert f"{pr}" == str(pr) and str(pr).startswith("PerReplica:")
    fixed = f"{s.reduce('SUM', pr, axis=None):.4f}"  # what the message advises
    assert fixed == "1.0000"  # 0 + 1


@pytest.mark.parametrize("n", [1, 2, 8])
def test_float_and_format_of_a_mirrored_are_tf_type_errors_naming_the_read(n):
    """TF: ``float(m)``, ``int(m)`` and ``'%.1f' % m`` of a Mirrored are TypeErrors (recorded);
    jaxdist's say how to read the value every replica holds."""
    recorded = ANSWERS["mirrored_as_tensor.mirrored_scalar_eager"]["result"]
    assert all(recorded[k].startswith("error:TypeError") for k in ("float(x)", "int(x)"))
    s = mirrored(n)
    m = jd.Mirrored(tuple(jnp.float32(2.5) for _ in range(n)))
    if n > 1:
        m = s.extended.reduce_to("SUM", ids(s), ids(s))  # an all-reduce: 0 + 1 + ... + n-1
    value = sum(range(n)) if n > 1 else 2.5
    calls = [lambda: float(m), lambda: int(m), lambda: f"{m:.4f}", lambda: "%.1f" % m]  # noqa: UP031
    for call in calls:
        with pytest.raises(TypeError, match=r"of a Mirrored: .*jnp\.asarray\(value\)"):
            call()
    assert f"{m}" == str(m) and str(m).startswith("Mirrored:")
    assert f"{jnp.asarray(m):.4f}" == f"{value:.4f}" and float(jnp.asarray(m)) == value


# -- the advice on closing over numbers -------------------------------------------------------

WRONG_ADVICE = re.compile(
    r"make (?:a|the) number static,? close over|close over a number to make it static", re.I
)
PENDING = "jaxdist/_run/run.py"  # its module docstring, fixed where that module is edited


def advice_texts():
    """Every text a porting user reads: docs pages, notebooks' cells, the README, the package's
    docstrings and messages (whitespace folded, so a sentence across lines is one)."""
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    paths += sorted((ROOT / "jaxdist").rglob("*.py"))
    for path in paths:
        yield path.relative_to(ROOT).as_posix(), path.read_text()
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        yield path.relative_to(ROOT).as_posix(), "\n".join("".join(c["source"]) for c in cells)


def wrong_advice(text):
    return WRONG_ADVICE.findall(re.sub(r"\s+", " ", text))


def test_no_page_or_message_says_closing_over_a_number_makes_it_static():
    found = {p: wrong_advice(t) for p, t in advice_texts() if p != PENDING and wrong_advice(t)}
    assert not found, found


def test_the_run_module_docstring_no_longer_says_it():
    assert not wrong_advice((ROOT / PENDING).read_text())


def test_the_wrong_advice_pattern_finds_it():
    assert wrong_advice("To make a number static, close\n    over it (functools.partial).")
    assert wrong_advice("(bools are static; close over a number to make it static)")
    assert not wrong_advice("a number bound with functools.partial is static too")


def test_a_closed_over_number_is_read_on_every_call_and_partial_makes_it_static():
    """What the corrected docs say: a closure's number is re-read (one more compile at its
    first change), a number bound by `functools.partial` is static (a compile per value)."""
    s = mirrored(2)
    x = jnp.ones(())
    traces, scale = [], 2.0

    def closed(x):
        traces.append(1)
        return x * scale

    got = []
    for scale in (2.0, 3.0, 4.0, 5.0):  # noqa: B007 - the step reads the loop's variable
        got.append(float(s.experimental_local_results(s.run(closed, args=(x,)))[0]))
    assert got == [2.0, 3.0, 4.0, 5.0] and len(traces) == 2

    def bound(x, n):
        traces.append(1)
        return x * n

    traces.clear()
    for n in (2.0, 3.0, 4.0):
        out = s.run(functools.partial(bound, n=n), args=(x,))
        assert float(s.experimental_local_results(out)[0]) == n
    assert len(traces) == 3


# -- the docs' other facts -------------------------------------------------------------------


def test_the_default_cross_device_ops_are_as_the_guide_says():
    assert isinstance(jd.MirroredStrategy().extended.cross_device_ops, jd.NcclAllReduce)
    one = jd.OneDeviceStrategy("/cpu:0").extended.cross_device_ops
    assert isinstance(one, jd.ReductionToOneDevice)
    assert isinstance(jd.get_strategy().extended.cross_device_ops, jd.ReductionToOneDevice)
    guide = (ROOT / "docs" / "guides" / "cross-device-ops.md").read_text()
    assert "## The default" in guide and "`jd.MirroredStrategy()` uses `NcclAllReduce()`" in guide


def test_the_classifiers_name_every_python_the_readme_supports():
    readme = (ROOT / "README.md").read_text()
    low, high = map(int, re.search(r"Python 3\.(\d+) to 3\.(\d+)", readme).groups())
    pyproject = (ROOT / "pyproject.toml").read_text()  # read as text: tomllib is 3.11+
    named = set(re.findall(r'"Programming Language :: Python :: 3\.(\d+)"', pyproject))
    assert named == {str(v) for v in range(low, high + 1)}
    assert f'requires-python = ">=3.{low}"' in pyproject


def test_compute_average_loss_on_a_partial_batch_divides_by_the_global_batch():
    """A batch of 6 over 4 replicas ([2, 2, 2, 0]): the replicas' SUM is the rows' sum over the
    global batch passed (16), or over each replica's rows x 4 by default (TF's rules)."""
    s = mirrored(4)
    (part,) = list(s.experimental_distribute_dataset([np.arange(6.0, dtype=np.float32)]))

    def summed(global_batch_size):
        step = lambda x: jd.nn.compute_average_loss(x, global_batch_size=global_batch_size)  # noqa: E731
        return float(s.reduce("SUM", s.run(step, args=(part,)), axis=None))

    assert summed(16) == 15.0 / 16
    assert summed(None) == 15.0 / 8  # (0 + 1) / 8 + (2 + 3) / 8 + (4 + 5) / 8 + 0
    assert summed(None) != 15.0 / 6  # not the short batch's mean


@pytest.mark.parametrize("n", [2, 8])
def test_fold_in_the_replica_id_gives_each_replica_its_own_mask(n):
    s = mirrored(n)
    key = jax.random.key(3)
    (x,) = list(s.experimental_distribute_dataset([np.ones((8 * n, 4), np.float32)]))

    def mask(key, x):
        key = jax.random.fold_in(key, jd.get_replica_context().replica_id_in_sync_group)
        return jax.random.bernoulli(key, 0.5, x.shape)

    got = [np.asarray(m) for m in s.experimental_local_results(s.run(mask, args=(key, x)))]
    want = [
        np.asarray(jax.random.bernoulli(jax.random.fold_in(key, r), 0.5, (8, 4))) for r in range(n)
    ]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert len({g.tobytes() for g in got}) == n
    same = s.run(lambda k, x: jax.random.bernoulli(k, 0.5, x.shape), args=(key, x))
    assert len({np.asarray(m).tobytes() for m in s.experimental_local_results(same)}) == 1
