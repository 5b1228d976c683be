"""The sweep's multi-worker axis: fixed draws (2 workers x 2 devices) of the custom-loop epoch of
tests/package/test_sweep_split.py, whose answer is one device's (multiworker_worker.SWEEP_DRAWS: last
batches that leave a worker or a replica with no row, one batch, drop_remainder; eager and
jitted). Starting the processes costs seconds, so the draws are few and fixed."""

import sys
from pathlib import Path

import numpy as np
import pytest
from multiworker_worker import LR, SWEEP_DRAWS
from test_sweep_split import W0, global_batches, one_device

sys.path.insert(0, str(Path(__file__).parents[1] / "cluster"))  # test_multi_worker's folder
from test_multi_worker import _results, _run_all  # noqa: E402

pytestmark = pytest.mark.multiworker


def test_fixed_draws_across_two_workers_are_one_device():
    # the worker's constants
    assert LR == 0.1 and W0.tolist() == np.float32([0.5, -0.25, 0.1]).tolist()
    results = _results(_run_all({"worker": 2}, "sweep", timeout=60))
    for worker in (0, 1):
        got = results[("worker", worker)]
        assert len(got) == len(SWEEP_DRAWS)
        for draw, out in zip(SWEEP_DRAWS, got):
            rows, batch, drop, _ = draw
            want_w, want_losses = one_device(global_batches(rows, batch, drop), batch)
            np.testing.assert_allclose(
                out["losses"], want_losses, rtol=2e-5, atol=1e-6, err_msg=str(draw)
            )
            np.testing.assert_allclose(out["w"], want_w, rtol=2e-5, atol=1e-6, err_msg=str(draw))
