"""Headless Chromium on a built book: serve a folder over http on localhost, drive the browser (the browser check in
``tests/test_browser.py``), and print the single-page book to PDF (``python -m distperf.browser pdf``).

The PDF is the book for offline reading: Jupyter Book's ``singlehtml`` builder puts every chapter on one page, which
Chromium prints once MathJax has typeset the equations (``Page.printToPDF`` of the DevTools protocol), with the
Chromium the project already installs for the browser check (``make chromium``)."""
from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path

from . import atomic

CHROMIUM = os.environ.get("DISTPERF_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("DISTPERF_CHROMEDRIVER", "/usr/bin/chromedriver")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1280,900"]
PAGE_TIMEOUT_S = 30


def missing_browser() -> str | None:
    """Why the browser checks cannot run here, or None."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not shutil.which(path):
            return f"{path} is missing: `make chromium` installs the Debian packages chromium and chromium-driver"
    return None


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@contextlib.contextmanager
def serve(root: Path):
    """Serve ``root`` on an ephemeral localhost port; yields the base URL (ending in '/')."""
    handler = functools.partial(_Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@contextlib.contextmanager
def chromium():
    """A headless Chromium driven by Selenium, with a fresh profile and the browser console log kept."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="distperf-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS + [f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(PAGE_TIMEOUT_S)
    driver.set_script_timeout(PAGE_TIMEOUT_S)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


TYPESET_TIMEOUT_S = 300
# A4 with 12 mm margins (inches, as the DevTools protocol takes them)
PAGE = {"paperWidth": 8.27, "paperHeight": 11.69, "marginTop": 0.47, "marginBottom": 0.47, "marginLeft": 0.47,
        "marginRight": 0.47}
_TYPESET = """
const done = arguments[arguments.length - 1];
const typeset = () => (window.MathJax && MathJax.startup && MathJax.startup.promise)
    ? MathJax.startup.promise.then(() => done(true), () => done(false)) : done(null);
if (document.readyState === "complete") typeset(); else window.addEventListener("load", typeset);
"""


def print_pdf(root: Path, page: str, out: Path) -> dict:
    """Print ``root/page`` (served over http, so that MathJax loads its parts) to ``out`` once MathJax has typeset
    it; written through a temporary file. Returns ``{"bytes", "mathjax"}`` (``mathjax``: True when it typeset, None
    when the page has none).

    Sphinx's ``singlehtml`` builder writes the single page where the root document lives (``chapters/intro.html``)
    but links its styles, scripts and images relative to the build's root; the page is printed from a copy at the
    root (``book.html``), where they resolve."""
    out, root = Path(out), Path(root)
    shutil.copyfile(root / page, root / "book.html")
    with serve(root) as base, chromium() as driver:
        driver.set_script_timeout(TYPESET_TIMEOUT_S)
        driver.get(base + "book.html")
        typeset = driver.execute_async_script(_TYPESET)
        if typeset is False:
            raise RuntimeError(f"{page}: MathJax failed to typeset")
        pdf = base64.b64decode(driver.execute_cdp_cmd("Page.printToPDF", {"printBackground": True, **PAGE})["data"])
    atomic.write_bytes(out, pdf)
    return {"bytes": len(pdf), "mathjax": typeset}


def main(argv: list[str] | None = None) -> int:
    """``python -m distperf.browser pdf SINGLEHTML_DIR PAGE OUT.pdf``: the single-page book printed to PDF."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m distperf.browser", description=main.__doc__.splitlines()[0])
    p.add_argument("action", choices=["pdf"])
    p.add_argument("root", type=Path, help="the singlehtml build's folder")
    p.add_argument("page", help="the page to print, relative to root (the single page: chapters/intro.html)")
    p.add_argument("out", type=Path)
    a = p.parse_args(argv)
    why = missing_browser()
    if why or not (a.root / a.page).is_file():
        print(f"python -m distperf.browser: error: {why or f'{a.root / a.page} does not exist'}", file=sys.stderr)
        return 2
    done = print_pdf(a.root, a.page, a.out)
    print(f"{a.out}: {done['bytes'] / 1e6:,.1f} MB" + ("" if done["mathjax"] else " (no MathJax on the page)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
