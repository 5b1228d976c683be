"""Runs every `>>>` example in the package's docstrings as a doctest.

A module with examples must run some (a broken finder, or examples turned into plain
text, would otherwise pass unseen); the modules without any are named below.
"""

import doctest
import importlib
import os
import pkgutil

import pytest
from conftest import dev_import

import jaxdist

os.environ.setdefault("KERAS_BACKEND", "jax")  # the Keras integration's modules import Keras

MODULES = sorted(m.name for m in pkgutil.walk_packages(jaxdist.__path__, "jaxdist."))

# Internal modules whose docstrings have no `>>>` example (their behaviour is shown through
# the public API that uses them, and tested in tests/). Keep this list exact.
NO_EXAMPLES = {
    "jaxdist._capture",
    "jaxdist._cluster_config",
    "jaxdist._cluster_guard",  # needs a running cluster: tests/test_multi_worker.py
    "jaxdist._context",
    "jaxdist._devices",
    "jaxdist._distributed",
    "jaxdist._input_place",
    "jaxdist._layout",
    "jaxdist._lockstep",
    "jaxdist._logical_devices",
    "jaxdist._ragged",
    "jaxdist._reduce",
    "jaxdist._replay",
    "jaxdist._run",
    "jaxdist._stage",
    "jaxdist._validate",
}


def test_the_modules_without_examples_exist():
    assert NO_EXAMPLES <= set(MODULES), NO_EXAMPLES - set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    if name.startswith("jaxdist._keras"):
        dev_import("keras")
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} doctest(s) failed in {name}"
    if name in NO_EXAMPLES:
        assert result.attempted == 0, f"{name} has examples now: remove it from NO_EXAMPLES"
    else:
        assert result.attempted > 0, f"{name} ran no example (list it in NO_EXAMPLES if meant)"
