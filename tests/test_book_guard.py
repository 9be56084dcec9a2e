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
