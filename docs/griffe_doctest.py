"""A griffe extension for the API pages: jaxdist's docstrings hold bare `>>>` examples
(run as doctests by tests/package/test_doctests.py). Markdown would read them as block quotes and
their printed lists (`[2.0, 4.0]`) as reference links; this wraps each example, prompts and
expected output up to the next blank line, in a ```pycon fence. The docstrings are unchanged.
"""

from __future__ import annotations

from typing import Any

import griffe


def fence_doctests(text: str) -> str:
    r"""Wraps every run of doctest lines (a `>>>` line up to the next blank line) in a fence.

    >>> fence_doctests("Text.\n\n>>> 1 + 1\n2\n\nMore.").splitlines()
    ['Text.', '', '```pycon', '>>> 1 + 1', '2', '```', '', 'More.']
    """
    out: list[str] = []
    in_example = in_fence = False
    indent = ""
    for line in text.splitlines():
        stripped = line.lstrip()
        if stripped.startswith("```"):
            in_fence = not in_fence
        if in_example and not stripped:
            out.append(f"{indent}```")
            in_example = False
        elif not in_example and not in_fence and stripped.startswith(">>>"):
            indent = line[: len(line) - len(stripped)]
            out.append(f"{indent}```pycon")
            in_example = True
        out.append(line)
    if in_example:
        out.append(f"{indent}```")
    return "\n".join(out)


class FenceDoctests(griffe.Extension):
    """Fences the `>>>` examples of every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:  # noqa: ARG002
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = fence_doctests(obj.docstring.value)
