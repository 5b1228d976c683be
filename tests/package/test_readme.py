"""The README, the landing page: its code runs as printed, it stays short, its links resolve.

The docs pages' code blocks run in tests/package/test_docs_examples.py.
"""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
EXAMPLE = re.compile(r"## In 15 lines\n\n```python\n(.*?)```", re.S)


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_readme_example_runs():
    example = EXAMPLE.search(README.read_text()).group(1)
    assert len(example.strip().splitlines()) == 15  # the heading's count, blank lines included
    code = example + (
        "\nw0 = strategy.experimental_local_results(w)[0]"
        "\nprint('total', float(total), 'w', [round(float(a), 4) for a in w0])\n"
    )
    out = run(code)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("total ")


def test_readme_python_blocks_are_the_example():
    """Every ```python block of the README is the tested example (another one would go untested)."""
    text = README.read_text()
    assert re.findall(r"^```python\n(.*?)^```", text, re.S | re.M) == [
        EXAMPLE.search(text).group(1)
    ]


def test_readme_jit_line_runs():
    """The README's one-line jitted step, after the 15-line example's definitions."""
    text = README.read_text()
    line = re.search(r"`(train = jax\.jit\(.*?\))`", text).group(1)
    code = (
        EXAMPLE.search(text).group(1)
        + line
        + "\nw = strategy.experimental_distribute_values_from_function(lambda ctx: jnp.zeros(4))"
        + "\nfor x in strategy.experimental_distribute_dataset(data):\n    w, loss = train(w, x)"
        + "\nprint('total', float(strategy.reduce('SUM', loss, axis=None)))\n"
    )
    out = run(code)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("total ")


def test_readme_example_is_the_getting_started_one():
    """The docs' getting-started page shows the same 15 lines (one text, two places to read it)."""
    readme = EXAMPLE.search(README.read_text()).group(1)
    page = EXAMPLE.search((ROOT / "docs" / "getting-started.md").read_text()).group(1)
    assert readme == page


def test_readme_is_a_short_landing_page():
    assert len(README.read_text().splitlines()) <= 250


def test_readme_links_resolve():
    text = README.read_text()
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.*)$", text, re.M)
    }
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    assert targets
    for target in targets:
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        if path:
            assert (ROOT / path).exists(), target
        else:
            assert anchor in anchors, target
