"""The two instruments of a pipeline's communication side by side (distperf.analysis.pipeline_instruments)."""
import json
import math

import pandas as pd
import pytest

from distperf.analysis import pipeline_instruments as pi


def _run(schedule, m, repeat, clocks, shares, iteration=0.1):
    """A run of two ranks whose wait clock reads ``clocks`` and whose breakdown steps communicate ``shares`` of a
    1 s window, as ``distperf run`` writes it (JSON lists in the cells)."""
    calls = [{"send": c / 10, "recv": c / 5, "wait": c * 0.7} for c in clocks]
    return {"status": "ok", "repeat": repeat, "config.layout.schedule": schedule, "config.layout.microbatches": m,
            "iteration_time_s.median": iteration, "wait_clock_s.per_rank": json.dumps(clocks),
            "wait_clock_s.by_call": json.dumps(calls),
            "time_breakdown_s.per_rank.communication": json.dumps(shares),
            "time_breakdown_s.per_rank.window": json.dumps([1.0, 1.0])}


def test_each_rank_of_each_run_is_read_on_both_instruments():
    table = pd.DataFrame([_run("gpipe", 8, 0, [0.03, 0.02], [0.4, 0.2]), _run("gpipe", 8, 1, [0.05, 0.02],
                                                                             [0.3, 0.1]),
                          {**_run("gpipe", 8, 2, [0.01, 0.01], [0.1, 0.1]), "status": "failed"}])
    runs = pi.per_run(table)
    assert len(runs) == 4  # the failed run is left out
    first = runs.iloc[0]
    assert (first.clock_s, first.send_s, first.recv_s) == pytest.approx((0.03, 0.003, 0.006))
    assert first.breakdown_s == pytest.approx(0.4 * 0.1)  # the share times the run's iteration
    compared = pi.compare(runs, pd.DataFrame([{"schedule": "gpipe", "microbatches": 8, "rank": 0,
                                                "predicted_s": 0.02}]))
    rank0 = compared[compared["rank"] == 0].iloc[0]
    assert rank0.runs == 2 and rank0.clock_s == pytest.approx(0.04) and rank0.breakdown_s == pytest.approx(0.035)
    assert rank0.breakdown_above == 1  # 0.04 > 0.03, 0.03 < 0.05
    assert rank0.error_clock == pytest.approx(0.02 / 0.04 - 1)
    assert math.isnan(compared[compared["rank"] == 1].iloc[0].predicted_s)  # only the rank that ends the iteration
    text = pi.sentence(compared)
    assert text.startswith("gpipe at m = 8, rank 0: 40.0 ms on the clock") and "more in 1 of 2 runs" in text
    assert "-50% against the clock" in text
    assert pi.contrast(compared) == "the breakdown steps read more than the clock in 2 of 4 runs' ranks"  # one schedule
    both = pd.concat([compared, compared.assign(schedule="1f1b", clock_s=compared.clock_s / 2,
                                                predicted_s=compared.predicted_s / 2)])
    assert pi.contrast(both).endswith("the clock of the rank that ends the iteration reads +20.0 ms under gpipe "
                                      "against 1f1b (iterations 100.0 and 100.0 ms), where the model prices +10.0 ms")
    assert pi.contrast(both.iloc[:0]) == "no run kept both instruments"


def test_tables_without_the_clock_give_nothing():
    older = pd.DataFrame([_run("1f1b", 4, 0, [0.01, 0.01], [0.1, 0.1])]).drop(columns=["wait_clock_s.per_rank"])
    assert pi.per_run(older).empty and pi.per_run(None).empty
    assert pi.compare(pi.per_run(older)).empty
    assert pi.sentence(pi.compare(pi.per_run(older))) == "no run kept both instruments"
    assert pi.predictions(None, None).empty


ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]
ARCHIVED = ROOT / "data" / "reference" / "cpu-2c"


@pytest.mark.skipif(not (ARCHIVED / f"{pi.NAME}.csv").exists(), reason="not archived on this machine")
def test_the_archived_experiment_is_priced_on_the_rank_that_ends_the_iteration():
    from distperf.hardware import load_profile

    from distperf import results

    table = results.load(pi.NAME, archived=True)  # as the chapter reads it: with a source column
    assert "source" in table and set(table.source) == {"reference"}
    predicted = pi.predictions(table, load_profile(ARCHIVED / "hardware.json"))
    assert sorted(zip(predicted.schedule, predicted.microbatches)) == [("1f1b", 4), ("1f1b", 8), ("gpipe", 4),
                                                                      ("gpipe", 8)]
    assert (predicted["rank"] == 0).all() and (predicted.predicted_s > 0).all()
    compared = pi.compare(pi.per_run(table), predicted)
    assert len(compared) == 8 and (compared.runs == 6).all() and compared.clock_s.gt(0).all()


def test_the_script_resumes_an_archived_table_and_refuses_bad_input(tmp_path):
    import shutil
    import subprocess
    import sys

    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT / "lib")}
    script = [sys.executable, str(ROOT / "scripts" / "pipeline_instruments.py")]
    bad = subprocess.run(script + ["--repeats", "1"], capture_output=True, text=True, timeout=60, env=env)
    assert bad.returncode == 2 and "at least 2" in bad.stderr
    if not (ARCHIVED / f"{pi.NAME}.csv").exists():
        return
    out = tmp_path / f"{pi.NAME}.csv"
    shutil.copy(ARCHIVED / f"{pi.NAME}.csv", out)
    again = subprocess.run(script + ["--out", str(out)], capture_output=True, text=True, timeout=120, env=env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "'done': 24" in again.stdout and "gpipe at m = 8, rank 0" in again.stdout
