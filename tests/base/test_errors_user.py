"""Errors a porting user meets first, in jaxdist's words: each names the user's call and the fix.

Expected values come from the replica count, never from jaxdist's own output.
"""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import mirrored

import jaxdist as jd

COUNTS = [1, 2, 8]


def ids_plus_one(strategy):
    """Per-replica scalars 1, 2, ..., n (a plain array on one replica, as TF's run gives)."""
    return strategy.run(lambda: jd.get_replica_context().replica_id_in_sync_group + 1.0)


@pytest.mark.parametrize("n", [2, 8])
@pytest.mark.parametrize("convert", [float, int])
def test_a_number_of_a_per_replica_value_names_strategy_reduce(n, convert):
    strategy = mirrored(n)
    value = ids_plus_one(strategy)
    with pytest.raises(TypeError, match=rf"{convert.__name__}\(\) of a PerReplica") as info:
        convert(value)
    assert 'strategy.reduce("SUM", value, axis=None)' in str(info.value)
    assert "experimental_local_results(value)[0]" in str(info.value)
    # The fix it names gives the number: 1 + 2 + ... + n.
    assert convert(strategy.reduce("SUM", value, axis=None)) == n * (n + 1) // 2


def test_one_replica_gives_a_plain_number():
    """One replica: `run` returns a plain array, as TF does, so float() of it is the value."""
    assert float(ids_plus_one(mirrored(1))) == 1.0


def test_bool_of_a_per_replica_value_is_true_as_in_tf():
    """TF's recorded answer (tests/tf_oracle/ANSWERS.md, PerReplica: `bool(pr)` True)."""
    assert bool(ids_plus_one(mirrored(2))) is True


@pytest.mark.parametrize("n", COUNTS)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_reduce_of_scalars_along_an_axis_says_axis_none(n, axis):
    strategy = mirrored(n)
    value = ids_plus_one(strategy)
    with pytest.raises(ValueError, match=rf"strategy\.reduce\(\.\.\., axis={axis}\)") as info:
        strategy.reduce("SUM", value, axis=axis)
    assert "rank 0" in str(info.value)
    assert "strategy.reduce(op, value, axis=None)" in str(info.value)
    assert float(strategy.reduce("SUM", value, axis=None)) == n * (n + 1) / 2


@pytest.mark.parametrize("n", COUNTS)
def test_reduce_without_axis_is_axis_none(n):
    """TF 2's `Strategy.reduce` requires `axis` (a TypeError); TF 1's, whose methods jaxdist's
    strategies also carry, defaults it to None: jaxdist does as TF 1 (docs/migrating.md)."""
    strategy = mirrored(n)
    value = ids_plus_one(strategy)
    assert float(strategy.reduce("MEAN", value)) == (n + 1) / 2
    assert float(strategy.reduce("SUM", value)) == n * (n + 1) / 2


def branchy_step(x):
    if x > 0:  # the line the error must name
        return x
    return -x


def counting_step(x):
    total = 0.0
    for _ in range(x):  # an int of a traced value
        total += 1.0
    return total


def line_of(fn, text):
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


@pytest.mark.parametrize("n", COUNTS)
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_python_if_on_a_traced_value_names_the_step_line_and_fix(n, jit):
    strategy = mirrored(n)
    value = ids_plus_one(strategy)
    call = lambda v: strategy.run(branchy_step, args=(v,))  # noqa: E731
    with pytest.raises(TypeError) as info:
        (jax.jit(call) if jit else call)(value)
    message = str(info.value)
    assert message.startswith("strategy.run(branchy_step):"), message
    assert f"{__file__}:{line_of(branchy_step, 'if x > 0')}" in message, message
    assert "jnp.where" in message and "lax.cond" in message
    assert isinstance(info.value.__cause__, jax.errors.TracerBoolConversionError)


@pytest.mark.parametrize("n", COUNTS)
def test_int_of_a_traced_value_names_the_step_line_and_fix(n):
    strategy = mirrored(n)
    with pytest.raises(TypeError) as info:
        strategy.run(counting_step, args=(jnp.int32(3),))
    message = str(info.value)
    assert message.startswith("strategy.run(counting_step):"), message
    assert f"{__file__}:{line_of(counting_step, 'range(x)')}" in message, message
    assert "lax.fori_loop" in message
    assert isinstance(info.value.__cause__, jax.errors.TracerIntegerConversionError)


@pytest.mark.parametrize("n", COUNTS)
def test_the_fix_it_names_works(n):
    """jnp.where in place of the if: |x| of 1..n sums to n(n+1)/2."""
    strategy = mirrored(n)
    out = strategy.run(lambda x: jnp.where(x > 0, x, -x), args=(ids_plus_one(strategy),))
    assert float(strategy.reduce("SUM", out, axis=None)) == n * (n + 1) / 2


@pytest.mark.parametrize("n", (2, 8))
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_python_if_on_a_traced_value_of_a_partial_batch_names_the_step_line(n, jit):
    """The same error on a partial batch (ragged over the replicas), eager and jitted."""
    strategy = mirrored(n)
    batch = next(iter(strategy.experimental_distribute_dataset([np.ones(n + 1, np.float32)])))
    call = lambda v: strategy.run(lambda x: branchy_step(jnp.sum(x)), args=(v,))  # noqa: E731
    with pytest.raises(TypeError) as info:
        (jax.jit(call) if jit else call)(batch)
    message = str(info.value)
    assert f"{__file__}:{line_of(branchy_step, 'if x > 0')}" in message, message
    assert "jnp.where" in message and "lax.cond" in message
