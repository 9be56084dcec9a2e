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
    assert ("the clock of the rank that ends the iteration reads +20.0 ms under gpipe against 1f1b (iterations 100.0 "
            "and 100.0 ms), where the model prices +10.0 ms; in the breakdown steps' own seconds") in pi.contrast(both)
    assert rank0.own_s == pytest.approx(0.65) and rank0.steps_comm_s == pytest.approx(0.35)  # of a 1 s window
    assert pi.contrast(both).endswith("rank 0 +0.0 ms of own work and +0.0 ms of communication, rank 1 +0.0 ms of own "
                                      "work and +0.0 ms of communication; the rank whose own work bounds the iteration "
                                      "(rank 1) did no more work under gpipe")
    waited = pd.concat([compared.assign(steps_comm_s=compared.steps_comm_s + 0.01), both.iloc[len(compared):]])
    assert pi.contrast(waited).endswith("did no more work under gpipe and waited longer: the extra waiting lies in the "
                                        "schedule's dependencies, not in slower work")
    slower = pd.concat([compared.assign(own_s=compared.own_s * 1.1), both.iloc[len(compared):]])
    assert pi.contrast(slower).endswith("(rank 1) did 10% more work under gpipe")
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


def test_the_stage_order_script_times_both_orders_and_refuses_bad_input():
    import subprocess
    import sys

    script = ROOT / "scripts" / "stage_order.py"
    run = subprocess.run([sys.executable, str(script), "--model", "tiny", "--passes", "1", "--microbatches", "3"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 2 and "m = 3, gpipe order: median" in lines[0] and "m = 3, 1f1b order: median" in lines[1]
    assert all(line.endswith("ms, 1 pass)") for line in lines)
    for args, message in ((["--model", "nope"], "unknown preset 'nope'"),
                          (["--microbatches", "1"], "--microbatches must be at least 2, got 1")):
        bad = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and message in bad.stderr and "Traceback" not in bad.stderr


def test_both_orders_hold_every_microbatchs_forward_before_its_backward():
    import importlib.util

    spec = importlib.util.spec_from_file_location("stage_order", ROOT / "scripts" / "stage_order.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for m in (2, 3, 8):
        for name, order in module.orders(m).items():
            assert sorted(order) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)]), name
            assert all(order.index(("F", i)) < order.index(("B", i)) for i in range(m)), name
    assert module.orders(4)["1f1b"] == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)]
