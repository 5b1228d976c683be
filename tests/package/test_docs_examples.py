"""Every ```python block of the docs' pages runs, as the README's do (tests/package/test_readme.py).

The blocks of one page run in order in one fresh interpreter (a reader copies them one after
the other), on 8 simulated CPU devices, from a scratch directory; a page's blocks assert what
their text claims. Blocks that are not Python for this interpreter are fenced otherwise and not
run: shell (```bash) and TensorFlow code shown for comparison (```py: TF is never a dependency). The API pages are generated from the docstrings, whose examples tests/package/test_doctests.py runs.
"""

import doctest
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest
from conftest import dev_required

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "api" not in p.relative_to(DOCS).parts)
FENCE = re.compile(r"^( *)```python[^\n]*\n(.*?)^\1```", re.S | re.M)


def python_blocks(page: pathlib.Path) -> list[str]:
    return [code for indent, code in FENCE.findall(page.read_text())]


def test_the_examples_are_found():
    with_examples = {p.relative_to(DOCS).as_posix() for p in PAGES if python_blocks(p)}
    assert {
        "getting-started.md",
        "guides/training-loops.md",
        "guides/porting.md",
        "guides/state.md",
        "guides/input.md",
        "guides/keras.md",
        "guides/checkpointing.md",
        "guides/cross-device-ops.md",
        "guides/debugging.md",
        "guides/testing.md",
        "guides/multi-worker.md",
        "guides/recipes.md",
        "migrating.md",
        "no-equivalent.md",
    } <= with_examples, with_examples


def test_every_python_fence_is_collected():
    """A ```python fence the pattern above misses (say, inside an admonition, indented) would
    never run: every fence opening must be one that FENCE matches."""
    for page in PAGES:
        text = page.read_text()
        openings = len(re.findall(r"^ *```python", text, re.M))
        assert openings == len(python_blocks(page)), page


@pytest.mark.parametrize(
    "page",
    [p for p in PAGES if python_blocks(p)],
    ids=lambda p: p.relative_to(DOCS).as_posix(),
)
def test_page_examples_run(page, tmp_path):
    code = "\n".join(python_blocks(page))
    for needed in ("keras", "orbax"):  # optional dependencies (the dev extra has them)
        if re.search(rf"^\s*import {needed}", code, re.M) and not importlib.util.find_spec(needed):
            if dev_required():  # make test and CI install the dev extra: a failure there
                pytest.fail(f"{needed} (a dev dependency) is not installed")
            pytest.skip(f"{needed} is not installed")
    env = dict(os.environ)
    env.update(
        XLA_FLAGS="--xla_force_host_platform_device_count=8",
        KERAS_BACKEND="jax",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
    )
    env.pop("TF_CONFIG", None)
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=env,
    )
    assert out.returncode == 0, f"{page.name}:\n{out.stderr[-3000:]}"


def test_the_api_pages_doctest_fence():
    """docs/griffe_doctest.py (the API pages' `>>>` fences) does what its example says."""
    pytest.importorskip("griffe")  # the docs extra
    spec = importlib.util.spec_from_file_location("griffe_doctest", DOCS / "griffe_doctest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert doctest.testmod(module).attempted > 0
    assert doctest.testmod(module).failed == 0
