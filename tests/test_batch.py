"""Many configurations per launch (distperf.runner.batch), and repeats.

Real launches of the tiny model: two ranks over gloo (torch's launcher) or one process; a few seconds each.
"""
from __future__ import annotations

import pandas as pd
import pytest

from distperf.launch import tagged_processes
from distperf.measure.steps import ALLOCATOR_KEYS
from distperf.runner.batch import launch_once, prepare
from distperf.runner.grid import Experiment
from distperf.runner.sweep import sweep

TINY = {"model": "tiny", "device": "cpu", "hardware": "none"}


def _experiment(tmp_path, **spec) -> Experiment:
    return Experiment.from_dict({"name": "batch", "env": {"OMP_NUM_THREADS": 1}, **spec}, workdir=tmp_path)


@pytest.mark.slow
def test_two_runs_give_the_same_memory_and_communication_bytes(tmp_path):
    """Why repeats after the first measure no memory: the bytes are the same in every run, in a fresh launch or
    after another configuration in the same process group."""
    x, y = _experiment(tmp_path, base={**TINY, "dp": 2, "steps": 1}, grid={"zero": [0, 3]}).configurations
    together = list(launch_once([prepare(x, 0, 60), prepare(y, 0, 60), prepare(x, 0, 60)], 60))
    alone = list(launch_once([prepare(x, 0, 60)], 60))
    assert [o.status for _, o in together + alone] == ["ok"] * 4
    results = [o.result for _, o in together + alone]
    assert [r["config"]["layout"]["zero"] for r in results] == [0, 3, 0, 0]  # each result is its configuration's
    assert [r["launch"]["position"] for r in results] == [0, 1, 2, 0]
    first, second, third = results[0], results[2], results[3]
    def tensors(memory: dict) -> dict:  # the tensors' bytes; the allocator's (RSS) differ from run to run
        return {k: tensors(v) if isinstance(v, dict) else v for k, v in memory.items() if k not in ALLOCATOR_KEYS}

    assert tensors(first["memory_bytes"]) == tensors(second["memory_bytes"]) == tensors(third["memory_bytes"])
    assert first["memory_bytes"]["total"] > 0 and first["memory_bytes"] != results[1]["memory_bytes"]
    for section in ("bytes", "sent_bytes", "calls"):
        assert first["communication"][section] == second["communication"][section] == third["communication"][section]
    assert first["placement"]["threads"] == 1 and len(first["placement"]["cores"]) == 2


@pytest.mark.slow
def test_repeats_run_in_separate_launches_and_only_the_first_measures_memory(tmp_path):
    exp = _experiment(tmp_path, base={**TINY, "steps": 2}, grid={"micro-batch": [1, 2]}, repeats=2)
    out = tmp_path / "t.csv"
    counts = sweep(exp, out, timeout=150, progress=False)
    assert counts["ok"] == 4
    table = pd.read_csv(out, dtype={"config_hash": str})
    assert table["repeat"].tolist() == [0, 0, 1, 1] and table["arg.micro-batch"].tolist() == [1, 2, 1, 2]
    assert table["config_hash"].tolist()[:2] == table["config_hash"].tolist()[2:]
    assert table["config_hash"][0] == exp.configurations[0].hash  # repeat 0 keeps the configuration's hash
    launches = table.groupby("repeat")["launch.id"].agg(set)
    assert all(len(ids) == 1 for ids in launches) and not launches[0] & launches[1]  # one launch per repeat round
    assert table["memory_bytes.total"][:2].notna().all() and table["memory_bytes.total"][2:].isna().all()
    assert table["iteration_time_s.median"].notna().all()
    assert (table["config.layout.micro_batch"] == table["arg.micro-batch"]).all()

    table.loc[3, "status"] = "failed"  # a repeat resumes on its own
    table.to_csv(out, index=False)
    again = sweep(exp, out, timeout=150, progress=False)
    assert again["done"] == 3 and again["ok"] == 1
    assert len(pd.read_csv(out)) == 4


@pytest.mark.slow
def test_a_configuration_that_hangs_is_a_timeout_and_the_rest_go_on_in_a_fresh_launch(tmp_path):
    exp = _experiment(tmp_path, base=TINY, env={"OMP_NUM_THREADS": 1, "DISTPERF_FAULT": "hang:0:1"},
                      grid={"seed": [0, 1, 2], "steps": [1, 3]}, repeats=1,
                      exclude=[{"seed": [0, 2], "steps": 3}, {"seed": 1, "steps": 1}])  # only the second has step 1
    out = tmp_path / "t.csv"
    counts = sweep(exp, out, timeout=15, progress=False)
    assert counts["ok"] == 2 and counts["timeout"] == 1
    table = pd.read_csv(out)
    assert table["status"].tolist() == ["ok", "timeout", "ok"]
    assert "no result within 15 s" in table["message"][1]
    assert table["launch.id"][0] != table["launch.id"][2] and table["launch.position"].tolist()[::2] == [0, 0]
    assert tagged_processes("DISTPERF_FAULT", "hang:0:1", strict=True) == []  # the hung process was killed


def test_a_configuration_that_sets_measure_measures_every_repeat(tmp_path):
    """Waiting times differ from run to run, so an experiment that asks for ``measure`` gets it in every repeat;
    without it only repeat 0 measures (the bytes are the same in every run)."""
    plain, measured = (_experiment(tmp_path, base={**TINY, "steps": 2, **extra}, grid={"dp": [1]}).configurations[0]
                       for extra in ({}, {"measure": True}))
    assert [prepare(plain, r, 60).options.measure for r in (0, 1, 2)] == [True, False, False]
    assert [prepare(measured, r, 60).options.measure for r in (0, 1, 2)] == [True, True, True]


def test_a_run_that_would_calibrate_the_machine_runs_outside_a_launch(tmp_path, monkeypatch):
    """``--hardware auto`` with no profile of this machine: run's quick calibration starts process groups of its own,
    which a launch's ranks cannot (torch refuses a second default group), so the sweep runs that configuration in a
    process of its own; with a profile, or with ``--hardware none``, it joins a launch."""
    from distperf.measure import profiles
    from distperf.runner.batch import Job

    auto = _experiment(tmp_path, base={**TINY, "hardware": "auto"}, grid={"dp": [1]}).configurations[0]
    monkeypatch.setattr(profiles, "auto_profiles", lambda threads: [tmp_path / "hardware.json"])
    assert prepare(auto, 0, 60).calibrates_now
    (tmp_path / "hardware.json").write_text("{}")  # a profile (its sidecar unknown: any thread count)
    assert not prepare(auto, 0, 60).calibrates_now
    none = _experiment(tmp_path, base=TINY, grid={"dp": [1]}).configurations[0]
    (tmp_path / "hardware.json").unlink()
    assert not prepare(none, 0, 60).calibrates_now

    monkeypatch.setattr(Job, "calibrates_now", property(lambda job: job.cfg.params.get("steps") == 2))
    exp = _experiment(tmp_path, base=TINY, grid={"steps": [1, 2]}, repeats=1)
    out = tmp_path / "t.csv"
    assert sweep(exp, out, timeout=150, progress=False)["ok"] == 2
    table = pd.read_csv(out)
    assert table["launch.id"].notna().tolist() == [True, False]  # the second ran on its own
