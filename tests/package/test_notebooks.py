"""Executes every notebook in notebooks/ (a failing cell fails the test).

Each notebook checks the claims its text makes (the numbers it prints, the splits, the
agreement with one device) with `assert`s in its cells, so running it tests them; a
notebook without any assertion fails `test_every_notebook_asserts_its_claims`.

The kernel is this interpreter (``sys.executable``): the test writes a private
kernelspec into a temporary ``JUPYTER_PATH`` entry, so a user-wide ``python3``
kernel pointing at another Python can never be picked up by mistake.
"""

import ast
import json
import sys
import time
from pathlib import Path

import pytest
from conftest import require  # noqa: E402

nbformat = require("nbformat")
nbclient = require("nbclient")
require("ipykernel")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
KERNEL = "jaxdist-tests"


@pytest.fixture(scope="module")
def kernel_name(tmp_path_factory):
    spec_dir = tmp_path_factory.mktemp("jupyter") / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python ({sys.executable})",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    mp = pytest.MonkeyPatch()
    mp.setenv("JUPYTER_PATH", str(spec_dir.parents[1]))
    yield KERNEL
    mp.undo()


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 4, NOTEBOOKS


def test_notebooks_are_stripped():
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, path.name


def assertions(nb) -> int:
    """How many `assert` statements (and `raise AssertionError`) the notebook's code has."""
    count = 0
    for cell in nb.cells:
        if cell.cell_type == "code":
            code = "\n".join(x for x in cell.source.splitlines() if not x.lstrip().startswith("%"))
            for node in ast.walk(ast.parse(code)):
                count += isinstance(node, ast.Assert) or (
                    isinstance(node, ast.Raise) and "AssertionError" in ast.unparse(node)
                )
    return count


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_notebook_asserts_its_claims(path):
    nb = nbformat.read(path, as_version=4)
    code_cells = sum(cell.cell_type == "code" for cell in nb.cells)
    assert assertions(nb) >= code_cells // 3 > 0, f"{path.name} asserts too little of what it shows"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, kernel_name):
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        kernel_name=kernel_name,
        timeout=300,
        resources={"metadata": {"path": str(path.parent)}},
    )
    start = time.perf_counter()
    client.execute()  # raises CellExecutionError when a cell fails
    print(f"{path.name}: {time.perf_counter() - start:.1f} s")
