"""Griffe extension for the docs build: render ``Example:`` sections as examples.

towerdist's docstrings follow Google style with a singular ``Example:`` heading (STYLE.md).
Griffe's Google parser only treats the plural ``Examples:`` as an examples section (with
``>>>`` lines rendered as Python console code); a singular ``Example:`` becomes a plain
admonition whose ``>>>`` lines Markdown turns into nested block quotes. This extension
renames the heading before the docstring is parsed. A titled heading such as
``Example (seed 000's example):`` keeps its title as the first line of the section.

It changes only what the documentation shows; the source is untouched. Loaded by
``mkdocs.yml`` (``plugins.mkdocstrings.handlers.python.options.extensions``).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE_HEADING = re.compile(r"^(?P<indent>[ \t]*)Example(?: \((?P<title>[^)]*)\))?:[ \t]*$", re.MULTILINE)


def _rewrite(text: str) -> str:
    def replace(match: re.Match[str]) -> str:
        indent, title = match.group("indent"), match.group("title")
        heading = f"{indent}Examples:"
        if title:
            body_indent = indent + "  "
            return f"{heading}\n{body_indent}{title[:1].upper()}{title[1:]}:\n"
        return heading

    return _EXAMPLE_HEADING.sub(replace, text)


class ExampleSections(griffe.Extension):
    """Renames ``Example:`` docstring headings to ``Examples:`` (see the module docstring)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:  # noqa: ARG002
        """Rewrites the docstring of every object griffe loads."""
        if obj.docstring is not None:
            obj.docstring.value = _rewrite(obj.docstring.value)
