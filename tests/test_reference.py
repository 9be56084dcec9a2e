"""The reference dataset: archiving a build's tables with a manifest, checking it, and a reader's build reading it."""
from __future__ import annotations

import gzip

import pandas as pd
import pytest

from distperf import reference, results
from distperf.results import write_csv_atomic


def _build(directory, rows=3):
    frame = pd.DataFrame({"config_hash": [f"h{i}" for i in range(rows)], "status": ["ok"] * rows,
                          "time_s": [0.1 * (i + 1) for i in range(rows)], "machine": ["cpu-2c"] * rows,
                          "device_name": ["a CPU (2 cores)"] * rows, "commit": ["abc", "abc", "def"][:rows],
                          "date": ["2026-12-01T10:00:00Z", "2026-12-01T11:00:00Z", "2026-12-01T12:00:00Z"][:rows]})
    write_csv_atomic(frame, directory / "exp.csv")
    (directory / "hardware.json").write_text('{"name": "this machine"}')
    return frame


@pytest.fixture
def data(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "DATA", tmp_path)
    monkeypatch.delenv("DISTPERF_FROM", raising=False)
    monkeypatch.delenv("DISTPERF_REFERENCE", raising=False)
    return tmp_path


def test_an_archive_holds_every_table_gzipped_and_a_manifest_of_their_content(data):
    frame = _build(data / "fresh" / "cpu")
    manifest = reference.archive(data / "fresh" / "cpu", data / "reference" / "cpu-2c", "cpu")
    entry = manifest["tables"]["exp.csv.gz"]
    raw = (data / "fresh" / "cpu" / "exp.csv").read_bytes()
    assert entry["sha256"] == reference.sha256(raw) and entry["short"] == entry["sha256"][:12]
    assert entry["rows"] == 3 and entry["commits"] == ["abc", "def"]
    assert (entry["first"], entry["last"]) == ("2026-12-01T10:00:00Z", "2026-12-01T12:00:00Z")
    assert manifest["scale"] == "cpu" and manifest["machine"] == "cpu-2c" and "hardware.json" in manifest["profiles"]
    archived = data / "reference" / "cpu-2c" / "exp.csv.gz"
    assert gzip.decompress(archived.read_bytes()) == raw
    pd.testing.assert_frame_equal(pd.read_csv(archived), frame)
    first = archived.read_bytes()
    reference.archive(data / "fresh" / "cpu", data / "reference" / "cpu-2c", "cpu")
    assert archived.read_bytes() == first  # no timestamp in the gzip: the same table, the same bytes
    assert reference.check(data / "reference" / "cpu-2c") == []
    assert not any(p.name.startswith(".") for p in (data / "reference" / "cpu-2c").iterdir())


def _notebook(path, statuses, end="2026-12-01T12:00:00Z"):
    import json

    cells = [{"cell_type": "code", "metadata": {"papermill": {"status": s}}, "source": "", "outputs": []}
             for s in statuses]
    path.write_text(json.dumps({"cells": cells, "metadata": {"papermill": {"end_time": end, "exception": None}}}))


def test_the_executed_notebooks_that_ran_every_cell_are_archived_beside_the_tables(data):
    _build(data / "fresh" / "cpu")
    executed = data / "executed"
    executed.mkdir()
    _notebook(executed / "done.ipynb", ["completed", "completed"])
    _notebook(executed / "done.part.ipynb", ["completed", "pending"], end=None)  # a rerun in progress: not it
    _notebook(executed / "stopped.part.ipynb", ["completed", "completed"], end=None)
    _notebook(executed / "failed.part.ipynb", ["completed", "failed"], end=None)
    manifest = reference.archive(data / "fresh" / "cpu", data / "reference" / "cpu-2c", "cpu", executed)
    assert {n: e["finished"] for n, e in manifest["notebooks"].items()} == {"done.ipynb": True, "stopped.ipynb": False}
    assert (data / "reference" / "cpu-2c" / "notebooks" / "done.ipynb").read_bytes() == (
        executed / "done.ipynb").read_bytes()
    (data / "reference" / "cpu-2c" / "notebooks" / "stopped.ipynb").write_text("{}")
    assert reference.check(data / "reference" / "cpu-2c") == ["notebooks/stopped.ipynb: missing or changed"]


def test_the_check_finds_a_changed_missing_or_unlisted_table(data):
    _build(data / "fresh" / "cpu")
    where = data / "reference" / "cpu-2c"
    reference.archive(data / "fresh" / "cpu", where, "cpu")
    reference.write_gzip(b"config_hash,status\nh9,ok\n", where / "exp.csv.gz")
    (where / "other.csv").write_text("a\n1\n")
    (where / "hardware.json").write_text("{}")
    assert reference.check(where) == ["exp.csv.gz: content differs from the manifest's sha256",
                                      "other.csv: not in the manifest", "hardware.json: profile missing or changed"]
    (where / "exp.csv.gz").unlink()
    assert reference.check(where)[0] == "exp.csv.gz: listed in the manifest, missing"


def test_a_builds_verdict_records_are_archived_beside_its_tables_and_checked(data, capsys):
    _build(data / "fresh" / "cpu")
    where, figures = data / "reference" / "cpu-2c", data / "figures"
    manifest = reference.archive(data / "fresh" / "cpu", where, "cpu")
    figures.mkdir()
    (figures / "verdict-a.json").write_text('{"chapter": "a", "verdict": "depends"}')
    (figures / "fig-a.svg").write_text("<svg/>")
    updated = reference.archive_verdicts(figures, where)
    assert list(updated["verdicts"]) == ["verdict-a.json"] and updated["verdicts_commit"]
    assert {k: v for k, v in updated.items() if not k.startswith("verdicts")} == manifest  # the rest untouched
    assert reference.check(where) == []
    (where / "verdicts" / "verdict-a.json").write_text('{"chapter": "a", "verdict": "reproduced"}')
    (where / "verdicts" / "verdict-b.json").write_text("{}")
    assert reference.check(where) == ["verdicts/verdict-a.json: missing or changed",
                                      "verdicts/verdict-b.json: not in the manifest"]
    assert reference.main(["--scale", "cpu", "--verdicts", str(data / "nothing"), "--verdicts-only"]) == 2
    assert "no verdict record" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        reference.main(["--scale", "cpu", "--verdicts-only"])
    assert "needs --verdicts" in capsys.readouterr().err


def test_nothing_to_archive_is_one_clear_error(data, capsys):
    assert reference.main(["--scale", "cpu"]) == 2
    assert "no table to archive" in capsys.readouterr().err


def test_a_readers_build_reads_the_archive_in_place_of_fresh_tables(data, monkeypatch):
    _build(data / "fresh" / "cpu")
    reference.archive(data / "fresh" / "cpu", data / "reference" / "cpu-2c", "cpu")
    write_csv_atomic(pd.DataFrame({"config_hash": ["g"], "status": ["ok"]}), data / "reference" / "gpu" / "exp.csv")
    fresh = results.load("exp", "cpu")  # a fresh build: the archive of a build is not added a second time
    assert fresh.source.tolist() == ["fresh"] * 3 + ["reference"]
    assert results.table_digest("exp", "cpu") == reference.sha256((data / "fresh" / "cpu" / "exp.csv").read_bytes())[:12]
    (data / "fresh" / "cpu" / "exp.csv").unlink()
    monkeypatch.setenv("DISTPERF_FROM", "reference")
    reader = results.load("exp", "cpu")
    assert reader.source.tolist() == ["fresh"] * 3 + ["reference"] and reader.time_s.tolist()[:3] == pytest.approx([0.1, 0.2, 0.3])
    assert results.book_dir("cpu") == data / "reference" / "cpu-2c"
    digest = reference.read_manifest(data / "reference" / "cpu-2c")["tables"]["exp.csv.gz"]["short"]
    assert results.table_digest("exp", "cpu") == digest and results.table_digest("nothing", "cpu") is None
    with pytest.raises(FileNotFoundError, match="needs an archived build of that scale"):
        results.book_dir("smoke")
    monkeypatch.setenv("DISTPERF_FROM", "elsewhere")
    with pytest.raises(ValueError, match="DISTPERF_FROM: must be one of fresh, reference"):
        results.load("exp", "cpu")


def test_another_machines_archived_build_stands_beside_this_builds_rows_and_this_machines_does_not(data, monkeypatch):
    _build(data / "fresh" / "cpu")
    reference.archive(data / "fresh" / "cpu", data / "reference" / "cpu-2c", "cpu")  # this machine's own archive
    other = data / "staged"
    other.mkdir()
    write_csv_atomic(pd.DataFrame({"config_hash": ["g"], "status": ["ok"], "time_s": [0.01], "machine": ["h200"]}),
                     other / "exp.csv")
    reference.archive(other, data / "reference" / "h200", "gpu")  # a GPU's, in the same form
    fresh = results.load("exp", "cpu")
    assert fresh.source.tolist() == ["fresh"] * 3 + ["reference"] and fresh.machine.tolist()[-1] == "h200"
    write_csv_atomic(pd.read_csv(data / "fresh" / "cpu" / "exp.csv").assign(machine="laptop-8c"),
                     data / "fresh" / "cpu" / "exp.csv")  # the same build on another machine: the canonical beside
    elsewhere = results.load("exp", "cpu")
    assert elsewhere.source.tolist() == ["fresh"] * 3 + ["reference"] * 4
    assert sorted(set(elsewhere.machine)) == ["cpu-2c", "h200", "laptop-8c"]
    monkeypatch.setenv("DISTPERF_FROM", "reference")  # a reader's build: the canonical archive, the GPU's beside it
    assert results.load("exp", "cpu").machine.tolist() == ["cpu-2c"] * 3 + ["h200"]


def test_an_archived_long_study_is_read_once_in_either_build(data, monkeypatch):
    _build(data / "fresh" / "cpu")
    where = data / "reference" / "cpu-2c"
    write_csv_atomic(pd.DataFrame({"x": [1, 2]}), where / "long.csv")
    reference.archive(data / "fresh" / "cpu", where, "cpu")
    assert "long.csv" in reference.read_manifest(where)["tables"]
    assert results.load("long", "cpu", archived=True).source.tolist() == ["reference", "reference"]
    monkeypatch.setenv("DISTPERF_FROM", "reference")
    assert results.load("long", "cpu", archived=True).source.tolist() == ["fresh", "fresh"]


def test_a_default_fresh_build_reads_the_long_studies_from_the_archive_and_says_so(data, monkeypatch):
    from distperf import book

    monkeypatch.setenv("DISTPERF_FROM", "fresh")  # recorded, so that what read_archive_for sets is undone after
    fresh, where = data / "fresh" / "cpu", data / "reference" / "cpu-2c"
    frame = _build(fresh).assign(experiment="network_bucket")
    write_csv_atomic(frame, fresh / "network_bucket.csv")
    reference.archive(fresh, where, "cpu")
    write_csv_atomic(frame.assign(time_s=9.0), fresh / "network_bucket.csv")  # this machine's own, left unread
    monkeypatch.setattr(results, "archived_builds", lambda: {where})
    assert results.study_of("network_bucket") == "network" and results.study_of("exp") is None
    assert results.load("network_bucket", "cpu").time_s.tolist() == [9.0] * 3  # LONG unset: measured here
    assert results.read_archive_for("network", "cpu") == "This chapter's measurements were made by this build."

    monkeypatch.setenv("DISTPERF_LONG", "archive")
    assert results.study_dir("network", "cpu") == where and results.study_dir("exp", "cpu") == fresh
    with pytest.raises(FileNotFoundError, match="needs an archived build of that scale"):
        results.study_dir("planner", "smoke")  # no archive at that scale: one clear error
    archived = results.load("network_bucket", "cpu")
    assert archived.time_s.tolist() == pytest.approx([0.1, 0.2, 0.3]) and set(archived.source) == {"fresh"}
    assert results.load("exp", "cpu").time_s.tolist() == pytest.approx([0.1, 0.2, 0.3])  # not long: this build's
    short = reference.read_manifest(where)["tables"]["network_bucket.csv.gz"]["short"]
    assert results.table_digest("network_bucket", "cpu") == short
    caption = book.provenance_caption(archived, "cpu")
    assert "reference data" in caption and "this build" not in caption and f"sha256 {short}" in caption
    assert "this build" in book.provenance_caption(results.load("exp", "cpu"), "cpu")
    mixed = book.provenance_caption(pd.concat([results.load("exp", "cpu"), archived], ignore_index=True), "cpu")
    assert mixed.count("(cpu-2c, ") == 2 and mixed.index("this build") < mixed.index("reference data")

    text = results.read_archive_for("network", "cpu")  # a chapter resting on the study: its kernel reads the archive
    assert "data/reference/cpu-2c/" in text and "network_bucket" in text and "LONG=measure" in text
    assert results.book_from() == "reference" and results.book_dir("cpu") == where
    assert results.read_archive_for("network", "cpu").endswith("(a reader's build measures nothing).")
    monkeypatch.setenv("DISTPERF_LONG", "sometimes")
    monkeypatch.setenv("DISTPERF_FROM", "fresh")
    with pytest.raises(ValueError, match="DISTPERF_LONG: must be one of measure, archive"):
        results.study_dir("network", "cpu")


def test_the_long_studies_are_the_makefiles_and_name_the_tables_their_notebooks_write():
    import re

    makefile = (results.ROOT / "Makefile").read_text()
    listed = re.search(r"^LONG_STUDIES := (.*)$", makefile, re.M).group(1).split()
    assert listed == list(results.LONG_STUDIES)
    for study, experiments in results.LONG_STUDIES.items():
        source = (results.ROOT / "notebooks" / f"{study}.ipynb").read_text()
        written = set(re.findall(r'(?:\\"name\\": \\"|sweep_points\(\\")([a-z_0-9]+)', source))
        assert set(experiments) == written, study


@pytest.mark.parametrize("machine", sorted(reference.builds()) or ["none"])
def test_every_committed_archive_agrees_with_its_manifest(machine):
    if machine == "none":
        pytest.skip("no archived build is committed")
    assert reference.check(results.DATA / "reference" / machine) == []
