"""Headless Chromium on a built HTML site: serve a folder over http on localhost, open a page, and list what is
wrong with it — images that did not load, internal links whose file or #anchor does not exist, SEVERE entries of
the browser's console (JavaScript errors, failed loads), and resources fetched from the network (an offline book
must not need any)."""
from __future__ import annotations

import functools
import urllib.parse
from html.parser import HTMLParser
from pathlib import Path

from distperf.browser import PAGE_TIMEOUT_S, chromium, missing_browser, serve  # noqa: F401 (the browser check imports them here)


class _Anchors(HTMLParser):
    def __init__(self):
        super().__init__()
        self.names: set[str] = set()

    def handle_starttag(self, tag, attrs):
        for key, value in attrs:
            if key == "id" or (tag == "a" and key == "name"):
                self.names.add(value)


@functools.lru_cache(maxsize=None)
def anchors(path: Path) -> frozenset[str]:
    """Every id (and <a name>) in an HTML file: the fragments a link to it may name."""
    parser = _Anchors()
    parser.feed(path.read_text(errors="replace"))
    return frozenset(parser.names)


def local_file(root: Path, base: str, url: str) -> Path | None:
    """The file under ``root`` that a URL of the local server names (a folder means its index.html)."""
    if not url.startswith(base):
        return None
    path = urllib.parse.unquote(urllib.parse.urlsplit(url).path)
    target = root / path.lstrip("/")
    return target / "index.html" if path.endswith("/") or target.is_dir() else target


_PAGE_FACTS = """
const out = {images: [], links: [], remote: []};
for (const img of document.images) {
  out.images.push([img.getAttribute('src'), img.currentSrc || img.src, img.complete, img.naturalWidth]);
}
for (const a of document.querySelectorAll('a[href]')) out.links.push([a.getAttribute('href'), a.href]);
for (const el of document.querySelectorAll('script[src], link[rel~="stylesheet"][href], iframe[src]')) {
  const url = el.src || el.href;
  if (/^https?:/.test(url) && !url.startsWith(location.origin)) out.remote.push(url);
}
return out;
"""


def wait_loaded(driver) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, PAGE_TIMEOUT_S).until(lambda d: d.execute_script("return document.readyState") == "complete")


def page_problems(driver, root: Path, base: str, page: str) -> list[str]:
    """Open ``page`` (relative to ``root``) and return one line per problem found on it."""
    driver.get_log("browser")  # drop what earlier pages left
    driver.get(base + page)
    wait_loaded(driver)
    facts = driver.execute_script(_PAGE_FACTS)
    problems = []
    for src, url, complete, width in facts["images"]:
        target = local_file(root, base, url)
        if target is not None and not target.is_file():
            problems.append(f"{page}: image {src!r} does not exist ({target.relative_to(root)})")
        elif not complete or width == 0:
            problems.append(f"{page}: image {src!r} did not load (naturalWidth {width})")
    for href, url in facts["links"]:
        target = local_file(root, base, url)
        if target is None:
            continue  # external: not checked offline
        if not target.is_file():
            problems.append(f"{page}: link {href!r} points to a missing file ({target.relative_to(root)})")
            continue
        fragment = urllib.parse.unquote(urllib.parse.urlsplit(url).fragment)
        if fragment and target.suffix == ".html" and fragment not in anchors(target):
            problems.append(f"{page}: link {href!r}: no element with id {fragment!r} in {target.relative_to(root)}")
    for url in facts["remote"]:
        problems.append(f"{page}: fetches {url} from the network (the book must work offline)")
    for entry in driver.get_log("browser"):
        # the browser asks for /favicon.ico by itself; a page that names no icon is not broken
        if entry["level"] == "SEVERE" and not entry["message"].startswith(base + "favicon.ico "):
            problems.append(f"{page}: console error: {entry['message']}")
    return problems


def set_theme(driver, theme: str) -> None:
    """The pydata-sphinx-theme's light/dark mode, as its switcher sets it (localStorage, then a reload)."""
    driver.execute_script("localStorage.setItem('mode', arguments[0]); localStorage.setItem('theme', arguments[0]);"
                          "document.documentElement.dataset.mode = arguments[0];"
                          "document.documentElement.dataset.theme = arguments[0];", theme)
    driver.refresh()
    wait_loaded(driver)
