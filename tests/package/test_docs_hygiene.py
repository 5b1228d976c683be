"""The docs stay what a porting user can trust: no stray files, no lab notes in the guides,
install commands that work on a clone.

The code blocks themselves run in tests/package/test_docs_examples.py and tests/package/test_readme.py.
"""

import json
import os
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

# Every file the docs directory may hold. A new page is added here (and to mkdocs.yml's nav);
# anything else (an editor's backup, a merge's .orig) fails.
ALLOWED = {
    "README.md",
    "architecture.md",
    "benchmarks.md",
    "changelog.md",
    "getting-started.md",
    "griffe_doctest.py",
    "hooks.py",
    "index.md",
    "migrating.md",
    "no-equivalent.md",
    "notebooks",  # a link to ../notebooks
    "api/index.md",
    "api/jaxdist.md",
    "api/experimental.md",
    "api/nn.md",
    "api/cluster_resolver.md",
    "api/errors.md",
    "guides/checkpointing.md",
    "guides/cross-device-ops.md",
    "guides/debugging.md",
    "guides/guarantees.md",
    "guides/input.md",
    "guides/keras.md",
    "guides/multi-worker.md",
    "guides/recipes.md",
    "guides/state.md",
    "guides/porting.md",
    "guides/testing.md",
    "guides/training-loops.md",
}

# The user guides: what they teach holds on any day and any machine. Dates, load averages and
# issue numbers belong to docs/benchmarks.md and CHANGELOG.md.
GUIDES = [
    *sorted((DOCS / "guides").glob("*.md")),
    DOCS / "migrating.md",
    DOCS / "getting-started.md",
    DOCS / "no-equivalent.md",
]
LAB_NOTES = re.compile(r"20[0-9]{2}-[0-9]{2}-[0-9]{2}|load [0-9]|issue [0-9]+", re.I)
NOT_YET: set[str] = set()  # pages exempt while being rewritten (none now)


def docs_files() -> set[str]:
    found = set()
    for dirpath, dirnames, filenames in os.walk(DOCS):  # does not follow the notebooks link
        rel = pathlib.Path(dirpath).relative_to(DOCS)
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames + [d for d in dirnames if (pathlib.Path(dirpath) / d).is_symlink()]:
            found.add((rel / name).as_posix())
    return found


def test_docs_holds_only_known_files():
    stray = docs_files() - ALLOWED
    assert not stray, f"files in docs/ that are no page of the site: {sorted(stray)}"


def test_the_known_files_exist():
    assert ALLOWED - docs_files() == set()


def test_a_stray_file_would_be_found(tmp_path, monkeypatch):
    """The check above can fail: a backup next to a page is reported."""
    (tmp_path / "guides").mkdir()
    (tmp_path / "guides" / "keras.md.orig").write_text("old")
    monkeypatch.setattr(sys.modules[__name__], "DOCS", tmp_path)
    assert docs_files() == {"guides/keras.md.orig"}


def test_no_lab_notes_in_the_guides():
    for page in GUIDES:
        if page.relative_to(DOCS).as_posix() in NOT_YET:
            continue
        hits = [m.group(0) for m in LAB_NOTES.finditer(page.read_text())]
        assert not hits, f"{page.relative_to(ROOT)}: {hits} (figures and dates: docs/benchmarks.md)"


def test_the_lab_notes_pattern_finds_them():
    for note in ("measured 2026-11-24", "at load 5-9", "see issue 30", "Issue 26"):
        assert LAB_NOTES.search(note), note
    assert not LAB_NOTES.search("8 replicas, 2 workers, batch 64")


# A measured figure: a ratio with decimals (1.3x), a time (0.25 ms, 7 µs, 1.4 s), a median.
FIGURE = re.compile(r"\b\d+\.\d+ ?x\b|\b\d+(\.\d+)? ?(ms|µs)\b|\b\d+\.\d+ s\b|\bmedian", re.I)


def test_figures_live_on_the_benchmarks_page():
    """A guide links to docs/benchmarks.md for a figure instead of quoting it (one home for each
    figure, with its date, machine and command)."""
    for page in GUIDES:
        if page.relative_to(DOCS).as_posix() in NOT_YET:
            continue
        hits = [m.group(0) for m in FIGURE.finditer(page.read_text())]
        assert not hits, f"{page.relative_to(ROOT)}: {hits} (link to docs/benchmarks.md instead)"


def test_the_figure_pattern_finds_them():
    for figure in ("1.63x", "0.85 x", "0.25 ms", "~25 µs", "1.4 s", "the median of 5 rounds"):
        assert FIGURE.search(figure), figure
    for not_a_figure in ("timeout_seconds + 5 s", "2 x 2 devices", "twice the devices (2x)"):
        assert not FIGURE.search(not_a_figure), not_a_figure


def test_install_commands_work_on_a_clone():
    """No package is published: the pages install from the clone, and every `make` target they
    show is one of the Makefile's (make conformance needs a directory outside the repository)."""
    targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.M))
    for page in [ROOT / "README.md", DOCS / "getting-started.md", DOCS / "index.md"]:
        text = page.read_text()
        assert not re.search(r"pip install\s+(-\S+\s+)*['\"]?jaxdist\b", text), page.name
        for target in re.findall(r"\bmake ([a-z][a-z-]*)", text):
            assert target in targets, (page.name, target)
            assert target != "conformance", page.name


def test_every_extra_the_docs_install_is_in_pyproject():
    """`pip install -e '.[checkpoint]'` on a page names an extra pyproject.toml defines (pip only
    warns about an unknown one and installs without it)."""
    pyproject = (ROOT / "pyproject.toml").read_text()  # read as text: tomllib is 3.11+
    section = pyproject.split("[project.optional-dependencies]\n")[1].split("\n[")[0]
    extras = set(re.findall(r"^([a-z][\w-]*) = \[", section, re.M))
    assert {"keras", "checkpoint", "dev"} <= extras
    pages = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    named = {
        (page.name, extra.strip())
        for page in pages
        for group in re.findall(r"pip install[^\n]*?\.\[([\w,-]+)\]", page.read_text())
        for extra in group.split(",")
    }
    assert ("checkpointing.md", "checkpoint") in named
    assert {extra for _, extra in named} <= extras, named


def glued_lists(text: str) -> list[str]:
    """The list items of a page that follow a paragraph's line with no blank line between:
    Python-Markdown (the site's renderer) runs them into the paragraph, a literal "- " in it.
    Lines in code fences, table rows and a list's own continuation lines (indented) are not
    paragraphs."""
    hits, fenced, previous = [], False, ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced, previous = not fenced, ""
            continue
        if fenced:
            continue
        item = re.match(r"^(- |\* |\d+\. )", line)
        paragraph = previous.strip() and not re.match(
            r"^(\s|- |\* |\d+\. |\||#|<|!!!|\?\?\?)", previous
        )
        if item and paragraph:
            hits.append(f"{previous.strip()[:50]!r} then {line[:30]!r}")
        previous = line
    return hits


def test_every_list_starts_after_a_blank_line():
    for page in sorted(DOCS.rglob("*.md")):
        hits = glued_lists(page.read_text())
        assert not hits, f"{page.relative_to(ROOT)}: a blank line before the list: {hits}"


def test_a_list_glued_to_its_paragraph_is_found():
    assert glued_lists("What it does:\n- **Variables.** one\n- two\n")
    assert glued_lists("Steps:\n1. first\n")
    assert not glued_lists("What it does:\n\n- one\n  more of one\n- two\n")
    assert not glued_lists("```python\nx = 1\n- 2\n```\n")
    assert not glued_lists("| a | b |\n- c\n")


def table_pairs(text: str) -> list[tuple[str, str]]:
    """The (TF, jaxdist) cells of a Markdown table's rows, header and rule left out."""
    pairs = []
    for line in text.splitlines():
        if not line.startswith("| ") or line.startswith("|---"):
            continue
        tf_name, jaxdist_name = (c.strip() for c in re.split(r"(?<!\\)\|", line)[1:3])
        pairs.append((tf_name, jaxdist_name))
    return pairs[1:]  # the header row


def migrating_mapping() -> list[tuple[str, str]]:
    text = (DOCS / "migrating.md").read_text()
    return table_pairs(text[text.index("## What maps to what") : text.index("## Behaviours")])


def notebook_mapping() -> list[tuple[str, str]]:
    nb = json.loads((ROOT / "notebooks" / "03_migrating_from_tf.ipynb").read_text())
    (cell,) = [c for c in nb["cells"] if "".join(c["source"]).startswith("## 5. The API mapping")]
    return table_pairs("".join(cell["source"]))


def test_the_two_mapping_tables_map_the_same_names_the_same_way():
    """docs/migrating.md's table (with what differs) and notebook 03's (TF | jaxdist) list the
    same TF names, in the same order, mapped to the same jaxdist names: one mapping, two places."""
    docs, notebook = migrating_mapping(), notebook_mapping()
    assert len(docs) >= 20, docs
    assert {tf for tf, _ in docs} == {tf for tf, _ in notebook}
    assert docs == notebook


def test_tf_function_is_mapped_one_way():
    """`@tf.function` is `@jd.function` (state on objects) or `@jax.jit` (state as arguments)
    in both tables and in notebook 03's list of differences, the same words everywhere."""
    rows = [jd for tf, jd in migrating_mapping() if "tf.function" in tf]
    assert rows and all("@jd.function" in jd and "@jax.jit" in jd for jd in rows), rows
    nb = (ROOT / "notebooks" / "03_migrating_from_tf.ipynb").read_text()
    assert "nothing: `strategy.run` compiles" not in nb


def step_of(text: str) -> list[str]:
    """The `def step(w, x):` block of a page, comments and trailing blanks removed."""
    block = re.search(r"^def step\(w, x\):.*\n(?:    .*\n)+", text, re.M).group(0)
    return [re.sub(r"\s*#.*$", "", line).rstrip() for line in block.splitlines()]


def test_training_loops_continues_the_15_line_example():
    """The 15-line example lives in the README and getting started (tests/package/test_readme.py keeps
    them equal); the training-loops guide repeats only its step, to run on its own, and that step
    must stay the same."""
    readme = step_of((ROOT / "README.md").read_text())
    assert len(readme) == 4, readme
    assert step_of((DOCS / "guides" / "training-loops.md").read_text()) == readme


def test_each_api_page_says_how_to_read_it_unbuilt():
    """In the repository an API page is a mkdocstrings directive (``::: jaxdist``); each says
    where its text is without building the site."""
    for page in sorted((DOCS / "api").glob("*.md")):
        if page.name == "index.md":
            continue
        text = page.read_text()
        module = re.search(r"^::: ([\w.]+)$", text, re.M)[1]
        assert f"python -m pydoc {module}" in text and "make docs" in text, page.name
