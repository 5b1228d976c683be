"""Test set-up: 8 simulated CPU devices, fixed once before JAX starts."""

import importlib
import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402

import jaxdist as jd  # noqa: E402

REPLICAS = (1, 2, 4, 8)


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


def devices_of(value) -> tuple:
    """The device of each component of a distributed value, in replica order (public API)."""
    return tuple(next(iter(x.devices())) for x in value.values)


def dev_import(name: str):
    """A dev dependency (pyproject's ``dev`` extra): skipped where it is missing on a
    developer's machine, a failure in CI (``CI`` set), where every one must be installed."""
    if os.environ.get("CI"):
        return importlib.import_module(name)
    return pytest.importorskip(name)


def pytest_report_header(config):
    return f"jax {jax.__version__}; simulated CPU devices: 8"
