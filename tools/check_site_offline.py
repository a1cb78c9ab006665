"""Check the built documentation site in a headless browser with the network cut off.

The site must work on an air-gapped machine: its diagrams drawn, nothing fetched from
elsewhere. This script serves a built site on 127.0.0.1 (as ``mkdocs serve`` or any web
server would), opens pages of it in Chromium, aborts every request for another host
(and records it), and checks that

* no page asked for anything off the machine (a CDN script, a web font, ...),
* every ```` ```mermaid ```` diagram of the page was drawn (an ``<svg>`` in each
  ``.mermaid`` element, and no diagram source text such as ``stateDiagram-v2`` left), and
* at the given width, no name in a table is cut in the middle, and the page does not
  scroll sideways. Code blocks whose longest line is wider than the block (they scroll)
  are listed, not failed: console output and pictures may be wider than any screen.

It saves a full-page screenshot of each page and one of each diagram for a person to
look at, and exits 1 on a failed check. ``tests/project/test_docs_site.py`` makes the cheap part of this check (no remote
URL in the HTML and CSS) in CI, which has no browser.

Needs Playwright and a Chromium (Playwright's own download may be blocked; the
distribution's works)::

    python3 -m venv /tmp/venv-pw && /tmp/venv-pw/bin/pip install playwright
    apt-get install -y chromium                       # or: playwright install chromium
    NO_MKDOCS_2_WARNING=1 python -m mkdocs build --strict --site-dir /tmp/site
    /tmp/venv-pw/bin/python tools/check_site_offline.py /tmp/site --out /tmp/site-check

By default it checks the concepts and input pages (diagrams) and the errors page (a wide
table);
name others with ``--page``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import json
import pathlib
import re
import shutil
import sys
import threading
from collections.abc import Iterator
from typing import Any

DEFAULT_PAGES = ["concepts/index.html", "errors/index.html", "input/index.html"]
MERMAID_KEYWORDS = ("stateDiagram-v2", "sequenceDiagram", "flowchart ", "graph TD", "graph LR")

# Measured in the page: what was drawn, what is cut. Runs after the diagrams are drawn.
_MEASURE = """
() => {
  const diagrams = [...document.querySelectorAll('.mermaid')];
  const code = [...document.querySelectorAll('pre > code')];
  const cut = code.filter(c => c.scrollWidth > c.clientWidth + 1)
                  .map(c => c.textContent.split('\\n').reduce((a, b) => a.length >= b.length ? a : b).slice(0, 80));
  // A name in a table cut in the middle: a code span without a space or hyphen on two lines.
  const broken = [...document.querySelectorAll('table code')]
    .filter(c => !/[\s-]/.test(c.textContent) && c.getClientRects().length > 1).map(c => c.textContent);
  const wide = [...document.querySelectorAll('.md-typeset__scrollwrap, .md-typeset__table')]
    .filter(t => t.scrollWidth > t.clientWidth + 1).length;
  // mkdocs-material draws each diagram into a closed shadow root of an emptied element
  return {
    broken_names_in_tables: broken,
    tables_scrolling_sideways: wide,
    drawn: diagrams.filter(d => d.textContent.trim() === '' && d.getBoundingClientRect().height > 20).length,
    text: document.body.innerText,
    code_blocks: code.length,
    cut_code_blocks: cut,
    page_width: document.documentElement.scrollWidth,
    window_width: window.innerWidth,
  };
}
"""


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@contextlib.contextmanager
def serve(site: pathlib.Path) -> Iterator[str]:
    """Serve ``site`` on a free port of 127.0.0.1; yield its base URL."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        thread.join(timeout=10)


def check_page(
    browser: Any, base: str, site: pathlib.Path, name: str, width: int, out: pathlib.Path
) -> tuple[list[str], dict[str, Any]]:
    """Open one page with every other host cut off; return its problems and what was measured."""
    expected = len(re.findall(r'class="mermaid"', (site / name).read_text()))
    context = browser.new_context(viewport={"width": width, "height": 900})
    remote: list[str] = []

    def route(request_route: Any) -> None:
        url = request_route.request.url
        if url.startswith((base, "data:", "blob:", "about:")):
            request_route.continue_()
        else:
            remote.append(url)
            request_route.abort()

    context.route("**/*", route)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(base + name, wait_until="load")
    stem = pathlib.PurePosixPath(name).parent.name or "home"
    if expected:
        try:  # mermaid draws after load: wait for it, then measure whatever is there
            page.wait_for_function(
                f"() => [...document.querySelectorAll('.mermaid')].filter("
                f"d => d.textContent.trim() === '' && d.getBoundingClientRect().height > 20).length >= {expected}",
                timeout=15_000,
            )
        except Exception:  # noqa: BLE001 - a timeout is reported below as undrawn diagrams
            pass
    measured = page.evaluate(_MEASURE)
    measured["diagrams"] = expected
    shot = out / f"{stem}-{width}.png"
    page.screenshot(path=str(shot), full_page=True)
    diagrams = page.locator(".mermaid")
    for index in range(diagrams.count()):
        diagrams.nth(index).screenshot(path=str(out / f"{stem}-{width}-diagram{index + 1}.png"))
    context.close()

    problems = [f"asked for a remote URL (blocked): {url}" for url in remote]
    problems += [f"script error: {error}" for error in errors]
    if measured["drawn"] < expected:
        problems.append(f"{expected - measured['drawn']} of {expected} diagrams not drawn")
    shown = [k for k in MERMAID_KEYWORDS if k in measured["text"]]
    if shown:
        problems.append(f"diagram source shown as text: {shown}")
    problems += [
        f"name cut in the middle in a table at {width} px: {name!r}" for name in measured["broken_names_in_tables"]
    ]
    if measured["page_width"] > measured["window_width"]:
        problems.append(f"the page scrolls sideways: {measured['page_width']} px wide in a {width} px window")
    del measured["text"]
    measured["screenshot"] = str(shot)
    measured["remote_requests"] = remote
    return problems, measured


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("site", type=pathlib.Path, help="the built site (mkdocs build --site-dir)")
    parser.add_argument("--page", action="append", help=f"a page under the site (default: {DEFAULT_PAGES})")
    parser.add_argument("--width", type=int, action="append", help="window widths in px (default: 1280)")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("site-check"), help="screenshots go here")
    parser.add_argument("--chromium", help="the Chromium executable (default: found on PATH)")
    args = parser.parse_args(argv)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("check_site_offline: needs Playwright: pip install playwright", file=sys.stderr)
        return 2
    executable = args.chromium or _chromium()
    args.out.mkdir(parents=True, exist_ok=True)
    failed = False
    with serve(args.site.resolve()) as base, sync_playwright() as playwright:
        # The distribution's Chromium when there is one: Playwright's own download may be blocked.
        browser = playwright.chromium.launch(executable_path=executable) if executable else playwright.chromium.launch()
        for name in args.page or DEFAULT_PAGES:
            for width in args.width or [1280]:
                problems, measured = check_page(browser, base, args.site, name, width, args.out)
                print(f"{name} at {width} px: {json.dumps(measured)}")
                for problem in problems:
                    print(f"  FAIL {problem}")
                failed = failed or bool(problems)
        browser.close()
    print("check_site_offline: " + ("FAILED" if failed else "every check passed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
