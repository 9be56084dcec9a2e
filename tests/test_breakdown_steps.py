"""The breakdown's steps one by one (distperf.measure.steps), how noisy one step is
(distperf.analysis.breakdown_noise), and scripts/breakdown_steps.py on real gloo ranks."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from distperf.analysis import breakdown_noise as bn
from distperf.measure.breakdown import CLASSES
from distperf.measure.steps import combine_breakdowns, mean_breakdown

ROOT = Path(__file__).resolve().parents[1]


def _step(communication, window):
    """One step's breakdown: ``communication`` and the rest of ``window`` as framework."""
    return {**dict.fromkeys(CLASSES, 0.0), "communication": communication, "framework": window - communication,
            "window": window}


def test_a_ranks_breakdown_is_its_steps_mean_with_each_step_kept():
    found = mean_breakdown([_step(1.0, 4.0), _step(3.0, 6.0)])
    assert found["communication"] == 2.0 and found["window"] == 5.0 and found["framework"] == 3.0
    assert found["per_step"] == {"communication": [1.0, 3.0], "window": [4.0, 6.0]}
    combined = combine_breakdowns([{"breakdown": found}, {"breakdown": mean_breakdown([_step(0.5, 7.0)])}])
    assert combined["rank"] == 1 and combined["window"] == 7.0
    assert combined["per_step"] == {"communication": [[1.0, 3.0], [0.5]], "window": [[4.0, 6.0], [7.0]]}


def _table(shares: dict) -> pd.DataFrame:
    """Runs of one configuration: ``shares`` {repeat: [rank 0's step shares, rank 1's]}, windows of 1 s."""
    return pd.DataFrame([{"status": "ok", "repeat": repeat, "config.layout.schedule": "gpipe",
                          "config.layout.microbatches": 8,
                          "time_breakdown_s.per_step.communication": json.dumps(ranks),
                          "time_breakdown_s.per_step.window": json.dumps([[1.0] * len(r) for r in ranks])}
                         for repeat, ranks in shares.items()])


def _rsd(x):
    return np.std(x, ddof=1) / np.mean(x)


def test_one_steps_noise_is_told_apart_within_and_between_runs():
    runs = {0: [[0.1, 0.3, 0.2], [0.2, 0.2, 0.2]], 1: [[0.3, 0.2, 0.2], [0.3, 0.3, 0.3]],
            2: [[0.2, 0.1, 0.3], [0.25, 0.25, 0.25]]}
    table = pd.concat([_table(runs), _table({3: [[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]]}).assign(status="failed")])
    shares = bn.step_shares(table)
    assert len(shares) == 3 * 2 * 3 and set(shares.configuration) == {"gpipe, m = 8"}
    found = bn.noise(shares).set_index("rank")
    zero = [runs[i][0] for i in range(3)]
    assert found.loc[0, "within"] == pytest.approx(np.mean([_rsd(r) for r in zero]))
    assert found.loc[0, "first_step"] == pytest.approx(_rsd([0.1, 0.3, 0.2]))
    assert found.loc[0, "all_steps"] == pytest.approx(_rsd([np.mean(r) for r in zero]))
    assert found.loc[1, "within"] == pytest.approx(0, abs=1e-12)
    assert found.loc[1, "first_step"] == pytest.approx(found.loc[1, "all_steps"])
    assert (found.runs == 3).all() and (found.steps == 3).all()
    sentence = bn.noise_sentence(found.reset_index())
    assert "3 runs of 3 breakdown steps" in sentence and "not lower in every case" in sentence
    assert "lower than the first step's" in bn.noise_sentence(found.reset_index().iloc[:1])
    assert bn.noise_sentence(bn.noise(bn.step_shares(table.drop(columns=["time_breakdown_s.per_step.window"])))) \
        == "no run kept its breakdown steps"


def test_the_script_measures_resumes_and_refuses_bad_input(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "lib")}
    script = [sys.executable, str(ROOT / "scripts" / "breakdown_steps.py")]
    out = tmp_path / "steps.csv"
    first = subprocess.run(script + ["--repeats", "2", "--out", str(out)], capture_output=True, text=True,
                           timeout=300, env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    table = pd.read_csv(out)
    assert len(table) == 4 and (table.status == "ok").all() and "commit" in table
    found = bn.noise(bn.step_shares(table))
    assert len(found) == 4 and (found.steps == 5).all() and (found.runs == 2).all()
    assert "gpipe, m = 8" in first.stdout and "within" in first.stdout
    again = subprocess.run(script + ["--repeats", "2", "--out", str(out)], capture_output=True, text=True,
                           timeout=300, env=env)
    assert again.returncode == 0 and "'done': 4" in again.stdout and len(pd.read_csv(out)) == 4
    bad = subprocess.run(script + ["--repeats", "1"], capture_output=True, text=True, timeout=60, env=env)
    assert bad.returncode == 2 and "at least 2" in bad.stderr
