"""scripts/convergence_reference.py, the long convergence study archived as reference data: its grid pairs 2BW with
training without a pipeline on the same batches, it runs end to end at scale smoke (real runs, held-out loss), and
the archived table keeps its losses as window means that the chapter's analysis reads back."""
import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

from distperf.analysis import twobw

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "convergence_reference.py"
spec = importlib.util.spec_from_file_location("convergence_reference", SCRIPT)
convergence_reference = importlib.util.module_from_spec(spec)
spec.loader.exec_module(convergence_reference)


def test_the_grid_pairs_2bw_with_no_pipeline_for_every_seed_and_learning_rate(capsys):
    assert convergence_reference.main(["--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    runs, target = lines[:-1], lines[-1]
    g = convergence_reference.GRIDS["cpu"]
    assert len(runs) == 2 * len(g["seeds"]) * len(g["lrs"]) and len(g["seeds"]) >= 5 and len(g["lrs"]) >= 2
    assert g["steps"] >= 2000
    assert sum("--pp 2 --schedule 2bw" in r for r in runs) == sum("--pp 1 --schedule none" in r for r in runs)
    assert all("--data text" in r and "--untied" in r and "--eval-batches" in r for r in runs)
    assert target.endswith("twobw_convergence_long.csv")


@pytest.mark.slow
def test_the_smoke_study_runs_and_the_archived_table_reads_back(tmp_path):
    out = tmp_path / "long.csv"
    assert convergence_reference.main(["--scale", "smoke", "--out", str(out)]) == 0
    table = pd.read_csv(out)
    assert (table.status == "ok").all() and table.loss_window.eq(convergence_reference.LOSS_WINDOW).all()
    steps = convergence_reference.GRIDS["smoke"]["steps"]
    windows = -(-steps // convergence_reference.LOSS_WINDOW)
    assert all(len(json.loads(x)) == windows for x in table.losses)
    assert all(len(json.loads(x)) == windows for x in table["iteration_time_s.steps"])
    long = twobw.long_runs(table)
    assert long.steps.eq(len(json.loads(table.losses[0])) * convergence_reference.LOSS_WINDOW).all()
    assert (long.held_out > 0).all()
    gaps = twobw.held_out_gaps(long)
    assert gaps.seeds.tolist() == [2] and gaps.low[0] <= gaps.gap[0] <= gaps.high[0]
    convergence_reference.compact(out)  # compacting again leaves the table as it is
    assert pd.read_csv(out).losses.tolist() == table.losses.tolist()
