"""Callable step objects and the host's own machinery (issue 46's "also seen"): a step
object with a delegating ``__getattr__`` is never asked for function attributes
(``__closure__``, ``__qualname__``, ...) by jaxdist, eagerly or under `jd.function`; a
``@dataclass`` step works; a logger the step calls is no state (the host logging does not
trace the step again)."""

import dataclasses
import logging

import jax.numpy as jnp
import pytest
from conftest import mirrored, ones_batch, total

import jaxdist as jd


class Inner:
    def __init__(self):
        self.scale = jnp.asarray(2.0)


class Delegating:
    """A wrapper forwarding unknown attributes to what it wraps (a common model wrapper)."""

    def __init__(self, calls):
        self.inner, self.calls = Inner(), calls

    def __getattr__(self, name):
        self.calls.append(name)
        return getattr(self.inner, name)

    def __call__(self, x):
        return total(x) * self.inner.scale


@pytest.mark.parametrize("n", (1, 2, 8))
@pytest.mark.parametrize("compiled", (False, True), ids=("eager", "jd.function"))
def test_a_step_object_with_a_delegating_getattr_is_not_asked(n, compiled):
    s, calls = mirrored(n), []
    step = Delegating(calls)
    run = (
        (lambda x: s.run(step, args=(x,)))
        if not compiled
        else jd.function(lambda x: s.run(step, args=(x,)))
    )
    for k in range(3):
        step.inner.scale = jnp.asarray(float(k + 1))  # read afresh: its state
        out = run(ones_batch(s))
        assert float(s.experimental_local_results(out)[0]) == 8.0 * (k + 1)
    assert calls == []


@dataclasses.dataclass
class DataclassStep:
    scale: object

    def __call__(self, x):
        return total(x) * self.scale


@pytest.mark.parametrize("n", (1, 2, 8))
def test_a_dataclass_step_object_runs_and_reads_its_fields_afresh(n):
    """A ``@dataclass`` step (unhashable: ``eq=True`` sets ``__hash__`` to None) is a step
    like any other callable, eagerly and under `jd.function` (it failed with a bare
    "unhashable type")."""
    s = mirrored(n)
    step = DataclassStep(jnp.asarray(1.0))
    f = jd.function(lambda x: s.run(step, args=(x,)))
    for k in range(3):
        step.scale = jnp.asarray(float(k + 1))
        eager = s.run(step, args=(ones_batch(s),))
        assert float(s.experimental_local_results(eager)[0]) == 8.0 * (k + 1)
        assert float(s.experimental_local_results(f(ones_batch(s)))[0]) == 8.0 * (k + 1)
    assert f.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("n", (1, 2, 8))
def test_the_host_logging_does_not_trace_the_step_again(n):
    """A ``jd.function`` calling ``logger.debug`` (the walk went into the logger's methods,
    watching ``logger._cache``): once the host logged, the step traced again ("logger._cache
    changed size (0 -> 1)")."""
    s = mirrored(n)
    log = logging.getLogger(f"jaxdist-test-train-{n}")

    class Trainer:
        def __init__(self):
            self.w = jnp.asarray(1.0)

        @jd.function
        def step(self, x):
            log.debug("step")
            return s.run(lambda x: total(x) * self.w, args=(x,))

    t = Trainer()
    t.step(ones_batch(s))
    log.warning("the host logged")  # (fills the logger's level cache)
    log.handlers.append(logging.NullHandler())
    for _ in range(2):
        out = t.step(ones_batch(s))
    assert float(s.experimental_local_results(out)[0]) == 8.0
    assert t.step.experimental_get_tracing_count() == 1
