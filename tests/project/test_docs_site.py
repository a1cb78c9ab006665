"""The built documentation site works without network access and renders as written.

The site is built once here (``mkdocs build --strict``, as ``.ci/run`` does) and its HTML,
CSS and JavaScript are read; CI has no browser. ``tools/check_site_offline.py`` makes the
same checks, and more, in a headless browser with the network cut off.

* No page loads a script or a stylesheet from another host (a CDN, web fonts).
* The diagrams: mkdocs-material draws ```` ```mermaid ```` fences with mermaid, which it
  fetches from a CDN *unless the page has already loaded it*. Every page with a diagram
  loads the site's own copy (``docs/assets/vendor/mermaid``), the copy is the file its
  ``SOURCE.txt`` names, of the major version the theme asks for, and the theme still skips
  its CDN fetch when mermaid is there.
* Markdown that renders other than it reads: a list item written right after an indented
  paragraph is folded into that paragraph as text (``- **Nesting.**`` on the concepts
  page), and material breaks names anywhere in table cells unless the site's stylesheet
  says otherwise.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MERMAID = ROOT / "docs" / "assets" / "vendor" / "mermaid"
BUILD_TIMEOUT = 300

pytestmark = pytest.mark.timeout(BUILD_TIMEOUT + 60)

_REMOTE = re.compile(r"^(?:[a-z][a-z0-9+.-]*:)?//", re.IGNORECASE)  # http://, https://, //host
_SCRIPT_SRC = re.compile(r"<script\b[^>]*\bsrc=\"([^\"]+)\"", re.IGNORECASE)
_LINK = re.compile(r"<link\b[^>]*>", re.IGNORECASE)
_HREF = re.compile(r"\bhref=\"([^\"]+)\"", re.IGNORECASE)
_CSS_URL = re.compile(r"(?:@import\s+(?:url\()?|url\()\s*['\"]?([^'\")\s]+)", re.IGNORECASE)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def _pages(site: pathlib.Path) -> list[pathlib.Path]:
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 10, pages
    return pages


def test_no_page_loads_a_script_or_stylesheet_from_another_host(site: pathlib.Path) -> None:
    remote: list[str] = []
    for page in _pages(site):
        html = page.read_text()
        urls = _SCRIPT_SRC.findall(html)
        for link in _LINK.findall(html):  # stylesheets, preloads, icons, fonts: anything fetched
            if re.search(r"\brel=\"(?:stylesheet|preload|modulepreload|preconnect|icon)\"", link, re.IGNORECASE):
                urls += _HREF.findall(link)
        remote += [f"{page.relative_to(site)}: {url}" for url in urls if _REMOTE.match(url)]
    for css in site.rglob("*.css"):
        remote += [f"{css.relative_to(site)}: {url}" for url in _CSS_URL.findall(css.read_text()) if _REMOTE.match(url)]
    assert not remote, "the site loads from other hosts:\n" + "\n".join(remote[:20])


def test_every_page_with_a_diagram_loads_the_sites_own_mermaid(site: pathlib.Path) -> None:
    with_diagrams = [p for p in _pages(site) if 'class="mermaid"' in p.read_text()]
    assert with_diagrams, "no page has a diagram: the check would prove nothing"
    for page in with_diagrams:
        scripts = _SCRIPT_SRC.findall(page.read_text())
        mermaid = [s for s in scripts if s.endswith("assets/vendor/mermaid/mermaid.min.js")]
        assert mermaid, f"{page.relative_to(site)} draws diagrams but does not load the site's mermaid: {scripts}"
        served = (page.parent / mermaid[0]).resolve()
        assert served.is_file() and served.stat().st_size > 1_000_000, served


def test_the_vendored_mermaid_is_the_file_its_source_note_names() -> None:
    note = (MERMAID / "SOURCE.txt").read_text()
    digest = re.search(r"sha256\(mermaid\.min\.js\) = ([0-9a-f]{64})", note)
    assert digest, "SOURCE.txt must record the file's sha256"
    assert hashlib.sha256((MERMAID / "mermaid.min.js").read_bytes()).hexdigest() == digest.group(1)
    assert "MIT" in (MERMAID / "LICENSE").read_text()  # mermaid's licence ships with it


def test_the_theme_uses_a_loaded_mermaid_of_the_vendored_major_version(site: pathlib.Path) -> None:
    """mkdocs-material fetches mermaid from a CDN only when ``mermaid`` is undefined; if an upgrade
    of the theme changes that, or the major version it asks for, the site would go back to the CDN."""
    bundles = list((site / "assets" / "javascripts").glob("bundle.*.min.js"))
    assert len(bundles) == 1, bundles
    bundle = bundles[0].read_text()
    fetch = re.search(r'typeof mermaid\s*==\s*"undefined"[^;]{0,80}?"https://unpkg\.com/mermaid@(\d+)/', bundle)
    assert fetch, "mkdocs-material no longer skips its CDN fetch when mermaid is loaded: check the diagrams offline"
    vendored = re.search(r"mermaid (\d+)\.\d+\.\d+", (MERMAID / "SOURCE.txt").read_text())
    assert vendored and vendored.group(1) == fetch.group(1), (fetch.group(1), vendored)


def test_no_list_item_is_folded_into_a_paragraph(site: pathlib.Path) -> None:
    folded: list[str] = []
    for page in _pages(site):
        for paragraph in re.findall(r"<p>(.*?)</p>", page.read_text(), re.DOTALL):
            for line in paragraph.splitlines()[1:]:
                if re.match(r"\s*(?:[-*+]|\d+\.) ", line):
                    folded.append(f"{page.relative_to(site)}: {line.strip()[:80]}")
    assert not folded, "list items rendered as paragraph text (add a blank line before them):\n" + "\n".join(folded)


def test_the_sites_stylesheet_keeps_names_in_tables_whole(site: pathlib.Path) -> None:
    page = (site / "errors" / "index.html").read_text()
    sheets = [href for link in _LINK.findall(page) for href in _HREF.findall(link) if href.endswith("extra.css")]
    assert sheets, "the pages do not load assets/stylesheets/extra.css"
    css = (site / "errors" / sheets[0]).resolve().read_text()
    rule = re.search(r"\.md-typeset table:not\(\[class\]\) code\s*\{([^}]*)\}", css)
    assert rule and re.search(r"word-break:\s*normal", rule.group(1)), "table code may break names anywhere"
    assert re.search(r"overflow-wrap:\s*normal", rule.group(1))
