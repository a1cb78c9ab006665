"""The docs site's promises that a strict mkdocs build cannot check by itself.

``.ci/run`` builds the site with ``mkdocs build --strict`` (broken links, references and
docstrings fail CI). These tests check what the build would accept silently: every page is
reachable from the navigation, the migration guide lists every old name of the alias table,
and the Scala seed's vocabulary is mapped.
"""

from __future__ import annotations

import pathlib
import re

import pytest

from towerdist._src import aliases

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MKDOCS = (ROOT / "mkdocs.yml").read_text()


def _nav_pages() -> set[str]:
    nav = MKDOCS.split("\nnav:", 1)[1]
    nav = re.split(r"\n\S", nav, maxsplit=1)[0]  # up to the next top-level key
    return set(re.findall(r"([\w./-]+\.md)", nav))


def test_every_page_is_in_the_navigation_and_exists():
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    nav = _nav_pages()
    assert nav, "mkdocs.yml has no nav"
    assert nav <= pages, f"nav entries without a page: {sorted(nav - pages)}"
    assert pages <= nav, f"pages missing from the nav: {sorted(pages - nav)}"


def test_the_site_has_the_pages_the_issue_asks_for():
    text = " ".join(p.read_text().lower() for p in DOCS.rglob("*.md"))
    for topic in ("getting started", "migrating from tensorflow", "performance", "error"):
        assert topic in text, topic
    assert "```mermaid" in (DOCS / "concepts.md").read_text(), "concepts.md needs its diagrams"
    assert "mkdocstrings" in MKDOCS and "::: towerdist" in " ".join(p.read_text() for p in DOCS.rglob("*.md"))


@pytest.mark.parametrize("alias", aliases.all_aliases(), ids=lambda a: a.old)
def test_the_tf1_migration_guide_lists_every_old_name(alias):
    guide = (DOCS / "migrating-tf1.md").read_text()
    assert f"`{alias.old}`" in guide, f"{alias.old} is missing from docs/migrating-tf1.md's alias table"


@pytest.mark.parametrize(
    "scala", ["forEachTower", "mergeCall", "towerLocalVariableScope", "colocateVariablesWith", "currentUpdateDevice"]
)
def test_the_scala_vocabulary_is_mapped(scala):
    assert scala in (DOCS / "migrating-tf1.md").read_text()


def test_readme_links_the_docs_and_states_the_promise():
    readme = (ROOT / "README.md").read_text()
    assert "](docs/index.md)" in readme
    assert "## Compatibility promise" in readme and "tests/project/test_api_guarantee.py" in readme


def _requires_python() -> str:
    match = re.search(r'^requires-python = ">=(3\.\d+)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert match, "pyproject.toml has no requires-python lower bound"
    return match.group(1)


@pytest.mark.parametrize("page", ["README.md", "docs/index.md"])
def test_the_install_instructions_state_the_python_pyproject_requires(page):
    text = (ROOT / page).read_text()
    stated = set(re.findall(r"Python (3\.\d+)(?:\+| or newer)", text))
    assert stated == {_requires_python()}, f"{page} says Python {stated}; pyproject.toml requires >={_requires_python()}"


@pytest.mark.parametrize("page", ["README.md", "docs/index.md"])
def test_the_main_jobs_default_replicas_are_described_as_the_example_chooses_them(page):
    example = (ROOT / "examples" / "train_digits.py").read_text()
    most = re.search(r"^MAX_DEFAULT_CPU_REPLICAS = (\d+)", example, re.MULTILINE)
    assert most and "def default_cpu_replicas" in example
    text = " ".join((ROOT / page).read_text().split())
    assert f"else one logical CPU replica per core, at most {most.group(1)}" in text, page
