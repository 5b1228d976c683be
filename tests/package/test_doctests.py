"""Runs every `>>>` example in the package's docstrings as a doctest.

A module with examples must run some (a broken finder, or examples turned into plain
text, would otherwise pass unseen); the modules without any are named below.
"""

import doctest
import importlib
import os
import pkgutil

import pytest
from conftest import require

import jaxdist

os.environ.setdefault("KERAS_BACKEND", "jax")  # the Keras integration's modules import Keras

MODULES = sorted(m.name for m in pkgutil.walk_packages(jaxdist.__path__, "jaxdist."))

# Internal modules whose docstrings have no `>>>` example (their behaviour is shown through
# the public API that uses them, and tested in tests/). Keep this list exact.
NO_EXAMPLES = {
    # the wings' packages: a docstring saying what the wing is (`docs/architecture.md`)
    "jaxdist._base",
    "jaxdist._cluster",
    "jaxdist._collective",
    "jaxdist._input",
    "jaxdist._keras",
    "jaxdist._program",
    "jaxdist._run",
    "jaxdist._strategy",
    "jaxdist._values",
    # a model's own train_step under a strategy: shown by tests/keras_wing/test_keras_override.py
    "jaxdist._keras.override",
    "jaxdist._keras.tfloss",
    "jaxdist._partial",
    "jaxdist._state",
    "jaxdist._state.capture",
    "jaxdist._cluster.config",
    "jaxdist._cluster.guard",  # needs a running cluster: tests/cluster/test_multi_worker.py
    "jaxdist._base.context",
    "jaxdist._cluster.join",
    "jaxdist._input.place",
    "jaxdist._base.layout",
    "jaxdist._partial.lockstep",
    "jaxdist._strategy.logical_devices",
    "jaxdist._partial.ragged",
    "jaxdist._collective.reduce",
    "jaxdist._partial.replay",
    "jaxdist._run.run",
}


def test_the_modules_without_examples_exist():
    assert NO_EXAMPLES <= set(MODULES), NO_EXAMPLES - set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    if name.startswith("jaxdist._keras.distribution"):
        require("keras")
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} doctest(s) failed in {name}"
    if name in NO_EXAMPLES:
        assert result.attempted == 0, f"{name} has examples now: remove it from NO_EXAMPLES"
    else:
        assert result.attempted > 0, f"{name} ran no example (list it in NO_EXAMPLES if meant)"
