"""Every state route that eager `strategy.run` keeps current is current under `jd.function`.

The route tests of tests/state/test_state_routes.py and tests/state/test_state_numbers.py run again
here, with each call of a step made from inside a `jd.function`, and the compile counts
they assert read from that function (its traces). Their expected values are the eager
ones, from Python alone.
"""

import pytest
import test_state_numbers
import test_state_routes
from test_state_numbers import *  # noqa: F403 - the same tests, compiled
from test_state_routes import *  # noqa: F403

import jaxdist as jd

_COMPILED: dict = {}


# one helper jd.function runs every route's step: its retrace warning is true and not what these tests check
pytestmark = [
    pytest.mark.filterwarnings("ignore:jd.function .* has been traced 8 times:UserWarning"),
]


def _key(fn):
    return (getattr(fn, "__func__", fn), id(getattr(fn, "__self__", None)))


def run_local_compiled(s, fn, x, *more):
    """``fn(x, *more)`` run on ``s`` from inside a `jd.function`; replica 0's result."""
    call = _COMPILED.get((_key(fn), s))
    if call is None:
        call = _COMPILED[(_key(fn), s)] = jd.function(lambda x, *m: s.run(fn, args=(x, *m)))
    return float(s.experimental_local_results(call(x, *more))[0])


def tracing_count(fn):
    """The traces of the `jd.function`s that ran ``fn`` (what `step_count` counts eagerly)."""
    return sum(
        f.experimental_get_tracing_count() for (k, _), f in _COMPILED.items() if k == _key(fn)
    )


@pytest.fixture(autouse=True)
def _compiled(monkeypatch):
    for module in (test_state_routes, test_state_numbers):
        monkeypatch.setattr(module, "run_local", run_local_compiled)
    monkeypatch.setattr(jd.experimental, "step_count", tracing_count)
    yield
    _COMPILED.clear()


# run below with a jd.function of its own (a warning at the trace needs a fresh trace: the
# shared helper's compiled variants are kept across the tests above)
del test_an_array_jaxdist_cannot_find_is_loud_not_silent  # noqa: F821


def test_an_array_jaxdist_cannot_find_is_loud_under_jd_function(strat, monkeypatch):
    import sys
    import types

    import jax.numpy as jnp
    from conftest import ones_batch, total

    pkg = types.ModuleType("installed_pkg_fn")
    pkg.__file__ = "/usr/lib/python3/site-packages/installed_pkg_fn/__init__.py"
    pkg.W = jnp.ones(8)
    monkeypatch.setitem(sys.modules, "installed_pkg_fn", pkg)

    def step(x):
        import installed_pkg_fn

        return jnp.sum(installed_pkg_fn.W) * total(x)

    call = jd.function(lambda x: strat.run(step, args=(x,)))
    with pytest.warns(RuntimeWarning, match=r"read 1 JAX array\(s\) \(float32\[8\]\) that jaxdist"):
        out = call(ones_batch(strat))
    assert float(strat.experimental_local_results(out)[0]) == 64.0
