"""The two tiers of the suite: `make test` runs every test, `make test-fast` every test not marked
`slow` (tests/conftest.py marks them). A test file of a slow kind (several processes, notebooks,
docs examples, the property sweeps, the wheel smoke) is in the slow tier, and `make test` selects
nothing away."""

import ast
import pathlib
import re
import shlex
import sys

import pytest
from conftest import SLOW_FILES, SLOW_PREFIXES, slow_reason

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = pathlib.Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
# what a test of the slow tier's kinds names: the worker scripts of the multi-process runs, the
# wheel smoke, the notebooks' runner
SLOW_KINDS = re.compile(
    r"\b(keras_)?multiworker_worker\b|\bwheel_smoke\b|\bnbclient\b|\bnbformat\b"
)
# files slow by their kind, whatever they name
SLOW_BY_NAME = ("test_multi_worker.py", "test_notebooks.py", "test_docs_examples.py")
# the options that would make a pytest run leave tests out
SELECTING = ("-m", "-k", "--deselect", "--ignore", "--ignore-glob", "--lf", "--last-failed", "-x")


def suite_files() -> list[pathlib.Path]:
    """The test files, this one left out (it names the slow kinds to find them)."""
    return sorted(p for p in TESTS.rglob("test_*.py") if p.name != pathlib.Path(__file__).name)


def is_multiworker(node: ast.AST) -> bool:
    """Whether a decorator list or a `pytestmark` value names `pytest.mark.multiworker`."""
    return "mark.multiworker" in ast.unparse(node)


def file_is_slow(path: pathlib.Path) -> bool:
    """The whole file is in the slow tier: listed, a sweep, or marked multiworker module-wide."""
    if slow_reason(path.name) is not None:
        return True
    tree = ast.parse(path.read_text())
    return any(
        isinstance(node, ast.Assign)
        and any(getattr(t, "id", None) == "pytestmark" for t in node.targets)
        and is_multiworker(node.value)
        for node in tree.body
    )


def unmarked_slow_uses(path: pathlib.Path) -> list[str]:
    """Where a file not in the slow tier as a whole names a slow kind outside a test marked
    multiworker (a helper, an import at the top, an unmarked test): each place as `line: name`."""
    source = path.read_text()
    tree = ast.parse(source)
    covered = set()  # the lines of the tests marked multiworker
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
            is_multiworker(d) for d in node.decorator_list
        ):
            covered.update(range(node.decorator_list[0].lineno, node.end_lineno + 1))
    return [
        f"{no}: {m.group(0)}"
        for no, line in enumerate(source.splitlines(), start=1)
        for m in SLOW_KINDS.finditer(line)
        if no not in covered
    ]


def test_slow_kinds_are_in_the_slow_tier():
    missing = []
    for path in suite_files():
        if file_is_slow(path):
            continue
        if path.name in SLOW_BY_NAME or path.name.startswith("test_sweep_"):
            missing.append(path.name)
        elif uses := unmarked_slow_uses(path):
            missing.append(f"{path.name} ({', '.join(uses)})")
    assert not missing, (
        f"test files of a slow kind outside the slow tier: {missing}; add the file to SLOW_FILES "
        "in tests/conftest.py, or mark the test that starts the processes @pytest.mark.multiworker"
    )


def test_the_check_finds_an_unmarked_multi_process_test(tmp_path):
    """The check above can fail: a test starting a worker without the marker is reported, one
    with it is not."""
    unmarked = tmp_path / "test_new.py"
    unmarked.write_text("def test_two():\n    import multiworker_worker\n")
    assert unmarked_slow_uses(unmarked) == ["2: multiworker_worker"]
    assert not file_is_slow(unmarked)
    marked = tmp_path / "test_new2.py"
    marked.write_text(
        "import pytest\n\n@pytest.mark.multiworker\ndef test_two():\n    import multiworker_worker\n"
    )
    assert unmarked_slow_uses(marked) == []
    whole = tmp_path / "test_new3.py"
    whole.write_text("import pytest\npytestmark = pytest.mark.multiworker\n")
    assert file_is_slow(whole)


def test_the_slow_files_exist():
    names = {p.name for p in suite_files()}
    assert set(SLOW_FILES) <= names, set(SLOW_FILES) - names
    for prefix in SLOW_PREFIXES:
        assert any(n.startswith(prefix) for n in names), prefix


def test_slow_reason():
    assert slow_reason("test_notebooks.py")
    assert slow_reason("test_sweep_anything.py")
    assert slow_reason("test_keras_anything.py")
    assert slow_reason("test_run.py", {"multiworker"})
    assert slow_reason("test_run.py", {"parametrize"}) is None
    assert slow_reason("test_run.py") is None


def test_this_runs_items_are_marked_as_the_tier_says(request):
    """The hook in tests/conftest.py marked every collected test of this run by `slow_reason`,
    and a `-m "not slow"` run (make test-fast) holds none of them."""
    for item in request.session.items:
        names = {m.name for m in item.iter_markers()} - {"slow"}
        want = slow_reason(item.path.name, names) is not None
        assert (item.get_closest_marker("slow") is not None) == want, item.nodeid
        if request.config.getoption("markexpr") == "not slow":
            assert not want, item.nodeid


def recipe(target: str) -> tuple[str, list[str]]:
    """A Makefile target's prerequisites line and its recipe's lines."""
    text = (ROOT / "Makefile").read_text()
    m = re.search(rf"^{re.escape(target)}:(.*)\n((?:\t.*\n)+)", text, re.M)
    assert m, target
    return m.group(1).strip(), [line.strip() for line in m.group(2).splitlines()]


def pytest_args(line: str) -> list[str]:
    words = shlex.split(line)
    return words[words.index("pytest") + 1 :]


def selections(lines: list[str]) -> list[list[str]]:
    """The pytest arguments of each pytest run of a recipe, without its parallel options
    (``$(PARALLEL)``: pytest-xdist's processes, which select nothing)."""
    runs = [pytest_args(line) for line in lines if "-m pytest" in line]
    return [[a for a in args if a != "$(PARALLEL)"] for args in runs]


@pytest.mark.parametrize("target", ["test", "test-latest"])
def test_make_test_runs_everything(target):
    """`make test` and `make test-latest` (CI's commands) deselect nothing: two runs, one of
    the tests not marked multiworker and one of those marked (each in parallel), no
    keyword selection or ignored path, and none in pyproject's pytest options either."""
    prereq, lines = recipe(target)
    assert prereq == ("$(STAMP)" if target == "test" else "$(LATEST_STAMP)")
    runs = [line for line in lines if "-m pytest" in line]
    assert all(line.startswith("JAXDIST_REQUIRE_DEV=1 ") for line in runs), runs
    assert selections(lines) == [["-q", "-m", "not multiworker"], ["-q", "-m", "multiworker"]]
    assert all("$(PARALLEL)" in pytest_args(run) for run in runs), runs
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    addopts = shlex.split(options["ini_options"]["addopts"])
    assert not set(addopts) & set(SELECTING), addopts
    assert options["ini_options"]["testpaths"] == ["tests"]


def test_the_parallel_options_select_nothing():
    """``$(PARALLEL)`` is pytest-xdist's processes and scheduling only."""
    m = re.search(r"^PARALLEL = (.*)$", (ROOT / "Makefile").read_text(), re.M)
    assert m, "PARALLEL"
    words = shlex.split(m.group(1))
    assert words[0] == "-n" and words[2] == "--dist", words
    assert not set(words) & set(SELECTING), words


def test_make_test_fast_is_make_test_without_the_slow_tier():
    fast_prereq, fast = recipe("test-fast")
    prereq, full = recipe("test")
    assert fast_prereq == prereq
    ruff = [line for line in full if "ruff check" in line]
    assert ruff and all(line in fast for line in ruff)
    runs = [line for line in fast if "-m pytest" in line]
    assert len(runs) == 1 and runs[0].startswith("JAXDIST_REQUIRE_DEV=1 "), runs
    assert selections(fast) == [["-q", "-m", "not slow"]], runs[0]


def test_the_slow_marker_is_registered():
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    names = {m.split(":")[0] for m in options["ini_options"]["markers"]}
    assert {"slow", "multiworker"} <= names
