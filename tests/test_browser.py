"""The built book in a real browser (headless Chromium through Selenium, helpers in book_browser.py).

- On a tiny generated site, each check is shown to fail: a broken image, a link to a missing file, a link to a
  missing anchor, a JavaScript error and a script fetched from the network are each reported; a clean page is
  not. Skipped, with the reason, where Chromium is not installed (`make chromium`).
- On the book named by $DISTPERF_BOOK_HTML (`make browser-check`, the last step of `make test`): every page
  opens without any of those problems, search finds a word of the book, no online-only button (launch, Binder,
  Colab, comments) is shown, every glued figure of the chapters is published under its stable name, and each
  chapter's download links work. Screenshots of the landing page and of one chapter, light and dark, go to
  $DISTPERF_ARTIFACTS (default _build/artifacts)/screenshots. Skipped without $DISTPERF_BOOK_HTML.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from book_browser import chromium, missing_browser, page_problems, serve, set_theme, wait_loaded

ROOT = Path(__file__).resolve().parents[1]
BOOK = os.environ.get("DISTPERF_BOOK_HTML")
ARTIFACTS = Path(os.environ.get("DISTPERF_ARTIFACTS", ROOT / "_build" / "artifacts"))
NO_BROWSER = missing_browser()
needs_browser = pytest.mark.skipif(NO_BROWSER is not None, reason=NO_BROWSER or "")
needs_book = pytest.mark.skipif(not BOOK, reason="no built book given: `make browser-check` sets DISTPERF_BOOK_HTML")


@pytest.fixture(scope="module")
def driver():
    with chromium() as d:
        yield d


# ---------------------------------------------------------------------------------------------- the checks fail
CLEAN = "<html><body><h1 id='top'>Clean</h1><a href='index.html#top'>self</a><img src='dot.svg'></body></html>"
DOT = "<svg xmlns='http://www.w3.org/2000/svg' width='4' height='4'><rect width='4' height='4'/></svg>"


@pytest.fixture()
def tiny_site(tmp_path):
    (tmp_path / "index.html").write_text(CLEAN)
    (tmp_path / "dot.svg").write_text(DOT)
    bad = {
        "image.html": "<img src='missing.png'>",
        "link.html": "<a href='nowhere.html'>x</a>",
        "anchor.html": "<a href='index.html#no-such-id'>x</a>",
        "script.html": "<script>undefinedFunction();</script>",
        "remote.html": "<script src='https://cdn.example.invalid/x.js'></script>",
    }
    for name, body in bad.items():
        (tmp_path / name).write_text(f"<html><body><p>x</p>{body}</body></html>")
    return tmp_path


@needs_browser
def test_a_clean_page_has_no_problem(driver, tiny_site):
    with serve(tiny_site) as base:
        assert page_problems(driver, tiny_site, base, "index.html") == []


@needs_browser
@pytest.mark.parametrize("page, expected", [
    ("image.html", "image 'missing.png' does not exist"),
    ("link.html", "link 'nowhere.html' points to a missing file"),
    ("anchor.html", "no element with id 'no-such-id'"),
    ("script.html", "console error"),
    ("remote.html", "from the network"),
])
def test_each_check_catches_its_problem(driver, tiny_site, page, expected):
    with serve(tiny_site) as base:
        problems = page_problems(driver, tiny_site, base, page)
    assert any(expected in p for p in problems), problems


# ------------------------------------------------------------------------------------------------- the book
def book_pages(html: Path) -> list[str]:
    """Every HTML page of the build (not the theme's static files or the copied sources)."""
    skip = ("_static", "_sources", "_images", "figures", "notebooks")
    return sorted(p.relative_to(html).as_posix() for p in html.rglob("*.html")
                  if p.relative_to(html).parts[0] not in skip)


@pytest.fixture(scope="module")
def book():
    html = Path(BOOK)
    assert (html / "index.html").is_file(), f"DISTPERF_BOOK_HTML={BOOK}: no index.html there"
    with serve(html) as base:
        yield html, base


@needs_book
@needs_browser
def test_every_page_loads_cleanly(driver, book):
    html, base = book
    pages = book_pages(html)
    assert len(pages) >= 10, pages
    problems = [p for page in pages for p in page_problems(driver, html, base, page)]
    print(f"{len(pages)} pages checked: {', '.join(pages)}")
    assert not problems, "\n".join(problems)


@needs_book
@needs_browser
def test_search_finds_a_word_of_the_book(driver, book):
    from selenium.webdriver.support.ui import WebDriverWait

    html, base = book
    driver.get(base + "search.html?q=pipeline")
    wait_loaded(driver)
    WebDriverWait(driver, 30).until(lambda d: d.execute_script(
        "return document.querySelectorAll('#search-results li').length") > 0)
    hits = driver.execute_script("return Array.from(document.querySelectorAll('#search-results li a'))"
                                 ".map(a => a.getAttribute('href'))")
    assert any("pipeline_schedules" in h for h in hits), hits


ONLINE_ONLY = re.compile(r"mybinder|binderhub|colab\.research|launch-buttons|thebe-launch|hypothes\.is|utteranc|"
                         r"giscus|dokieli", re.I)


@needs_book
def test_no_online_only_button():
    html = Path(BOOK)
    found = {p.name: sorted(set(m.group(0) for m in ONLINE_ONLY.finditer(p.read_text())))
             for p in html.glob("chapters/*.html")}
    assert not {k: v for k, v in found.items() if v}


def book_chapters() -> list[Path]:
    """The chapters _toc.yml puts in the book."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]] + [c["file"] for part in toc["parts"] for c in part["chapters"]]
    return [ROOT / f"{f}.md" for f in files]


def glued_labels(chapter: Path) -> list[str]:
    return re.findall(r"```\{glue:figure\} ([\w-]+)", chapter.read_text())


@needs_book
def test_every_glued_figure_is_published_under_its_label():
    html = Path(BOOK)
    missing = []
    for chapter in book_chapters():
        for label in glued_labels(chapter):
            kinds = ("svg", "png") if label.startswith("fig-") else ("csv",)
            missing += [f"{label}.{k}" for k in kinds if not (html / "figures" / f"{label}.{k}").is_file()]
    assert not missing, f"not in {html}/figures: {missing}"


@needs_book
def test_the_landing_page_was_built_after_every_chapter_wrote_its_verdict():
    # chapters are read in parallel; the landing page gathers their verdicts, so it must be read after them all
    figures = Path(BOOK).parent / "figures"
    findings = figures / "tbl-findings.csv"
    verdicts = sorted(figures.glob("verdict-*.json"))
    assert verdicts and findings.is_file()
    late = [v.name for v in verdicts if v.stat().st_mtime > findings.stat().st_mtime]
    assert not late, f"written after the landing page's findings table: {late}"
    from distperf.analysis.findings import NOT_BUILT

    assert NOT_BUILT not in findings.read_text()


@needs_book
def test_executed_notebooks_are_published():
    html = Path(BOOK)
    chapters = sorted(p.stem for p in book_chapters() if "{code-cell}" in p.read_text())
    missing = [c for c in chapters if not (html / "notebooks" / "chapters" / f"{c}.ipynb").is_file()]
    missing += [n.name for n in (ROOT / "notebooks").glob("*.ipynb") if not (html / "notebooks" / n.name).is_file()]
    assert not missing, missing


@needs_book
@needs_browser
@pytest.mark.parametrize("theme", ["light", "dark"])
def test_screenshots(driver, book, theme):
    """Kept as artefacts to look at: the landing page, and a chapter scrolled to its first figure."""
    html, base = book
    out = ARTIFACTS / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    driver.get(base + "index.html")
    wait_loaded(driver)
    set_theme(driver, theme)
    assert driver.execute_script("return document.documentElement.dataset.theme") == theme
    assert driver.save_screenshot(str(out / f"landing-{theme}.png"))
    driver.get(base + "chapters/memory_anatomy.html")
    wait_loaded(driver)
    driver.execute_script("const f = document.querySelector('figure'); if (f) f.scrollIntoView();")
    assert driver.save_screenshot(str(out / f"chapter-{theme}.png"))


def pdf_problems(pdf: Path, html: Path) -> list[str]:
    """What the book's PDF lacks against its HTML edition: it must open (poppler's pdfinfo reads its page count,
    pdftoppm renders its first page), hold every numbered figure's caption number and at least as many images as
    the chapters show, and hold no untypeset TeX (MathJax ran before it was printed)."""
    import subprocess
    import tempfile

    if not pdf.is_file():
        return [f"{pdf.name} is missing"]
    info = subprocess.run(["pdfinfo", str(pdf)], capture_output=True, text=True)
    pages = int(re.search(r"^Pages:\s+(\d+)", info.stdout, re.M).group(1)) if info.returncode == 0 else 0
    problems = [] if pages >= 20 else [f"{pdf.name}: {pages} pages (pdfinfo: {info.stderr.strip()[:200]})"]
    with tempfile.TemporaryDirectory() as tmp:
        rendered = subprocess.run(["pdftoppm", "-f", "1", "-l", "1", "-png", "-r", "30", str(pdf), f"{tmp}/page"])
        if rendered.returncode != 0 or not list(Path(tmp).glob("page*.png")):
            problems.append(f"{pdf.name}: pdftoppm cannot render its first page")
    text = subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True, text=True).stdout
    pages_html = " ".join(p.read_text() for p in sorted((html / "chapters").glob("*.html")))
    figures = sorted(set(re.findall(r'<span class="caption-number">(Fig\. [0-9.]+)\s*</span>', pages_html)))
    problems += [f"{pdf.name}: {f} is missing" for f in figures if f not in text]
    images = {m for m in re.findall(r'<img[^>]*src="([^"]*_images/[^"]+)"', pages_html)}
    listed = subprocess.run(["pdfimages", "-list", str(pdf)], capture_output=True, text=True).stdout.splitlines()
    sizes = [(int(f[3]), int(f[4])) for f in (line.split() for line in listed[2:]) if len(f) > 4 and f[2] == "image"]
    # a figure, not a broken-image icon (14 x 16) nor the strips Chromium draws for a box's shadow (wider than 6:1)
    in_pdf = sum(1 for w, h in sizes if w >= 200 and h >= 100 and w <= 6 * h)
    if in_pdf < len({Path(i).name for i in images}):
        problems.append(f"{pdf.name}: {in_pdf} figure images, the chapters show {len(images)}")
    if not figures:
        problems.append("the HTML book has no numbered figure to look for")
    problems += [f"{pdf.name}: untypeset TeX ({tex})" for tex in ("\\frac", "\\left", "\\mathrm") if tex in text]
    return problems


@needs_book
def test_the_pdf_opens_and_holds_every_figure_and_equation():
    import shutil

    if not shutil.which("pdfinfo"):
        pytest.fail("pdfinfo is missing: `make chromium` installs poppler-utils")
    assert pdf_problems(Path(BOOK) / "distperf.pdf", Path(BOOK)) == []
