"""The resumable sweep runner: grid expansion, YAML errors, interruption and resumption, faults.

Most tests drive the sweep with a stand-in command (a small script written here: it prints a JSON
result, or its "ranks" raise, exit or hang), which runs in a fraction of a second; the last one runs
the real ``distperf run`` with the trainers' fault injection (``DISTPERF_FAULT``).
"""
from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from distperf.config import ConfigError
from distperf.runner.grid import load
from distperf.runner.sweep import flatten

PY = sys.executable
ROOT = Path(__file__).resolve().parents[1]

STAND_IN = textwrap.dedent('''
    """A stand-in for `distperf run --json`: --value V prints {"value": V, ...}; --fault KIND makes its
    second "rank" (a child process) raise, exit, or hang (in a session of its own, deaf to SIGTERM)."""
    import argparse, json, os, signal, subprocess, sys, time

    p = argparse.ArgumentParser()
    p.add_argument("--value", type=int, required=True)
    p.add_argument("--fault", default="none")
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--rank", type=int, default=None)
    p.add_argument("--silent", action="store_true")  # exit 0 without printing a result
    a = p.parse_args()
    if a.rank is not None:  # a rank
        with open(os.environ["STAND_IN_PIDS"], "a") as f:
            f.write(f"{os.getpid()}\\n")
        if a.rank == 1 and a.fault == "raise":
            raise RuntimeError("injected fault in rank 1")
        if a.rank == 1 and a.fault == "exit":
            os._exit(3)
        if a.rank == 1 and a.fault == "hang":
            os.setsid()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            while True:
                time.sleep(1)
        sys.exit(0)
    ranks = [subprocess.Popen([sys.executable, __file__, "--value", str(a.value), "--fault", a.fault, "--rank", str(r)])
             for r in range(2)]
    for r, proc in enumerate(ranks):
        if proc.wait() != 0:
            print(f"stand-in: error: rank {r} exited with status {proc.returncode}", file=sys.stderr)
            sys.exit(1)
    time.sleep(a.sleep)
    gate = os.environ.get("STAND_IN_GATE")  # values from 2 on wait until the test opens the gate
    while gate and a.value >= 2 and not os.path.exists(gate):
        time.sleep(0.02)
    with open(os.environ["STAND_IN_LOG"], "a") as f:
        f.write(f"{a.value}\\n")
    print("some chatter before the result")
    if a.silent:
        sys.exit(0)
    print(json.dumps({"value": a.value, "verbose": a.verbose, "nested": {"a": a.value, "b": {"c": 1}},
                      "losses": [1.0, 0.5]}, indent=1))
''')


def _experiment(tmp_path: Path, body: str, name: str = "exp.yaml") -> Path:
    (tmp_path / "stand_in.py").write_text(STAND_IN)
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def _sweep(*args, env=None, timeout=120):
    return subprocess.run([PY, "-m", "distperf", "sweep", *map(str, args), "--no-progress"], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})}, cwd=ROOT)


def _env(tmp_path):
    return {"STAND_IN_LOG": str(tmp_path / "log.txt"), "STAND_IN_PIDS": str(tmp_path / "pids.txt")}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (finished, not yet reaped by its parent) runs nothing
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:  # it ended between the two looks
        return False  # any other error (no /proc to read) fails the test rather than pass it


# --- grid ------------------------------------------------------------------------------------------

def test_grid_expands_the_cartesian_product_without_excluded_points(tmp_path):
    path = _experiment(tmp_path, """
        description: a grid
        command: predict
        base: {model: small, micro_batch: 2, untied: true}
        env: {OMP_NUM_THREADS: 1}
        grid:
          dp: [1, 2]
          zero: [0, 1, 3]
          env.FOO: [a]
        exclude:
          - {dp: 1, zero: [1, 3]}
        """)
    exp = load(path)
    assert exp.name == "exp"
    points = [(c.params["dp"], c.params["zero"]) for c in exp.configurations]
    assert points == [(1, 0), (2, 0), (2, 1), (2, 3)]  # the first key varies slowest
    first = exp.configurations[0]
    assert first.params == {"model": "small", "micro-batch": 2, "untied": True, "dp": 1, "zero": 0}
    assert first.env == {"OMP_NUM_THREADS": "1", "FOO": "a"}
    assert first.flags() == ["--model", "small", "--micro-batch", "2", "--untied", "--dp", "1", "--zero", "0"]
    hashes = [c.hash for c in exp.configurations]
    assert len(set(hashes)) == 4 and hashes == [c.hash for c in load(path).configurations]


def test_flatten_gives_dotted_columns_and_json_lists():
    assert flatten({"a": {"b": 1, "c": {"d": "x"}}, "l": [1, 2], "e": {}}) == {"a.b": 1, "a.c.d": "x", "l": "[1, 2]",
                                                                             "e": "{}"}


@pytest.mark.parametrize("body, field, rule", [
    ("bogus: 1\n", "exp.yaml: bogus", "unknown key"),
    ("command: predict\nbase: {modle: small}\n", "exp.yaml: base.modle", "did you mean 'model'"),
    ("command: predict\nbase: {dp: [1, 2]}\n", "exp.yaml: base.dp", "lists of values go in grid"),
    ("command: predict\ngrid: {dp: 2}\n", "exp.yaml: grid.dp", "must be a non-empty list"),
    ("command: predict\ngrid: {schedule: [1f1b, bogus]}\n", "exp.yaml: grid configuration schedule=bogus",
     "invalid choice"),
    ("command: predict\nbase: {model: small}\ngrid: {tp: [1, 3]}\n", "exp.yaml: grid configuration tp=3",
     "heads (4) must be divisible by tp (3)"),
    ("command: predict\ngrid: {dp: [1, 2]}\nexclude: [{zero: 1}]\n", "exp.yaml: exclude[0].zero", "not a key of grid"),
    ("command: predict\ngrid: {dp: [1, 1]}\n", "exp.yaml: grid.dp", "lists a value twice"),
    ("command: predict\nbase: {untied: 3}\n", "exp.yaml: base.untied", "true or false"),
    ("command: trian\n", "exp.yaml: command", "must be one of run, predict"),
    ("timeout: -1\n", "exp.yaml: timeout", "positive number"),
    ("memory_limit: lots\n", "exp.yaml: memory_limit", "positive size"),
    ("memory_limit: 1e400\n", "exp.yaml: memory_limit", "from 1 B to 1 EiB"),
    ("grid: [\n", "experiment", "not valid YAML"),
])
def test_yaml_errors_name_the_field_and_the_rule(tmp_path, body, field, rule):
    path = tmp_path / "exp.yaml"
    path.write_text(body)
    with pytest.raises(ConfigError) as e:
        load(path)
    assert e.value.field == field and rule in e.value.rule


def test_bad_input_on_the_command_line_is_one_line_and_status_2(tmp_path):
    missing = _sweep(tmp_path / "nope.yaml")
    assert missing.returncode == 2 and "no such file" in missing.stderr and "Traceback" not in missing.stderr
    path = _experiment(tmp_path, "command: predict\nbase: {modle: small}\n")
    bad = _sweep(path, "--out", tmp_path / "t.csv")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0
    assert "base.modle" in bad.stderr and not (tmp_path / "t.csv").exists()


def test_skip_invalid_turns_a_rejected_configuration_into_a_row(tmp_path):
    path = _experiment(tmp_path, "command: predict\nskip_invalid: true\nbase: {model: tiny}\ngrid: {tp: [1, 3]}\n")
    out = tmp_path / "t.csv"
    proc = _sweep(path, "--out", out)
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(out)
    assert list(table["status"]) == ["ok", "invalid"]
    assert "divisible by tp (3)" in table["message"][1]
    assert table["parameters"][0] > 0  # predict's JSON, flattened


@pytest.mark.parametrize("content", [b"a,b\n1,2\n", b"\x00\xff\xfe garbage \x89PNG\r\n", b'config_hash,status\n"h1,ok\n'],
                         ids=["foreign", "binary", "broken-quote"])
def test_a_foreign_or_corrupted_table_at_out_is_refused_and_kept(tmp_path, content):
    path = _experiment(tmp_path, "command: predict\nbase: {model: tiny}\n")
    out = tmp_path / "t.csv"
    out.write_bytes(content)
    proc = _sweep(path, "--out", out)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert proc.stderr.startswith("distperf sweep: error: out: ") and "Traceback" not in proc.stderr
    assert out.read_bytes() == content  # the old file, untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp.yaml", "stand_in.py", "t.csv"]  # nothing left beside


def test_a_command_that_exits_0_without_a_result_is_a_failed_row(tmp_path):
    path = _experiment(tmp_path, """
        name: silent
        command: ["{python}", stand_in.py]
        base: {value: 1}
        grid: {silent: [false, true]}
        """)
    out = tmp_path / "t.csv"
    proc = _sweep(path, "--out", out, env=_env(tmp_path))
    assert proc.returncode == 1
    table = pd.read_csv(out)
    assert list(table["status"]) == ["ok", "failed"] and list(table["returncode"]) == [0, 0]
    assert table["message"][1] == "exit status 0 but no JSON object on stdout: some chatter before the result"


# --- resuming ----------------------------------------------------------------------------------

def test_an_interrupted_sweep_resumes_where_it_stopped(tmp_path):
    path = _experiment(tmp_path, """
        name: resume
        command: ["{python}", stand_in.py]
        base: {sleep: 0.1}
        grid: {value: [0, 1, 2, 3, 4, 5]}
        """)
    out, env = tmp_path / "resume.csv", {**_env(tmp_path), "STAND_IN_GATE": str(tmp_path / "gate")}
    proc = subprocess.Popen([PY, "-m", "distperf", "sweep", str(path), "--out", str(out), "--no-progress"],
                            env={**os.environ, **env}, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not out.exists() or len(pd.read_csv(out)) < 2):
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        (tmp_path / "gate").touch()  # whatever happened, nothing waits on the gate and the sweep is gone
        proc.kill()
    assert proc.returncode == 130, err
    first = pd.read_csv(out)  # whole rows only: the file is replaced atomically after each one
    assert list(first["arg.value"]) == [0, 1] and set(first["status"]) == {"ok"}  # the third was cut off
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".resume.csv")] == []  # no temporary left

    (tmp_path / "gate").touch()
    again = _sweep(path, "--out", out, env=env)
    assert again.returncode == 0, again.stderr
    assert f"{len(first)} already done" in again.stdout
    table = pd.read_csv(out)
    assert list(table["arg.value"]) == list(range(6)) and set(table["status"]) == {"ok"}
    assert list(table["value"]) == list(range(6)) and list(table["nested.b.c"]) == [1] * 6
    runs = [int(v) for v in (tmp_path / "log.txt").read_text().split()]
    for v in first["arg.value"]:
        assert runs.count(v) == 1  # what was done is not done again
    assert sorted(set(runs)) == list(range(6))
    assert {"machine", "device_name", "torch", "python", "commit", "date", "config_hash"} <= set(table.columns)
    assert table.background_cpu_share.between(0, 1).all()  # distperf.measure.background, per row

    done = _sweep(path, "--out", out, env=env)
    assert "6 already done" in done.stdout and len((tmp_path / "log.txt").read_text().split()) == len(runs)
    forced = _sweep(path, "--out", out, "--force", env=env)
    assert forced.returncode == 0 and len((tmp_path / "log.txt").read_text().split()) == len(runs) + 6
    assert len(pd.read_csv(out)) == 6  # rows replaced, not appended


# --- faults ----------------------------------------------------------------------------------------

def test_ranks_that_raise_exit_or_hang_leave_failed_and_timeout_rows(tmp_path):
    path = _experiment(tmp_path, """
        name: faults
        command: ["{python}", stand_in.py]
        timeout: 2.5
        base: {value: 7}
        grid: {fault: [none, raise, exit, hang]}
        """)
    out, env = tmp_path / "faults.csv", _env(tmp_path)
    proc = _sweep(path, "--out", out, env=env)
    assert proc.returncode == 1  # some configurations failed; the sweep went on
    table = pd.read_csv(out)
    assert list(table["arg.fault"]) == ["none", "raise", "exit", "hang"]
    assert list(table["status"]) == ["ok", "failed", "failed", "timeout"]
    assert "rank 1 exited with status 1" in table["message"][1]
    assert "rank 1 exited with status 3" in table["message"][2]
    assert "no result within 2.5 s" in table["message"][3]
    assert table["value"][0] == 7 and pd.isna(table["value"][1:]).all()
    pids = [int(p) for p in (tmp_path / "pids.txt").read_text().split()]
    assert len(pids) == 8 and not any(_alive(p) for p in pids)  # the hung rank left its group: killed by tag
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []  # no partial file


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("distperf.commands.run") is None, reason="distperf run not available")
def test_real_runs_with_injected_rank_faults_become_failed_rows(tmp_path):
    """The trainers' fault injection (DISTPERF_FAULT=kind:rank:step) in real two-rank runs. A hanging
    rank is left to the stand-in test above and to run's own tests: its row would depend on timing."""
    path = _experiment(tmp_path, """
        name: real-faults
        timeout: 120
        repeats: 1
        base: {model: tiny, dp: 2, steps: 3, device: cpu, hardware: none}
        grid:
          env.DISTPERF_FAULT: ["raise:1:1", "exit:1:1", "kill:1:1"]
        """)
    out = tmp_path / "real.csv"
    proc = _sweep(path, "--out", out, timeout=280)
    assert proc.returncode == 1, proc.stderr
    table = pd.read_csv(out)
    assert list(table["env.DISTPERF_FAULT"]) == ["raise:1:1", "exit:1:1", "kill:1:1"]
    assert list(table["status"]) == ["failed", "failed", "oom"]
    assert "rank 1: RuntimeError: injected fault at step 1" in table["message"][0]
    assert table["message"][1].startswith("the launch failed (exit status")  # a rank died: its peers lose it too
    assert table["message"][2].startswith("killed by SIGKILL (likely the out-of-memory killer) the launch failed")
    assert "rank 1 was killed by signal 9" in table["message"][2]
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("resource") is None, reason="needs setrlimit")
def test_a_memory_limit_gives_oom_rows_from_a_real_allocation_failure_and_from_sigkill(tmp_path):
    """Each process of a configuration limited to 3 GiB of address space: the tiny model trains; a model whose
    first weight alone needs 3 GiB (hidden 16384: the attention's QKV projection, 16384 × 49152 float32) fails
    in torch's CPU allocator at once; a rank killed by SIGKILL, as the out-of-memory killer does, is oom too."""
    path = _experiment(tmp_path, """
        name: memory
        timeout: 150
        repeats: 1
        memory_limit: 3GiB
        base: {model: tiny, dp: 2, steps: 2, device: cpu, hardware: none, no-measure: true}
        grid:
          hidden: [64, 16384]
          env.DISTPERF_FAULT: ["", "kill:1:1"]
        exclude:
          - {hidden: 16384, env.DISTPERF_FAULT: "kill:1:1"}
        """)
    out = tmp_path / "memory.csv"
    proc = _sweep(path, "--out", out, timeout=280)  # each configuration's limit leaves room for a busy machine
    assert proc.returncode == 1, proc.stderr
    table = pd.read_csv(out, keep_default_na=False)
    assert [(h, f) for h, f in zip(table["arg.hidden"], table["env.DISTPERF_FAULT"])] == [
        (64, ""), (64, "kill:1:1"), (16384, "")]
    assert list(table["status"]) == ["ok", "oom", "oom"], table["message"].tolist()
    assert "rank 1 was killed by signal 9" in table["message"][1]
    assert "can't allocate memory" in table["message"][2] and "killed by SIGKILL" not in table["message"][2]
    assert "launch.id" not in table or not table["launch.id"].any()  # one configuration per process
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp.yaml", "memory.csv", "stand_in.py"]


def test_points_measured_in_this_process_share_the_tables_resume(tmp_path):
    from distperf.runner.sweep import sweep_points

    calls = []

    def measure(point):
        calls.append(point["n"])
        if point["n"] == 3 and len(calls) < 4:
            raise RuntimeError("injected fault\nsecond line")
        return {"square": point["n"] ** 2, "nested": {"x": 1}, "n_seen": point["n"]}

    out = tmp_path / "points.csv"
    points = [{"n": 1}, {"n": 2}, {"n": 3}]
    first = sweep_points("squares", points, measure, out, progress=False)
    assert first["ok"] == 2 and first["failed"] == 1 and calls == [1, 2, 3]
    table = pd.read_csv(out)
    assert table.status.tolist() == ["ok", "ok", "failed"] and table.message[2] == "RuntimeError: injected fault"
    assert table.square[:2].tolist() == [1, 4] and table["nested.x"][0] == 1 and table.n.tolist() == [1, 2, 3]
    assert {"config_hash", "machine", "commit", "date"} <= set(table.columns)
    assert table.background_cpu_share.between(0, 1).all()
    second = sweep_points("squares", points, measure, out, progress=False)  # only the failed point again
    assert calls == [1, 2, 3, 3] and second["done"] == 2 and second["ok"] == 1
    assert pd.read_csv(out).status.tolist() == ["ok", "ok", "ok"] and [p.name for p in tmp_path.iterdir()] == ["points.csv"]
    sweep_points("squares", points, measure, out, progress=False, force=True)
    assert calls == [1, 2, 3, 3, 1, 2, 3]


def test_an_experiment_from_a_dictionary_is_checked_like_a_file(tmp_path):
    from distperf.runner.grid import Experiment

    exp = Experiment.from_dict({"name": "squares", "command": "predict", "base": {"model": "tiny"},
                                "grid": {"dp": [1, 2]}}, workdir=tmp_path)
    assert [c.params for c in exp.configurations] == [{"model": "tiny", "dp": 1}, {"model": "tiny", "dp": 2}]
    assert exp.workdir == tmp_path and exp.source == "experiment squares"
    with pytest.raises(ConfigError) as e:
        Experiment.from_dict({"name": "squares", "command": "predict", "grid": {"tp": [3]}})
    assert e.value.field == "experiment squares: grid configuration tp=3" and "divisible" in e.value.rule
    with pytest.raises(ConfigError) as e:
        Experiment.from_dict({"command": "predict"})
    assert e.value.field == "experiment ?: name"
    file = tmp_path / "squares.yaml"
    file.write_text("command: predict\nbase: {model: tiny}\ngrid: {dp: [1, 2]}\n")
    assert [c.hash for c in load(file).configurations] == [c.hash for c in exp.configurations]


# --- repeats ---------------------------------------------------------------------------------------

def test_repeats_give_a_row_each_and_resume_on_their_own(tmp_path):
    path = _experiment(tmp_path, """
        name: rep
        command: ["{python}", stand_in.py]
        grid: {value: [0, 1]}
        """)
    out, env = tmp_path / "rep.csv", _env(tmp_path)
    proc = _sweep(path, "--out", out, "--repeats", "2", env=env)
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(out, dtype={"config_hash": str})
    assert table["repeat"].tolist() == [0, 0, 1, 1] and table["arg.value"].tolist() == [0, 1, 0, 1]
    assert table["config_hash"].tolist()[:2] == table["config_hash"].tolist()[2:]
    assert table["config_hash"][0] == load(path).configurations[0].hash
    assert sorted(int(v) for v in (tmp_path / "log.txt").read_text().split()) == [0, 0, 1, 1]
    more = _sweep(path, "--out", out, "--repeats", "3", env=env)  # only the third repeat is new
    assert "2 ok; 4 already done" in more.stdout and pd.read_csv(out)["repeat"].tolist() == [0, 0, 1, 1, 2, 2]
    listed = _sweep(path, "--out", out, "--repeats", "4", "--list")
    assert listed.stdout.count("3/4 done") == 2 and "4 repeat(s) each" in listed.stdout
    bad = _sweep(path, "--out", out, "--repeats", "0")
    assert bad.returncode == 2 and "repeats" in bad.stderr and bad.stderr.strip().count("\n") == 0


def test_repeats_default_to_three_for_timed_runs_at_scale_cpu(tmp_path):
    from distperf.runner.grid import Experiment

    run = Experiment.from_dict({"name": "r", "base": {"model": "tiny"}})
    assert run.repeats_at("cpu") == run.repeats_at("gpu") == 3 and run.repeats_at("smoke") == 1
    assert Experiment.from_dict({"name": "p", "command": "predict"}).repeats_at("cpu") == 1
    assert Experiment.from_dict({"name": "r", "repeats": 5}).repeats_at("smoke") == 5
    for bad in (0, -1, 2.5, True, "3"):
        with pytest.raises(ConfigError) as e:
            Experiment.from_dict({"name": "r", "repeats": bad})
        assert e.value.field == "experiment r: repeats" and "1 or more" in e.value.rule


def test_a_build_asks_its_repeats_of_every_timed_experiment(tmp_path, monkeypatch):
    from distperf import results
    from distperf.runner.grid import Experiment
    from distperf.runner.sweep import REPEATS_VARIABLE, build_repeats, run_experiment

    (tmp_path / "stand_in.py").write_text(STAND_IN)
    monkeypatch.setattr(results, "fresh_dir", lambda scale: tmp_path)
    for name, value in _env(tmp_path).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(REPEATS_VARIABLE, raising=False)
    spec = {"name": "rep", "command": ["{python}", "stand_in.py"], "repeats": 2, "grid": {"value": [0, 1]}}
    run_experiment(spec, "cpu", device="cpu", progress=False)
    assert pd.read_csv(tmp_path / "rep.csv")["repeat"].tolist() == [0, 0, 1, 1]
    monkeypatch.setenv(REPEATS_VARIABLE, "3")  # `make data REPEATS=3`: only the third round is new
    assert run_experiment(spec, "cpu", device="cpu", progress=False)["ok"] == 2
    assert pd.read_csv(tmp_path / "rep.csv")["repeat"].tolist() == [0, 0, 1, 1, 2, 2]
    assert build_repeats(Experiment.from_dict({**spec, "repeats": 1}), "cpu") is None  # run once: not timed
    assert build_repeats(Experiment.from_dict({"name": "r", "base": {"model": "tiny"}}), "smoke") is None
    for bad in ("0", "-1", "2.5", "three"):
        monkeypatch.setenv(REPEATS_VARIABLE, bad)
        with pytest.raises(ConfigError) as e:
            build_repeats(Experiment.from_dict(spec), "cpu")
        assert e.value.field == REPEATS_VARIABLE and "whole number" in e.value.rule


def test_make_refuses_repeats_that_are_not_a_whole_number():
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "DISTPERF_REPEATS")}
    for bad in ("0", "x", "2.5"):
        proc = subprocess.run(["make", "-n", "data", f"REPEATS={bad}"], capture_output=True, text=True, cwd=ROOT,
                              timeout=60, env=env)
        assert proc.returncode != 0 and "REPEATS must be a whole number" in proc.stderr
    proc = subprocess.run(["make", "-n", "data", "SCALE=smoke", "REPEATS=10"], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, env=env)
    assert proc.returncode == 0 and "_build/executed/smoke-auto-repeats10/" in proc.stdout


# --- the table: one writer, and writes that fail -----------------------------------------------------

def _items(n: int, width: int = 10):
    from distperf.runner.resume import Item

    return [Item(f"h{i}", f"item {i}", lambda i=i: {"config_hash": f"h{i}", "status": "ok", "message": "",
                                                     "value": i, "padding": "x" * width}) for i in range(n)]


def test_a_second_sweep_on_the_same_table_is_refused_and_loses_no_row(tmp_path):
    from distperf.runner.resume import run_all, table_lock

    out = tmp_path / "t.csv"
    run_all("t", _items(2), out, "m", progress=False)
    with table_lock(out):  # a sweep writing it now
        with pytest.raises(ConfigError, match="another sweep is writing this table"):
            run_all("t", _items(4), out, "m", progress=False)
    assert len(pd.read_csv(out)) == 2
    assert run_all("t", _items(4), out, "m", progress=False)["ok"] == 2  # once it is free, the rest is done
    assert len(pd.read_csv(out)) == 4 and [p.name for p in tmp_path.iterdir()] == ["t.csv"]  # no lock left


def test_a_lock_left_by_a_killed_sweep_does_not_block_the_next(tmp_path):
    from distperf.runner.resume import run_all

    out = tmp_path / "t.csv"
    code = ("import sys, os, signal; sys.path.insert(0, sys.argv[2]); from pathlib import Path; "
            "from distperf.runner.resume import table_lock\n"
            "with table_lock(Path(sys.argv[1])): os.kill(os.getpid(), signal.SIGKILL)")
    proc = subprocess.run([PY, "-c", code, str(out), str(ROOT / "lib")], timeout=60)
    assert proc.returncode == -signal.SIGKILL and (tmp_path / ".t.csv.lock").exists()
    assert run_all("t", _items(1), out, "m", progress=False)["ok"] == 1  # the kernel released the dead one's lock


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir()
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True).returncode == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_a_failing_write_leaves_the_previous_table_and_no_temporary_file(tmp_path, fault):
    from distperf.runner.resume import run_all

    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "64k"):
        pytest.skip("cannot mount a tmpfs here")
    try:
        out = disk / "t.csv"
        run_all("t", _items(2), out, "m", progress=False)
        before = out.read_bytes()
        if fault == "read-only":
            subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
            items = _items(3)
        else:
            items = _items(40, width=4000)  # 160 kB of rows on a 64 kB disk
        with pytest.raises(ConfigError, match=r"^out: .*(cannot write|No space|Read-only)"):
            run_all("t", items, out, "m", progress=False)
        table = pd.read_csv(out)  # whole rows only, a prefix of the sweep's
        assert len(table) >= 2 and list(table.value) == list(range(len(table)))
        assert fault == "full" or out.read_bytes() == before
        assert [p.name for p in disk.iterdir()] == ["t.csv"]  # no temporary file, no lock
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
