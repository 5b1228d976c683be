"""The sweep's Keras axis: fit (with validation data) / evaluate / predict under a strategy at
drawn sizes, against TF's recorded answers (the seeded draws of keras_grid.py's ``sweep``,
rows 1..300, batch 1..70, R = 2, 3, 4, 8) and against Keras on one device wherever the answer
cannot depend on the split: one replica, or every batch splitting evenly (then the mean of the
replicas' local means is the global mean). Each draw compiles Keras' steps, so CI takes a few
draws (conftest.py's ``ci`` profile) and ``make sweep`` more.
"""

import os

import pytest
from conftest import mirrored, require

require("keras")
require("hypothesis")
from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_keras_sizes import GRID, TF_OK, check, parse, run_case  # noqa: E402

# a Keras draw costs seconds (compiles): CI takes 2 (plus the @example), make sweep a tenth
EXAMPLES = max(2, settings().max_examples // 10) if os.environ.get("JAXDIST_SWEEP") else 2
SWEPT = sorted(k for k in TF_OK if k.startswith("dense.sgd.plain."))


@settings(max_examples=EXAMPLES)
@given(key=st.sampled_from(SWEPT))
@example(key="dense.sgd.plain.n107.b12.r8")  # last batch 11: 2, 2, 2, 2, 2, 1, 0, 0
def test_keras_at_drawn_sizes_matches_tf(key):
    model_name, opt, variant, rows, batch, r = parse(key)
    check(run_case(mirrored(r), model_name, opt, variant, rows, batch), GRID[key])


@settings(max_examples=EXAMPLES)
@given(
    replicas=st.sampled_from((1, 2, 3, 4, 8)),
    per=st.integers(1, 8),
    full=st.integers(0, 4),
    last=st.integers(0, 8),
    model_name=st.sampled_from(("dense", "syncbn")),
)
@example(replicas=8, per=1, full=0, last=1, model_name="syncbn")  # one batch of 8 rows
def test_keras_with_even_splits_is_one_device(replicas, per, full, last, model_name):
    """Every batch (``per * replicas`` rows, and a last one of ``last * replicas``) splits evenly:
    one device's answer (syncbn: the global batch's statistics, as batch norm on one device)."""
    batch = per * replicas
    rows = batch * full + min(last, per) * replicas
    if rows == 0:
        rows = batch
    one = "bn" if model_name == "syncbn" else model_name
    want = run_case(None, one, "sgd", "plain", rows, batch)
    check(run_case(mirrored(replicas), model_name, "sgd", "plain", rows, batch), want)


@pytest.mark.parametrize("key", ["dense.sgd.plain.n41.b32.r8"])
def test_the_keras_sweep_can_fail(key):
    """TF's answer at an uneven split is not one device's: the check tells them apart."""
    model_name, opt, variant, rows, batch, r = parse(key)
    one = run_case(None, model_name, opt, variant, rows, batch)
    with pytest.raises(AssertionError):
        check(one, GRID[key])
