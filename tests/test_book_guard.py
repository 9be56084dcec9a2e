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


def test_the_landing_page_is_read_last_and_on_every_build():
    # it gathers the verdicts every chapter writes as it executes (distperf.analysis.findings)
    import importlib.util
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("distperf_offline", ROOT / "_ext" / "distperf_offline.py")
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    app = SimpleNamespace(config=SimpleNamespace(root_doc="chapters/intro"))
    docnames = ["chapters/calibration", "chapters/intro", "chapters/twobw"]
    ext.root_last(app, None, docnames)
    assert docnames == ["chapters/calibration", "chapters/twobw", "chapters/intro"]
    assert ext.reread_root(app, None, set(), set(), set()) == ["chapters/intro"]
    toc = (ROOT / "_toc.yml").read_text()
    assert "root: chapters/intro" in toc
    assert "execution_mode: force" in (ROOT / "chapters" / "intro.md").read_text().split("---")[1]
