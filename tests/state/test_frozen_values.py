"""Python values of a step's state that a user's own ``jax.jit`` bakes in are named (issue
46): a bool, a string, an Enum member, a set, a NumPy number, the entries of a tuple or
namedtuple and those of a list the trace did not grow, that the step branches on or computes
with, as arrays and Python numbers were. The answer itself is JAX's (the first value, baked);
the warning names the place and the fix."""

import collections
import enum
import warnings

import jax
import numpy as np
import pytest
from conftest import mirrored, ones_batch, total

Phase = enum.Enum("Phase", "TRAIN EVAL")
Cfg = collections.namedtuple("Cfg", "lr momentum")

VALUES = {  # name: (value, how the step uses it)
    "training": (True, lambda v, t: t if v else -t),
    "mode": ("sum", lambda v, t: t if v == "sum" else t / 8),
    "phase": (Phase.TRAIN, lambda v, t: t if v is Phase.TRAIN else 0 * t),
    "frozen": ({"a"}, lambda v, t: t if "a" in v else -t),
    "scale": (np.float32(2.0), lambda v, t: t * v),
    "cfg": (Cfg(0.5, 0.9), lambda v, t: t * v.lr),
    "schedule": ([0.5, 0.25], lambda v, t: t * v[0]),  # a list the step reads, not grows
}


class Trainer:
    pass


@pytest.mark.parametrize("replicas", [1, 2, 8])
@pytest.mark.parametrize("name", sorted(VALUES))
def test_a_python_value_baked_by_a_users_jit_is_named(name, replicas):
    s = mirrored(replicas)
    value, use = VALUES[name]
    t = Trainer()
    setattr(t, name, value)

    def step(x):
        return use(getattr(t, name), total(x))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = jax.jit(lambda x: s.run(step, args=(x,)))(ones_batch(s))
    assert float(s.experimental_local_results(out)[0]) == pytest.approx(float(use(value, 8.0)))
    named = [
        str(w.message) for w in caught if "baked into that compiled function" in str(w.message)
    ]
    assert named and f"t.{name}" in named[0], [str(w.message) for w in caught]


def test_a_list_the_step_appends_to_is_not_named():
    s = mirrored(2)
    log = [1.0]

    def step(x):
        log.append(0.0)  # (a Python log the trace writes, not a setting it reads)
        return total(x)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jax.jit(lambda x: s.run(step, args=(x,)))(ones_batch(s))
    assert not [w for w in caught if "baked into" in str(w.message)]
