"""The book build fails on a broken cross-reference or a missing figure: the flags `make book` uses (-nW)
turn every Sphinx warning into an error. Each case builds a one-page book with this repository's
_config.yml; the control case shows that the same set-up builds cleanly."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
JB = Path(sys.executable).with_name("jupyter-book")
FLAGS = ["-nW", "--keep-going"]


def build(tmp_path: Path, page: str) -> subprocess.CompletedProcess:
    shutil.copy(ROOT / "_config.yml", tmp_path / "_config.yml")
    shutil.copy(ROOT / "references.bib", tmp_path / "references.bib")
    shutil.copytree(ROOT / "_ext", tmp_path / "_ext")  # the local Sphinx extension _config.yml names
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: index\n")
    (tmp_path / "index.md").write_text(page)
    return subprocess.run([str(JB), "build", str(tmp_path), *FLAGS], capture_output=True, text=True, timeout=300)


def test_make_book_uses_warnings_as_errors():
    assert " ".join(FLAGS) in (ROOT / "Makefile").read_text()


GOOD = ("# A page\n\n(sec-a)=\n## A section\n\nSee {ref}`sec-a` and {cite:p}`lu2024performance`.\n\n"
        "```{bibliography}\n```\n")


@pytest.mark.slow
def test_clean_page_builds(tmp_path):
    result = build(tmp_path, GOOD)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (tmp_path / "_build" / "html" / "index.html").exists()


@pytest.mark.slow
def test_broken_cross_reference_fails_the_build(tmp_path):
    result = build(tmp_path, GOOD + "\nSee {numref}`fig-that-does-not-exist`.\n")
    assert result.returncode != 0
    assert "fig-that-does-not-exist" in result.stdout + result.stderr


@pytest.mark.slow
def test_missing_figure_fails_the_build(tmp_path):
    result = build(tmp_path, GOOD + "\n```{figure} figures/missing.png\n:name: fig-missing\n\nA caption.\n```\n")
    assert result.returncode != 0
    assert "missing.png" in result.stdout + result.stderr


def _offline_extension():
    import importlib.util

    spec = importlib.util.spec_from_file_location("distperf_offline", ROOT / "_ext" / "distperf_offline.py")
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    return ext


def _app(parallel: int, allowed: bool = True):
    from types import SimpleNamespace

    calls = []
    app = SimpleNamespace(config=SimpleNamespace(root_doc="chapters/intro"), parallel=parallel,
                          is_parallel_allowed=lambda kind: allowed, emit=lambda *a: calls.append(("emit", a[0])),
                          builder=SimpleNamespace(read_doc=lambda name: calls.append(("read", name))))
    env = SimpleNamespace(clear_doc=lambda name: calls.append(("clear", name)))
    return app, env, calls


CHAPTERS = [f"chapters/c{k}" for k in range(8)]


def test_the_landing_page_is_read_last_and_on_every_build():
    # it gathers the verdicts every chapter writes as it executes (distperf.analysis.findings)
    ext = _offline_extension()
    for parallel, allowed, pages in [(1, True, CHAPTERS), (2, True, CHAPTERS[:3]), (2, False, CHAPTERS)]:
        app, env, calls = _app(parallel, allowed)
        docnames = [*pages[:2], "chapters/intro", *pages[2:]]
        ext.root_last(app, env, docnames)  # a serial read: the root moves to the end
        assert docnames == [*pages, "chapters/intro"]
        ext.read_root_when_all_merged(app, env, pages, None)
        assert calls == []
    assert ext.reread_root(app, None, set(), set(), set()) == ["chapters/intro"]
    toc = (ROOT / "_toc.yml").read_text()
    assert "root: chapters/intro" in toc
    assert "execution_mode: force" in (ROOT / "chapters" / "intro.md").read_text().split("---")[1]


def test_in_a_parallel_read_the_landing_page_is_read_after_every_other_page_is_merged():
    ext = _offline_extension()
    app, env, calls = _app(2)
    docnames = ["chapters/intro", *CHAPTERS]
    ext.root_last(app, env, docnames)
    assert docnames == CHAPTERS  # what Sphinx hands to its processes
    ext.read_root_when_all_merged(app, env, CHAPTERS[:4], None)
    ext.read_root_when_all_merged(app, env, CHAPTERS[6:], None)
    assert calls == []  # a process's pages are still being read
    ext.read_root_when_all_merged(app, env, CHAPTERS[4:6], None)
    assert calls == [("emit", "env-purge-doc"), ("clear", "chapters/intro"), ("read", "chapters/intro")]
    assert docnames == [*CHAPTERS, "chapters/intro"]  # and it is written with the others
    ext.read_root_when_all_merged(app, env, CHAPTERS[:1], None)
    assert len(calls) == 3  # once per build


def test_the_execution_cache_is_created_before_the_reading_processes_start(tmp_path):
    import sqlite3
    from types import SimpleNamespace

    ext = _offline_extension()
    cache = tmp_path / "_build" / ".jupyter_cache"
    for mode in ("off", "force", "cache"):
        env = SimpleNamespace(mystnb_config=SimpleNamespace(execution_mode=mode, execution_cache_path=str(cache)))
        ext.create_execution_cache(None, env, [])
        assert cache.exists() == (mode == "cache")
    tables = sqlite3.connect(next(cache.glob("*.db"))).execute("select name from sqlite_master where type='table'")
    assert "settings" in {name for (name,) in tables}  # what a second process would otherwise create too
    ext.create_execution_cache(None, SimpleNamespace(), [])  # no myst-nb: nothing to do
    assert "create_execution_cache" in (ROOT / "_ext" / "distperf_offline.py").read_text().split("def setup")[1]


def test_the_number_of_reading_processes(monkeypatch):
    import os

    ext = _offline_extension()
    monkeypatch.delenv("DISTPERF_BOOK_JOBS", raising=False)
    assert ext.jobs() == len(os.sched_getaffinity(0))
    monkeypatch.setenv("DISTPERF_BOOK_JOBS", "3")
    assert ext.jobs() == 3
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv("DISTPERF_BOOK_JOBS", bad)
        with pytest.raises(ValueError, match="DISTPERF_BOOK_JOBS"):
            ext.jobs()


def test_no_line_of_a_chapters_prose_starts_with_a_percent_sign():
    """MyST reads a line that starts with ``%`` as a comment and drops it from the page without a warning, so a
    paragraph wrapped before "% …" loses a line of its text (six lines of "Where the time goes" did, until
    6 December 2026). Code cells are not prose: their lines are left alone."""
    dropped = []
    for page in sorted((ROOT / "chapters").glob("*.md")):
        fenced = False
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
            elif not fenced and line.startswith("%"):
                dropped.append(f"{page.name}:{number}: {line[:60]}")
    assert not dropped, "\n".join(dropped)
