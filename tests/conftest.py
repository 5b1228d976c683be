"""Test set-up: 8 simulated CPU devices, fixed once before JAX starts."""

import contextlib
import gc
import importlib
import importlib.metadata
import os

# 8 simulated devices; LLVM's backend unoptimized (-O0): the suite's programs are tiny and
# compiled once each, so compile time is most of the suite's, and numbers compare to
# tolerances, never to another optimization level's bits. On jaxlib 0.10, XLA's CPU
# fusions through its older emitter too (half the compile time of a train step; the
# newer jaxlibs have no such flag, and an unknown XLA flag aborts the process), and each
# program's LLVM module compiled whole, not split across threads (a fifth less compile
# time of a train step where two pytest processes already hold both cores; no change on
# the newer jaxlibs).
# Fresh interpreters the tests start (notebooks, docs examples, workers) inherit them.
# Worker processes set their own device count and take `COMPILE_FLAGS` alone.
COMPILE_FLAGS = "--xla_backend_optimization_level=0"
if importlib.metadata.version("jaxlib").startswith("0.10."):
    COMPILE_FLAGS += " --xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1"
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8 " + COMPILE_FLAGS
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402

import jaxdist as jd  # noqa: E402

REPLICAS = (1, 2, 4, 8)

try:  # the sweep's profiles (tests/*/test_sweep_*.py); hypothesis is in the dev extra
    from hypothesis import HealthCheck, settings
except ImportError:  # the sweep modules fail or skip on their own (`require`)
    pass
else:
    _SLOW = [HealthCheck.too_slow, HealthCheck.data_too_large]
    # CI: the same draws every run (derandomize), few of them, no deadline (jit compiles)
    settings.register_profile(
        "ci",
        derandomize=True,
        max_examples=12,
        deadline=None,
        database=None,
        suppress_health_check=_SLOW,
        print_blob=True,
    )
    # make sweep: JAXDIST_SWEEP=1 (JAXDIST_SWEEP_EXAMPLES draws per test, default 2000)
    settings.register_profile(
        "sweep",
        max_examples=int(os.environ.get("JAXDIST_SWEEP_EXAMPLES", "2000")),
        deadline=None,
        suppress_health_check=_SLOW,
        print_blob=True,
    )
    settings.load_profile("sweep" if os.environ.get("JAXDIST_SWEEP") else "ci")


def mirrored(n: int) -> jd.MirroredStrategy:
    return jd.MirroredStrategy([f"/cpu:{i}" for i in range(n)])


@pytest.fixture(params=REPLICAS, ids=lambda n: f"r{n}")
def strategy(request) -> jd.MirroredStrategy:
    """A MirroredStrategy over 1, 2, 4 and 8 simulated CPU devices."""
    return mirrored(request.param)


@pytest.fixture(params=REPLICAS, ids=lambda n: f"r{n}")
def any_strategy(request):
    """MirroredStrategy over 1, 2, 4, 8 devices, plus OneDeviceStrategy as the 1-replica case."""
    if request.param == 1:
        return jd.OneDeviceStrategy("/cpu:0")
    return mirrored(request.param)


@pytest.fixture(autouse=True)
def _no_leaked_strategy():
    yield
    assert not jd.has_strategy(), "a test left a strategy current"


@pytest.fixture(autouse=True)
def _state_checks_off_where_marked(request):
    """A test marked ``unchecked`` runs with the state check mode off (``make test-checked``
    turns it on): thousands of calls of one step would each be a trace, and a count of the
    traces a step's own Python keeps (``TRACES.append(1)``) counts the check's too."""
    if request.node.get_closest_marker("unchecked") is None:
        yield
        return
    with state_checks(False):
        yield


@contextlib.contextmanager
def state_checks(on: bool):
    """The state check mode set to ``on`` inside, as it was after."""
    before = jd.experimental.state_checks()
    jd.experimental.set_state_checks(on)
    try:
        yield
    finally:
        jd.experimental.set_state_checks(before)


def require(module: str):
    """Imports a dev dependency (pyproject's ``dev`` extra) for a test module: a missing one
    fails the module under ``make test`` (it sets ``JAXDIST_REQUIRE_DEV=1``, having installed
    the extra) and in CI (``CI`` set, as GitHub Actions does), and skips it elsewhere, so the
    suite never passes by skipping what it was meant to run."""
    if dev_required():
        return importlib.import_module(module)
    return pytest.importorskip(module)


def dev_required() -> bool:
    """Whether a missing dev dependency (or Keras on another backend) fails, not skips."""
    flags = (os.environ.get("JAXDIST_REQUIRE_DEV", ""), os.environ.get("CI", ""))
    return any(f.lower() not in ("", "0", "false") for f in flags)


def devices_of(value) -> tuple:
    """The device of each component of a distributed value, in replica order (public API;
    a plain array, as one replica gives, is its one component)."""
    values = value.values if isinstance(value, jd.DistributedValues) else (value,)
    return tuple(next(iter(x.devices())) for x in values)


@pytest.fixture(params=["r1", "r2", "r8", "one_device"])
def strat(request):
    """1, 2 and 8 replicas and `OneDeviceStrategy` (the state-reading tests' topologies)."""
    if request.param == "one_device":
        return jd.OneDeviceStrategy("/cpu:0")
    return mirrored(int(request.param[1:]))


def ones_batch(s, rows=8):
    """``rows`` ones split over the replicas (``rows / R`` each): the all-reduced sum is rows."""
    n = s.num_replicas_in_sync
    return s.experimental_distribute_values_from_function(lambda c: jnp.ones(rows // n))


def total(x):
    """The all-reduced sum of ``x`` (inside a step)."""
    return jd.get_replica_context().all_reduce("SUM", jnp.sum(x))


def run_local(s, fn, x, *more):
    """``fn(x, *more)`` run on ``s``, replica 0's result as a float."""
    return float(s.experimental_local_results(s.run(fn, args=(x, *more)))[0])


# -- The slow tier ------------------------------------------------------------------------------
# `make test` (and CI) runs every test; `make test-fast` leaves out the ones marked `slow` here
# (`-m "not slow"`), so that the inner loop while editing takes a few minutes, not half an hour.
# tests/package/test_tiers.py holds this list to the kinds that must be in it.

SLOW_FILES = {  # test file: why it is in the slow tier
    "test_multi_worker.py": "several processes (jax.distributed, tests/multiworker_worker.py)",
    "test_keras_save.py": "several processes (tests/keras_multiworker_worker.py)",
    "test_notebooks.py": "executes every notebook",
    "test_docs_examples.py": "runs every docs page's code blocks, some in fresh interpreters",
    "test_demo.py": "runs examples/demo.py in a fresh interpreter",
    "test_bench_accelerator.py": "runs the benchmark script in fresh interpreters",
    "test_cpu_threads.py": "starts a fresh interpreter per case to size XLA's thread pool",
    # measured the slowest files of one process (a second or more per test, most of it compiles)
    "test_function.py": "trainers under jd.function: a compile per case, seconds each",
    "test_function_routes.py": "every state route again under jd.function: compiles per case",
    "test_jit.py": "strategy calls inside jax.jit and lax loops: compiles per case",
    "test_state_kinds.py": "state of every kind at every replica count: compiles per case",
    "test_state_numbers.py": "10,000 calls and compile counts of Python numbers in state",
    "test_state_reads.py": "real TF programs run as written: compiles per case",
    "test_state_review.py": "the state review's cases: compiles per case",
    "test_state_routes.py": "every state route at every replica count: compiles per case",
    "test_state_routes3.py": "more state routes at every replica count: compiles per case",
    "test_replica_state_keras.py": "Keras models trained in the replica step: seconds per case",
    "test_tf_variables.py": "TF's custom-training tutorial with Keras: seconds per case",
    "test_generated_routes.py": "1,156 generated programs against plain Python (a minute and more)",
    "test_replica_state_flax.py": "a flax conv net trained at every replica count: compiles per case",
}
SLOW_PREFIXES = {  # test files named so: why they are in the slow tier
    "test_sweep_": "a property sweep (hypothesis draws, each a compile)",
    "test_keras": "Keras fit/evaluate/predict: a model compiled per case, seconds each",
}


def slow_reason(filename: str, markers=()) -> str | None:
    """Why a test of ``filename`` carrying ``markers`` (their names) is in the slow tier, or None:
    a file of SLOW_FILES, a sweep, or any test marked ``multiworker`` (several processes)."""
    if filename in SLOW_FILES:
        return SLOW_FILES[filename]
    for prefix, why in SLOW_PREFIXES.items():
        if filename.startswith(prefix):
            return why
    if "multiworker" in markers:
        return "several processes (marked multiworker)"
    return None


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m selection reads the markers
def pytest_collection_modifyitems(config, items):
    for item in items:
        if slow_reason(item.path.name, {m.name for m in item.iter_markers()}):
            item.add_marker(pytest.mark.slow)


def pytest_collection_finish(session):
    """What the imports and the collection made (JAX, Keras, the test modules: millions of
    objects that live as long as the process) is left out of Python's cyclic garbage
    collections from now on (`gc.freeze`): each full collection would walk it again, a
    few percent of a Keras file's time. The tests' own objects are collected as before."""
    gc.collect()
    gc.freeze()


def pytest_report_header(config):
    return f"jax {jax.__version__}; simulated CPU devices: 8"
