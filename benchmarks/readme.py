"""Writes benchmark results into the docs' Benchmarks page between a pair of markers."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every page that holds a marker pair gets the section: the Benchmarks page (the figures' home);
# the README too, should it hold a pair again.
PAGES = [os.path.join(ROOT, "docs", "benchmarks.md"), os.path.join(ROOT, "README.md")]


def update_section(text, marker):
    """Puts ``text`` (without its title line, every heading one level deeper) between
    ``<!-- marker:start -->`` and ``<!-- marker:end -->`` of every page in PAGES that has them."""
    start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
    body = re.sub(r"\n(#+) ", r"\n#\1 ", text.split("\n", 2)[2])
    for page in PAGES:
        if not os.path.exists(page):
            continue
        with open(page) as f:
            content = f.read()
        if start not in content or end not in content:
            continue
        head, rest = content.split(start, 1)
        with open(page, "w") as f:
            f.write(head + start + "\n" + body + end + rest.split(end, 1)[1])
