"""Checkpointing with orbax: save once, restore anywhere (TF's bar), on 1, 2, 4 and 8 replicas.

A synchronized training state (what `strategy.run` returns after an all-reduced
update) is saved as one copy, `experimental_local_results(state)[0]`, as TF saves a
mirrored variable's value; it restores into a strategy of any replica count
(`experimental_distribute_values_from_function`) or into plain single-device code.
A state saved as it is (stacked `PerReplica` leaves) restores into the same strategy.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import REPLICAS, mirrored, require

import jaxdist as jd

ocp = require("orbax.checkpoint")


_RNG = np.random.default_rng(0)
PARAMS = {"w": _RNG.normal(size=(4, 2)).astype(np.float32), "b": np.zeros(2, np.float32)}
DATA = _RNG.normal(size=(8, 4)).astype(np.float32)  # one global batch, split over the replicas


def train(s, steps=3, params=None):
    """A few SGD steps of a tiny model (on the same global batch of 8 rows whatever the
    replica count: a MEAN of per-replica mean gradients is the global mean gradient);
    returns the state as `run` returned it."""
    params = jax.tree.map(jnp.asarray, PARAMS) if params is None else params
    x = next(iter(s.experimental_distribute_dataset([DATA])))

    def step(p, x):
        g = jax.grad(lambda p: jnp.mean(jnp.tanh(x @ p["w"] + p["b"]) ** 2))(p)
        g = jd.get_replica_context().all_reduce("MEAN", g)
        return jax.tree.map(lambda a, b: a - 0.1 * b, p, g)

    state = {"params": params, "step": 0}
    for i in range(steps):
        state = {"params": s.run(step, args=(state["params"], x)), "step": i + 1}
    return state


def numpy_train(steps):
    """`train`'s steps in NumPy (float64): the global mean gradient over DATA's 8 rows."""
    w, b = PARAMS["w"].astype(np.float64), PARAMS["b"].astype(np.float64)
    x = DATA.astype(np.float64)
    for _ in range(steps):
        t = np.tanh(x @ w + b)
        d = 2 * t * (1 - t**2) / t.size  # d mean(t^2) / dz
        w, b = w - 0.1 * x.T @ d, b - 0.1 * d.sum(0)
    return {"w": w, "b": b}


def host(tree):
    return jax.tree.map(np.asarray, tree)


def same_leaves(got, want, rtol=1e-7):
    """Every leaf equal (not only ``w``), and the same tree."""
    assert jax.tree.structure(got) == jax.tree.structure(want)
    assert jax.tree.leaves(got)
    for a, b in zip(jax.tree.leaves(host(got)), jax.tree.leaves(host(want))):
        np.testing.assert_allclose(a, b, rtol=rtol)


@pytest.mark.parametrize("saved, restored", [(8, 1), (1, 8), (4, 2), (2, 4)])
def test_save_once_restore_into_another_replica_count(tmp_path, saved, restored):
    src = mirrored(saved)
    state = train(src)
    one_copy = src.experimental_local_results(state)[0]
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(tmp_path / "ckpt", one_copy)
    with ocp.StandardCheckpointer() as ckptr:
        plain = ckptr.restore(tmp_path / "ckpt")
    dst = mirrored(restored)
    resumed = dst.experimental_distribute_values_from_function(lambda ctx: plain["params"])
    for copy in dst.experimental_local_results(resumed):
        same_leaves(copy, one_copy["params"])
    assert int(plain["step"]) == 3
    # Training goes on in the new strategy from the restored values: two more steps there
    # give what five steps in the saving strategy give (the data is the same global batch).
    more = train(dst, steps=2, params=resumed)
    want = train(src, steps=5)
    for copy in dst.experimental_local_results(more["params"]):
        same_leaves(copy, src.experimental_local_results(want["params"])[0], rtol=1e-5)
        for k, v in numpy_train(5).items():  # independently of jaxdist
            np.testing.assert_allclose(np.asarray(copy[k]), v, rtol=1e-5, atol=1e-6)


def test_restore_into_plain_single_device_code(tmp_path):
    s = mirrored(8)
    state = train(s)
    one_copy = s.experimental_local_results(state)[0]
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(tmp_path / "ckpt", one_copy)
        plain = ckptr.restore(tmp_path / "ckpt")
    apply = jax.jit(lambda p, x: x @ p["w"] + p["b"])
    x = jnp.ones((3, 4))
    np.testing.assert_allclose(apply(plain["params"], x), apply(one_copy["params"], x))
    assert all(len(a.devices()) == 1 for a in jax.tree.leaves(plain["params"]))


@pytest.mark.parametrize("n", REPLICAS)
def test_a_state_saved_as_run_returned_it_restores_into_the_same_strategy(tmp_path, n):
    s = mirrored(n)
    state = train(s)
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(tmp_path / "ckpt", state)
        target = jax.eval_shape(lambda: state)  # the distributed structure, no data
        restored = ckptr.restore(tmp_path / "ckpt", target)
    assert jax.tree.structure(restored) == jax.tree.structure(state)
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    if n > 1:
        assert isinstance(restored["params"]["w"], jd.PerReplica)
