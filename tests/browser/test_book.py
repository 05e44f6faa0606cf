"""The rendered book (``make book``: build/book/html), every page opened in Debian's chromium, offline.

The site is served from 127.0.0.1 by a plain static file server; any request for another host is refused
and fails the test (the book must read on a train ride: MathJax and the theme's files come from the site
itself). One crawl opens every HTML page of the site (the search page too) and records what the checks
need; then the tests fail on:

- a request that failed or was answered with an error (a missing image, script or style sheet), an image
  that did not load, or a script error on the page;
- an internal link to a page or file that the site lacks, or to an anchor that the page lacks;
- error or traceback text on a page (``Traceback``, ``Warning``, ``Exception:``, ``Error displaying widget``),
  an output on stderr or a traceback output, or a MathJax error;
- math left as source: every math element typeset by MathJax;
- a notebook without its page, a page without its notebook's title (its first ``# `` heading; typographic
  quotes read as plain ones) as its H1,
  or the navigation out of reading order;
- a folded answer (``attnres_helpers.notebook.folded_answer``) shown open, or one that a click does not open;
- a live widget's output without the line that says the live version needs ``make lab``;
- search that finds nothing for a word every notebook uses.

Where the site is missing or older than a notebook it skips, naming ``make book``; under
ATTNRES_REQUIRE_BOOK=1 (``.ci/run``) that is a failure. Each page's load time is printed (``pytest -s``),
not asserted.
"""

import functools
import http.server
import json
import os
import re
import threading
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from .conftest import REPO_ROOT

pytestmark = pytest.mark.browser
playwright_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install -r requirements-test.txt)"
)

SITE = REPO_ROOT / "build" / "book" / "html"
NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
# As the JupyterLab test of every notebook: no traceback or warning text; and no widget that failed to show.
# (A message an exercise prints on purpose, notebook 04's "ValueError: BCA needs a relative encoding", is not one.)
ERROR_TEXT = re.compile(r"Traceback|Warning|Error displaying widget|Exception:")
SEARCH_WORD = "resolution"

# What the crawl keeps of each page: its H1 (without the permalink), every id, every link and image, the math
# elements and how many MathJax typeset, errors shown, outputs on stderr, folded answers and widget lines.
PAGE_JS = """async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  const h1 = document.querySelector('main h1, article h1, h1');
  let title = null;
  if (h1) { const c = h1.cloneNode(true); c.querySelectorAll('.headerlink').forEach(a => a.remove());
            title = c.textContent.replace(/\\s+/g, ' ').replace(/[\u2018\u2019]/g, "'")
              .replace(/[\u201c\u201d]/g, '"').trim(); }
  const article = document.querySelector('article') || document.body;
  return {
    title,
    ids: Array.from(document.querySelectorAll('[id]')).map(e => e.id)
      .concat(Array.from(document.querySelectorAll('a[name]')).map(e => e.name)),
    links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
    images: Array.from(document.querySelectorAll('img')).map(i => ({src: i.currentSrc || i.src,
      ok: i.complete && i.naturalWidth > 0})),
    math: document.querySelectorAll('.math').length,
    typeset: document.querySelectorAll('.math mjx-container, mjx-container.MathJax').length,
    mathErrors: document.querySelectorAll('mjx-merror').length,
    text: article.innerText,
    stderr: document.querySelectorAll('.output.stderr, .output.traceback, .output_stderr').length,
    folds: Array.from(article.querySelectorAll('.cell_output details')).map(d => ({
      open: d.open, summary: (d.querySelector('summary') || {}).textContent || ''})),
    liveNotes: Array.from(document.querySelectorAll('.attnres-live-note')).map(p => p.textContent),
    nav: Array.from(document.querySelectorAll('nav.bd-docs-nav a.reference.internal')).map(a => a.href),
  };
}"""


def notebook_title(path: Path) -> str:
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
                if line.startswith("# "):
                    return " ".join(line[2:].split())
    raise AssertionError(f"{path.name} has no title")


def widget_cells(path: Path) -> int:
    """How many code cells of the committed notebook show a live widget that is not a progress bar."""
    count = 0
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "application/vnd.jupyter.widget-view+json" in data:
                count += not re.search(r"\|\s*\d+/\d+", "".join(data.get("text/plain", "")))
    return count


@pytest.fixture(scope="module")
def site():
    """The built site's folder; a skip (a failure under ATTNRES_REQUIRE_BOOK=1) where it is absent or stale."""
    problem = None
    index = SITE / "index.html"
    if not index.is_file():
        problem = f"no built book at {SITE.relative_to(REPO_ROOT)}/ (make book)"
    else:
        newer = [p.name for p in NOTEBOOKS if p.stat().st_mtime > index.stat().st_mtime]
        if newer:
            problem = f"the built book is older than {', '.join(newer)} (make book)"
    if problem:
        if os.environ.get("ATTNRES_REQUIRE_BOOK"):
            pytest.fail(problem)
        pytest.skip(problem)
    return SITE


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def served(site):
    """The site over HTTP on 127.0.0.1 (a free port), as a static host serves it."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def pages_of(site: Path) -> list[str]:
    """Every HTML page of the site, relative to it (the theme's own HTML snippets under _static/ aside)."""
    return sorted(
        p.relative_to(site).as_posix() for p in site.rglob("*.html") if "_static" not in p.relative_to(site).parts
    )


@pytest.fixture(scope="module")
def crawl(browser, served, site):
    """Every page opened once: what PAGE_JS keeps, plus the page's failed requests and script errors."""
    context = browser.new_context(viewport={"width": 1300, "height": 1000})
    outside, failed, errors = [], [], []

    def route(route):
        if route.request.url.startswith(served):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    context.route("**/*", route)
    page = context.new_page()
    page.on("requestfailed", lambda r: failed.append(f"{r.url} ({r.failure})"))
    page.on("response", lambda r: r.status >= 400 and failed.append(f"{r.url} (HTTP {r.status})"))
    page.on("pageerror", lambda e: errors.append(str(e)))
    found, times = {}, {}
    try:
        for name in pages_of(site):
            del failed[:], errors[:]
            start = time.perf_counter()
            page.goto(served + name, wait_until="load")
            found[name] = page.evaluate(PAGE_JS)
            times[name] = time.perf_counter() - start
            # what the page still loads after typesetting (MathJax's fonts) finishes here and counts for it:
            # leaving earlier aborts those requests, and the abort would be charged to the next page
            page.wait_for_load_state("networkidle")
            found[name]["failed"], found[name]["errors"] = list(failed), list(errors)
        print(
            f"\nbook: {len(found)} pages, load and typeset "
            f"{sorted(times.values())[len(times) // 2]:.2f} s median, {max(times.values()):.2f} s at most"
        )
        yield {"pages": found, "outside": outside, "page": page, "url": served}
    finally:
        context.close()


def test_every_notebook_has_its_page_with_its_title_in_reading_order(crawl):
    pages = crawl["pages"]
    for notebook in NOTEBOOKS:
        name = f"notebooks/{notebook.stem}.html"
        assert name in pages, f"{notebook.name} has no page in the book"
        assert pages[name]["title"] == notebook_title(notebook), f"{name}: H1 is not the notebook's title"
    assert pages["index.html"]["title"].startswith("attnres"), "the front page is not the README"
    assert pages["GLOSSARY.html"]["title"] == "Glossary"
    order = [urlsplit(u).path.rsplit("/", 1)[-1] for u in pages["index.html"]["nav"]]
    in_order = [n for n in order if n.endswith(".html") and n[:2].isdigit()]
    assert in_order == [f"{p.stem}.html" for p in NOTEBOOKS], f"navigation out of reading order: {in_order}"


def test_no_missing_file_image_request_or_script_error(crawl):
    assert not crawl["outside"], f"pages ask for files outside the site (not offline): {crawl['outside'][:5]}"
    for name, page in crawl["pages"].items():
        assert not page["failed"], f"{name}: failed requests {page['failed'][:5]}"
        assert not page["errors"], f"{name}: script errors {page['errors'][:3]}"
        broken = [i["src"][:120] for i in page["images"] if not i["ok"]]
        assert not broken, f"{name}: images that did not load {broken}"


def test_every_internal_link_resolves(crawl, site):
    pages, url = crawl["pages"], crawl["url"]
    broken = []
    for name, page in pages.items():
        for link in page["links"]:
            if not link.startswith(url):
                continue  # a link out of the site (a paper, a licence) is the reader's choice to follow
            parts = urlsplit(link)
            target = unquote(parts.path[len(urlsplit(url).path) :]) or "index.html"
            if target.endswith("/"):
                target += "index.html"
            if not (site / target).is_file():
                broken.append(f"{name} -> {target} (no such file)")
            elif parts.fragment and target in pages and unquote(parts.fragment) not in pages[target]["ids"]:
                broken.append(f"{name} -> {target}#{parts.fragment} (no such anchor)")
    assert not broken, f"{len(broken)} broken internal links, first: {broken[:8]}"


def test_no_error_text_and_all_math_typeset(crawl):
    for name, page in crawl["pages"].items():
        shown = ERROR_TEXT.search(page["text"])
        assert shown is None, (
            f"{name} shows error text: {page['text'][max(0, shown.start() - 80) : shown.end() + 80]!r}"
        )
        assert page["stderr"] == 0, f"{name}: {page['stderr']} outputs on stderr or tracebacks"
        assert page["mathErrors"] == 0, f"{name}: {page['mathErrors']} MathJax errors"
        assert page["typeset"] >= page["math"], f"{name}: {page['math'] - page['typeset']} math elements left as source"
    assert crawl["pages"]["notebooks/01_deriving_resolution.html"]["math"] > 0, "notebook 01 shows no math at all"


def test_widgets_are_their_pictures_with_the_make_lab_line(crawl):
    for notebook in NOTEBOOKS:
        page = crawl["pages"][f"notebooks/{notebook.stem}.html"]
        expected = widget_cells(notebook)
        assert len(page["liveNotes"]) == expected, (
            f"{notebook.name}: {expected} widgets, {len(page['liveNotes'])} notes"
        )
        assert all("make lab" in note for note in page["liveNotes"])
    assert widget_cells(NOTEBOOKS[1]) >= 1, "notebook 02's explorer is no longer a widget: update this test"


def test_folded_answers_stay_folded_and_open_on_click(crawl):
    folds = {name: page["folds"] for name, page in crawl["pages"].items() if page["folds"]}
    assert len(folds) >= len(NOTEBOOKS) - 1, f"folded answers on {sorted(folds)} only"
    shown_open = [f"{name}: {f['summary']}" for name, fs in folds.items() for f in fs if f["open"]]
    assert not shown_open, f"answers shown open: {shown_open[:5]}"
    page = crawl["page"]
    page.goto(crawl["url"] + "notebooks/01_deriving_resolution.html")
    first = page.locator(".cell_output details").first
    first.locator("summary").click()
    assert first.evaluate("d => d.open"), "a folded answer does not open on click"
    assert first.locator("summary ~ *").first.is_visible(), "an opened answer shows nothing"


def test_search_finds_the_notebooks(crawl):
    page = crawl["page"]
    page.goto(crawl["url"] + f"search.html?q={SEARCH_WORD}")
    results = page.locator("#search-results li")
    results.first.wait_for(timeout=30_000)
    found = page.eval_on_selector_all("#search-results li a", "as => as.map(a => a.href)")
    assert any("/notebooks/" in href for href in found), f"searching '{SEARCH_WORD}' finds no notebook: {found[:5]}"
