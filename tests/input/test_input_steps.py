"""The steps of distributed input kept in step across workers (`jaxdist._input.steps`), run in
one process: the exchange is then the identity, so the chunked agreement (1, 2, 4, 8 steps per
exchange) must give exactly the elements of the plain path. The multi-worker behaviour itself
is tested in tests/cluster/test_multi_worker.py (workers whose datasets end at different steps)."""

import itertools

import numpy as np
import pytest

import jaxdist as jd
from jaxdist._input.place import Placer
from jaxdist._input.steps import MAX_CHUNK, CombinedSteps, SplitSteps, synced


def _local(strategy, element):
    return [np.asarray(x).tolist() for x in strategy.experimental_local_results(element)]


@pytest.mark.parametrize("steps", [1, 2, 3, 7, 8, 20])
def test_split_steps_in_step_give_the_plain_elements(steps):
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1", "/cpu:2", "/cpu:3"])
    batches = [np.arange(8 * i, 8 * i + 8, dtype=np.float32) for i in range(steps - 1)]
    batches.append(np.arange(6, dtype=np.float32))  # a partial last batch: [2, 2, 2, 0]
    plain = [_local(s, x) for x in s.experimental_distribute_dataset(batches)]
    placer = Placer(s.extended.replicas, True)
    spec = s.experimental_distribute_dataset(batches).element_spec
    kept = [_local(s, x) for x in synced(iter(batches), SplitSteps(placer, "b", spec), True)]
    assert kept == plain and len(kept) == steps
    assert kept[-1] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], []]


def test_combined_steps_place_empty_replicas_with_the_spec():
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    placer = Placer(s.extended.replicas, True)
    elements = [[np.ones((2, 3), np.float32), None], [np.zeros((1, 3), np.float32)] * 2]
    steps = CombinedSteps(placer, "e", True, None)  # the spec: for a worker with no element
    out = list(synced(iter(elements), steps, True))
    assert [[np.shape(x) for x in s.experimental_local_results(o)] for o in out] == [
        [(2, 3), (0, 3)],
        [(1, 3), (1, 3)],
    ]
    assert float(s.reduce("SUM", out[0], axis=0).sum()) == 6.0


@pytest.mark.parametrize("ahead", [0, 1])
def test_an_endless_source_is_read_at_most_a_chunk_ahead(ahead):
    """Up to MAX_CHUNK host batches ahead; none with a buffer size of 0 (Keras asks that)."""
    s = jd.MirroredStrategy(["/cpu:0", "/cpu:1"])
    placer = Placer(s.extended.replicas, True)
    read = []

    def endless():
        for i in itertools.count():
            read.append(i)
            yield np.full(2, i, np.float32)

    spec = s.experimental_distribute_dataset([np.ones(2, np.float32)]).element_spec
    it = synced(endless(), SplitSteps(placer, "b", spec, ahead), True)
    first = next(it)
    assert _local(s, first) == [[0.0], [0.0]] and len(read) == 1  # the first step at once
    taken = list(itertools.islice(it, 40))
    assert [_local(s, x)[0][0] for x in taken] == list(range(1, 41))
    assert len(read) == 41 if ahead == 0 else 41 < len(read) <= 41 + MAX_CHUNK
