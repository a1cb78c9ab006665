"""Every Python example of the README and the docs runs as written.

A reader copies a page's ```` ```python ```` blocks in order into one interpreter, so each
page runs that way here: its blocks in order, in one fresh namespace, in a subprocess of
its own (examples configure logical CPU devices, which must not leak into other tests or
other pages), in a scratch working directory (examples may write checkpoints), with a
timeout. A failure names the page and the line of the Markdown file, because each block
is compiled with the Markdown file's line numbers.

A block that cannot run on a CPU-only machine with the test extra installed (it needs
GPUs, an MPI launcher, TensorFlow or torch), or that is deliberately partial (a signature,
a ``...`` body), is marked with an HTML comment on the line before its fence, which the
site does not render::

    <!-- skip: needs two GPUs -->
    ```python

The mark must give a reason; it is reported as the skip reason. The package docstring
shown on the API reference's first page runs too.

Run as a script (``python test_docs_examples.py``), this module is the child process: it
reads the blocks as JSON on stdin and runs them.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap
import traceback

import pytest

import towerdist

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PACKAGE = ROOT / "src" / "towerdist" / "__init__.py"
TIMEOUT = 90  # seconds for one page; each runs in a few seconds

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)[ \t]*(?P<info>[^\s`]*)")
_SKIP = re.compile(r"^[ \t]*<!--[ \t]*skip:(?P<reason>.*?)-->[ \t]*$")


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced code block: its file, the line of its first code line, its code."""

    path: str
    line: int
    language: str
    code: str
    skip: str | None  # the reason of a skip mark, None when the block runs


def blocks_of(text: str, path: str) -> list[Block]:
    """The fenced code blocks of a Markdown text, with the skip mark before each (if any)."""
    lines = text.splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        match = _FENCE.match(lines[index])
        if match is None:
            index += 1
            continue
        indent, fence, info = match.group("indent"), match.group("fence"), match.group("info")
        previous = next((line for line in reversed(lines[:index]) if line.strip()), "")
        mark = _SKIP.match(previous)
        end = index + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        body = [line[len(indent) :] if line.startswith(indent) else line.lstrip() for line in lines[index + 1 : end]]
        skip = None if mark is None else mark.group("reason").strip()
        found.append(Block(path, index + 2, info.lower(), "\n".join(body) + "\n", skip))
        index = end + 1
    return found


def python_blocks(page: pathlib.Path) -> list[Block]:
    """The ```` ```python ```` blocks of one page."""
    return [b for b in blocks_of(page.read_text(), str(page.relative_to(ROOT))) if b.language in ("python", "py")]


def docstring_block() -> Block:
    """The example of the package docstring (the ``::`` literal block), as one block."""
    source = PACKAGE.read_text()
    docstring = ast.get_docstring(ast.parse(source), clean=False) or ""
    head, literal = docstring.split("::\n", 1)
    paragraphs = re.split(r"\n(?=\S)", literal, maxsplit=1)  # the literal block ends at the first unindented line
    code = textwrap.dedent(paragraphs[0]).strip("\n") + "\n"
    first_line = source[: source.index(code.splitlines()[0].strip())].count("\n") + 1
    return Block(str(PACKAGE.relative_to(ROOT)), first_line, "python", code, None)


def _run_page(blocks: list[Block], cwd: pathlib.Path) -> None:
    runnable = [dataclasses.asdict(b) for b in blocks if b.skip is None]
    # The child runs elsewhere (cwd), so a relative PYTHONPATH would miss the towerdist under test.
    source_root = str(pathlib.Path(towerdist.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([source_root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run(
        [sys.executable, __file__],
        input=json.dumps(runnable),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=cwd,
        env=env,
    )
    assert done.returncode == 0, f"an example failed:\n{done.stderr[-6000:]}"


PAGE_IDS = [str(p.relative_to(ROOT)) for p in PAGES]
RUNNABLE = {p: [b for b in python_blocks(p) if b.skip is None] for p in PAGES}
WITH_EXAMPLES = [pytest.param(p, id=str(p.relative_to(ROOT))) for p in PAGES if RUNNABLE[p]]


@pytest.mark.timeout(TIMEOUT + 30)
@pytest.mark.parametrize("page", WITH_EXAMPLES)
def test_the_python_examples_of_a_page_run_in_order(page: pathlib.Path, tmp_path: pathlib.Path) -> None:
    _run_page(RUNNABLE[page], tmp_path)


MARKED = [pytest.param(b, id=f"{b.path}:{b.line}") for page in PAGES for b in python_blocks(page) if b.skip]


@pytest.mark.parametrize("block", MARKED)
def test_a_marked_example_is_skipped_with_its_reason(block: Block) -> None:
    """Reports each marked block as a skip with its mark's reason (the page's test leaves it out)."""
    pytest.skip(block.skip)


@pytest.mark.timeout(TIMEOUT + 30)
def test_the_package_docstring_example_runs(tmp_path: pathlib.Path) -> None:
    block = docstring_block()
    assert "MirroredStrategy" in block.code, block.code
    _run_page([block], tmp_path)


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_every_skip_mark_gives_a_reason_and_precedes_a_python_block(page: pathlib.Path) -> None:
    lines = page.read_text().splitlines()
    marks = [n for n, line in enumerate(lines, start=1) if "<!--" in line and "skip" in line]
    # The line of each Python block's mark: the last non-blank line before its fence.
    marked = {
        max(n for n in range(1, b.line - 1) if lines[n - 1].strip()) for b in python_blocks(page) if b.skip is not None
    }
    # A mark that is not right before a Python fence (a typo, or one left behind) would skip nothing.
    stray = [n for n in marks if n not in marked]
    assert not stray, f"{page.name}: the skip marks at lines {stray} are not right before a ```python fence"
    empty = [n for n in marks if not (m := _SKIP.match(lines[n - 1])) or not m.group("reason").strip()]
    assert not empty, f"{page.name}: the skip marks at lines {empty} need a reason: <!-- skip: why -->"


def test_the_collector_reads_indented_blocks_marks_and_line_numbers() -> None:
    text = textwrap.dedent(
        """\
        Intro.

        ```python
        a = 1
        ```

        <!-- skip: needs two GPUs -->
        ```python
        gpu()
        ```

        1. A list item:

            ```python
            if a:
                b = 2
            ```

        ```bash
        ls
        ```
        """
    )
    blocks = blocks_of(text, "page.md")
    assert [(b.line, b.language, b.skip) for b in blocks] == [
        (4, "python", None),
        (9, "python", "needs two GPUs"),
        (15, "python", None),
        (20, "bash", None),
    ]
    assert blocks[2].code == "if a:\n    b = 2\n"


def _child() -> int:
    """Run the blocks read from stdin in one namespace; print the failing block's traceback."""
    namespace: dict[str, object] = {"__name__": "__main__"}
    for block in json.loads(sys.stdin.read()):
        # Padding puts the code at its own line of the Markdown file, so tracebacks point there.
        code = compile("\n" * (block["line"] - 1) + block["code"], block["path"], "exec")
        try:
            exec(code, namespace)
        except BaseException:
            print(f"{block['path']}, the block at line {block['line']}:", file=sys.stderr)
            print(block["code"], file=sys.stderr)
            traceback.print_exc()
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(_child())
