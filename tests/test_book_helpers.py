"""How the chapters present results (distperf.book, plots.per_machine) and the rules of their sources: every
glued figure has a label, a caption that names its data's provenance and links its files under that label;
several machines' rows appear side by side; CITATION.cff is valid Citation File Format."""
import re
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import yaml  # noqa: E402

from distperf import book, plots, results  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TOC = yaml.safe_load((ROOT / "_toc.yml").read_text())
CHAPTERS = [ROOT / f"{f}.md" for f in [TOC["root"]] + [c["file"] for part in TOC["parts"] for c in part["chapters"]]]


def two_machines():
    """A synthetic table of this build's CPU and a reference GPU: shapes only, never shown in the book."""
    prov = dict(torch="2.13.0", python="3.11", scale="smoke")
    cpu = [dict(prov, machine="cpu-2c", device_name="Some CPU (2 cores)", commit="aaa", date="2026-11-29T10:00:00Z",
                source="fresh", x=i, y=2 * i) for i in range(3)]
    gpu = [dict(prov, machine="nvidia-h200", device_name="NVIDIA H200", commit="bbb", date=f"2026-11-2{i}T10:00:00Z",
                source="reference", x=i, y=i) for i in range(1, 3)]
    return pd.DataFrame(gpu + cpu)  # reference rows first: the helpers put this build's first


def test_provenance_names_each_machine_this_build_first():
    text = book.provenance_caption(two_machines())
    first, second = text.split("; ")
    assert first == "Some CPU (2 cores) (cpu-2c, this build), 2026-11-29, commit aaa, scale smoke"
    assert second == "NVIDIA H200 (nvidia-h200, reference data), 2026-11-21 to 2026-11-22, commit bbb, scale smoke"


def test_provenance_names_the_sweep_table_and_its_content_hash(tmp_path, monkeypatch):
    from distperf import reference

    monkeypatch.setattr(results, "DATA", tmp_path)
    monkeypatch.delenv("DISTPERF_FROM", raising=False)
    frame = two_machines().assign(experiment="exp")
    assert "; table" not in book.provenance_caption(frame, "smoke")  # no table of the book's own: nothing to name
    results.write_csv_atomic(frame[frame.source == "fresh"].drop(columns="source"), tmp_path / "fresh" / "smoke" / "exp.csv")
    digest = reference.sha256((tmp_path / "fresh" / "smoke" / "exp.csv").read_bytes())[:12]
    assert book.provenance_caption(frame, "smoke").endswith(f"scale smoke; table exp sha256 {digest}")


def test_per_machine_draws_one_titled_row_per_machine():
    seen = []

    def draw(sub, rows):
        seen.append(set(rows.machine))
        sub.subplots(1, 2)[0].plot(rows.x, rows.y)

    fig = plots.per_machine(two_machines(), draw)
    assert seen == [{"cpu-2c"}, {"nvidia-h200"}]
    assert [s._suptitle.get_text() for s in fig.subfigs] == ["Some CPU (2 cores) (cpu-2c)", "NVIDIA H200 (nvidia-h200)"]
    plt.close(fig)
    one = plots.per_machine(two_machines().query("machine == 'cpu-2c'"), draw)
    assert not one.subfigs and len(one.axes) == 2
    plt.close(one)


def test_glue_figure_writes_svg_and_png_under_its_label_with_provenance(tmp_path, monkeypatch):
    monkeypatch.setenv(book.FIGURES_ENV, str(tmp_path))
    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    book.glue_figure("fig-a-label", fig, "Some CPU, 2026-11-29, commit aaa, scale smoke")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig-a-label.png", "fig-a-label.svg"]
    assert "commit aaa, scale smoke" in (tmp_path / "fig-a-label.svg").read_text()
    assert b"commit aaa" in (tmp_path / "fig-a-label.png").read_bytes()
    book.glue_table("tbl-a-label", pd.DataFrame({"a": [1]}).style, "prov")
    assert (tmp_path / "tbl-a-label.csv").read_text().splitlines() == ["a", "1"]
    with pytest.raises(ValueError, match="name"):
        book.glue_figure("fig a/b", plt.figure(), "prov")


def test_the_same_figure_gives_the_same_bytes(tmp_path, monkeypatch):
    def draw():
        fig, ax = plt.subplots()
        ax.plot([1, 2], [3, 4])  # a clipped line: its SVG clip-path gets an id
        ax.fill_between([1, 2], [0, 1], [2, 3], alpha=0.2)
        return fig

    files = []
    for k in range(2):
        monkeypatch.setenv(book.FIGURES_ENV, str(tmp_path / str(k)))
        book.glue_figure("fig-same", draw(), "prov")
        files.append({p.name: p.read_bytes() for p in (tmp_path / str(k)).iterdir()})
    assert files[0] == files[1] and b"clip-path" in files[0]["fig-same.svg"]


def test_hardware_profiles_names_the_profile_and_its_numbers(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "DATA", tmp_path)
    with pytest.raises(FileNotFoundError, match="calibration"):
        book.hardware_profiles("smoke")
    (tmp_path / "fresh" / "smoke").mkdir(parents=True)
    profile = dict(name="calibrated-cpu-2c", flops_fp32=1.1e11, flops_16bit=4.9e11, memory_bandwidth=3.9e10,
                   memory_capacity=2**34, intra_bandwidth=9.1e8, intra_latency=1.3e-4, inter_bandwidth=9.1e8,
                   inter_latency=1.3e-4, devices_per_node=2)
    import json
    (tmp_path / "fresh" / "smoke" / "hardware.json").write_text(json.dumps(profile))
    text = book.hardware_profiles("smoke")
    assert text.startswith("this build: calibrated-cpu-2c: 110 GFLOP/s fp32, 490 GFLOP/s 16-bit")
    assert "16.0 GiB" in text and "α = 130.0 µs" in text and "β = 0.91 GB/s" in text


def glued_figures(text):
    return re.findall(r"```\{glue:figure\} ([\w-]+)\n(.*?)\n```", text, flags=re.S)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.name)
def test_every_glued_figure_is_labelled_captioned_and_saved(chapter):
    text = chapter.read_text()
    for name, body in glued_figures(text):
        assert f":name: {name}\n" in body, f"{chapter.name}: {name} has no :name: label of its own"
        caption = body.split(f":name: {name}\n", 1)[1].strip()
        assert f"{{glue:text}}`{name}-provenance`" in caption, f"{chapter.name}: {name}'s caption names no provenance"
        kinds = ("svg", "png") if name.startswith("fig-") else ("csv",)
        for kind in kinds:
            assert f'href="../figures/{name}.{kind}"' in caption, f"{chapter.name}: {name} does not link its {kind}"
        if name == f"tbl-{chapter.stem.replace('_', '-')}-rule":  # the verdict's table (book.glue_verdict)
            assert f'book.glue_verdict("{chapter.stem}",' in text, f"{chapter.name}: {name} is not its rule's table"
            continue
        helper = "glue_figure" if name.startswith("fig-") else "glue_table"
        assert f'book.{helper}("{name}",' in text, f"{chapter.name}: {name} is not glued through book.{helper}"


def test_chapters_glue_figures_only_through_the_book_helpers():
    bare = [(c.name, m) for c in CHAPTERS for m in re.findall(r'(?<![\w.])glue\("((?:fig|tbl)-[\w-]+)"', c.read_text())]
    assert not bare, bare


def test_citation_cff_is_valid():
    cffconvert = Path(sys.executable).with_name("cffconvert")
    done = subprocess.run([str(cffconvert), "--validate", "-i", str(ROOT / "CITATION.cff")], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_cffconvert_rejects_an_invalid_file(tmp_path):
    bad = tmp_path / "CITATION.cff"
    bad.write_text((ROOT / "CITATION.cff").read_text().replace("\nauthors:", "\nwriters:", 1))  # 'authors' is required
    cffconvert = Path(sys.executable).with_name("cffconvert")
    done = subprocess.run([str(cffconvert), "--validate", "-i", str(bad)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
