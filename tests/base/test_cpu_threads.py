"""XLA's CPU thread pool: jaxdist sizes it (PJRT_NPROC = 2 x simulated devices) when it is
imported before JAX starts its backend, so un-blocked loops that the in-flight bound cannot
count (a jitted evaluation step returning only a reduced value) finish instead of aborting
at a collective's rendezvous. Each case runs in a fresh process (the pool is fixed when the
backend starts)."""

import os
import subprocess
import sys
import textwrap

import jax
import pytest

import jaxdist as jd

EVAL_LOOP = """
import jax, jax.numpy as jnp, numpy as np, jaxdist as jd
s = jd.MirroredStrategy()
n = s.num_replicas_in_sync
w = s.experimental_distribute_values_from_function(lambda c: jnp.ones((256, 256)))
batches = list(s.experimental_distribute_dataset([np.ones((64, 256), np.float32)] * 50))
@jax.jit
def eval_step(w, x):
    return s.reduce("SUM", s.run(lambda w, x: jnp.sum(jnp.tanh(x @ w @ w)), args=(w, x)), axis=None)
tot = 0.0
for i in range(2000):
    tot = tot + eval_step(w, batches[i % 50])
per_batch = 64 * 256 * float(np.tanh(256.0 * 256.0))
print("TOTAL", float(tot), 2000 * per_batch, jd.experimental.cpu_threads())
"""


def _run(code, devices, **env):
    full = dict(os.environ)
    full.pop("PJRT_NPROC", None)
    full.pop("JAXDIST_PJRT_NPROC", None)
    full.update(XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
    full.update(env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=240,
        env=full,
    )


@pytest.mark.parametrize("devices", [1, 2, 4, 8])
def test_unblocked_jitted_eval_loop_finishes(devices):
    p = _run(EVAL_LOOP, devices)
    assert p.returncode == 0, p.stderr[-2000:]
    line = next(x for x in p.stdout.splitlines() if x.startswith("TOTAL"))
    _, got, want, info = line.split(" ", 3)
    assert float(got) == pytest.approx(float(want), rel=1e-5)
    if 2 * devices > (os.cpu_count() or 1):
        assert f"'threads': {2 * devices}" in info and "'set_by_jaxdist': True" in info


def test_backend_started_first_warns_and_keeps_the_pool():
    code = """
    import warnings, jax
    jax.devices()
    import jaxdist as jd
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        jd.MirroredStrategy()
    print([str(x.message)[:40] for x in w], jd.experimental.cpu_threads())
    """
    p = _run(code, 8)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "XLA's CPU thread pool has" in p.stdout
    assert "'threads': None" in p.stdout and "'set_by_jaxdist': False" in p.stdout


@pytest.mark.parametrize("env", [{"PJRT_NPROC": "9"}, {"JAXDIST_CPU_THREADS": "0"}])
def test_the_users_setting_is_kept(env):
    code = "import jaxdist as jd; jd.MirroredStrategy(); print(jd.experimental.cpu_threads())"
    p = _run(code, 8, **env)
    assert p.returncode == 0, p.stderr[-2000:]
    want = "'threads': 9" if "PJRT_NPROC" in env else "'threads': None"
    assert want in p.stdout and "'set_by_jaxdist': False" in p.stdout


def test_this_suite_runs_with_a_sized_pool():
    """conftest imports jaxdist before the backend starts: 8 devices, 16 threads."""
    jax.devices()
    info = jd.experimental.cpu_threads()
    if os.environ.get("PJRT_NPROC") and not info["set_by_jaxdist"]:
        pytest.skip("PJRT_NPROC set by the environment")
    assert info == {"threads": 16, "set_by_jaxdist": True, "backend_started": True}


@pytest.mark.parametrize("devices, want", [(2, "'threads': 4"), (1, "'threads': None")])
def test_a_value_inherited_from_a_parent_jaxdist_is_sized_again(devices, want):
    """Workers launched from a process where jaxdist sized the pool for 8 devices."""
    code = "import jaxdist as jd; jd.MirroredStrategy(); print(jd.experimental.cpu_threads())"
    p = _run(code, devices, PJRT_NPROC="16", JAXDIST_PJRT_NPROC="16")
    assert p.returncode == 0, p.stderr[-2000:]
    assert want in p.stdout


@pytest.mark.parametrize("devices", [2, 8])
def test_xla_flags_set_after_the_backend_started_warns(devices):
    """XLA reads XLA_FLAGS once: set after JAX started, the process keeps one CPU device and a
    strategy silently had one replica; now the first strategy says why."""
    code = f"""
    import os, warnings, jax
    jax.devices()
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count={devices}"
    import jaxdist as jd
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        s = jd.MirroredStrategy()
    print(s.num_replicas_in_sync, [str(x.message) for x in w])
    """
    full = dict(os.environ, JAX_PLATFORMS="cpu")
    full.pop("XLA_FLAGS", None)
    p = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=240,
        env=full,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.startswith("1 ")
    assert f"XLA_FLAGS asks for {devices} simulated CPU devices, but this process has 1" in p.stdout
    assert "jax_num_cpu_devices" in p.stdout


def test_xla_flags_read_in_time_gives_no_such_warning():
    code = """
    import warnings
    warnings.simplefilter("error")
    import jaxdist as jd
    print(jd.MirroredStrategy().num_replicas_in_sync)
    """
    p = _run(code, 8)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "8"
