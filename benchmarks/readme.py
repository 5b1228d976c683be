"""Writes benchmark results into the README between a pair of markers."""

import os
import re

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def update_section(text, marker):
    """Puts ``text`` (without its title line, every heading one level deeper) between
    ``<!-- marker:start -->`` and ``<!-- marker:end -->``."""
    start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
    with open(README) as f:
        readme = f.read()
    if start not in readme or end not in readme:
        return
    body = re.sub(r"\n(#+) ", r"\n#\1 ", text.split("\n", 2)[2])
    head, rest = readme.split(start, 1)
    with open(README, "w") as f:
        f.write(head + start + "\n" + body + end + rest.split(end, 1)[1])
