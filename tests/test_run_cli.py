"""``python -m distperf run`` and the per-rank entry point ``python -m distperf.train``.

Launches go through torch's launcher as a user's would (a few seconds each): the JSON result, equality
with the single-device run, refusal of bad layouts before any process starts, and failing, exiting
and hanging ranks ending the run inside its timeout with no process left behind.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from dist_harness import TOLERANCE, relative_error
from distperf import cli
from distperf.commands import run as run_command
from distperf.launch import tagged_processes

PY = sys.executable
TINY = ["--model", "tiny", "--device", "cpu", "--steps", "3"]


def _tagged(tag: str) -> list[int]:
    return tagged_processes("TEST_RUN_TAG", tag)


def distperf(*args, env=None, timeout=120):
    """Run the CLI in a fresh process; returns (completed process, tag carried by every process it starts)."""
    tag = uuid.uuid4().hex
    proc = subprocess.run([PY, "-m", "distperf", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "TEST_RUN_TAG": tag, **(env or {})})
    return proc, tag


@pytest.mark.parametrize("argv, field", [
    (["--tp", "3"], "tp"),
    (["--pp", "2", "--schedule", "pipedream"], "schedule"),
    (["--pp", "2", "--schedule", "1f1b", "--microbatches", "1"], "microbatches"),
    (["--pp", "2", "--schedule", "2bw", "--microbatches", "2", "--zero", "1"], "zero"),
    (["--dp", "2", "--zero", "5"], "zero"),
    (["--steps", "0"], "steps"),
    (["--dp", "2", "--bucket-mb", "0"], "bucket_mb"),
    (["--data", "text", "--vocab", "64"], "data"),
    (["--partition", "3,x"], "partition"),
])
def test_bad_layout_is_refused_before_any_process_starts(argv, field, monkeypatch, capsys):
    def no_launch(*a, **k):
        raise AssertionError("a process was started")

    monkeypatch.setattr(run_command, "launch", no_launch)
    monkeypatch.setattr(subprocess, "Popen", no_launch)
    assert cli.main(["run", "--model", "tiny", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"distperf run: error: {field}:") and "\n" not in err


def test_two_rank_run_reports_json_equal_to_the_single_device_run():
    two, _ = distperf("run", *TINY, "--dp", "2", "--json")
    assert two.returncode == 0, two.stderr
    one, _ = distperf("run", *TINY, "--micro-batch", "2", "--json")
    assert one.returncode == 0, one.stderr
    r2, r1 = json.loads(two.stdout), json.loads(one.stdout)
    assert r2["config"]["layout"]["dp"] == 2 and r2["backend"] == "gloo" and r2["world_size"] == 2
    assert len(r2["losses"]) == 3
    for a, b in zip(r2["losses"], r1["losses"]):
        assert relative_error(a, b) <= TOLERANCE
    it = r2["iteration_time_s"]
    assert 0 < it["p10"] <= it["median"] <= it["p90"]
    assert r2["tokens_per_s"] == pytest.approx(2 * 16 / it["median"])
    assert len(r2["model_state_bytes_at_rest"]) == 2 and r2["model_state_bytes_at_rest"][0]["parameters"] > 0


def test_time_balanced_pipeline_run():
    proc, _ = distperf("run", *TINY, "--layers", "4", "--pp", "2", "--schedule", "gpipe", "--partition", "time",
                       "--data", "text", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    parts = result["config"]["layout"]["partition"]
    assert len(parts) == 2 and sum(parts) == 4
    assert result["data"]["source"] == "text" and len(result["losses"]) == 3


@pytest.mark.parametrize("fault, expect", [
    ("raise:1:1", "rank 1: RuntimeError: injected fault at step 1"),
    ("exit:0:1", "rank 0 exited with status 3"),
    ("hang:1:1", "did not finish within --timeout 12 s"),
])
def test_a_failing_rank_ends_the_run_with_an_error_and_no_process_left(fault, expect):
    proc, tag = distperf("run", *TINY, "--dp", "2", "--timeout", "12", env={"DISTPERF_FAULT": fault}, timeout=90)
    assert proc.returncode == 1
    assert expect in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("distperf run: error:")
    assert _tagged(tag) == []


def test_entry_point_starts_directly_under_torchrun(tmp_path):
    out = tmp_path / "result.json"
    proc = subprocess.run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "distperf.train", *TINY, "--layers", "4", "--pp", "2", "--schedule", "1f1b",
                           "--partition", "params", "--out", str(out)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["world_size"] == 2 and result["config"]["layout"]["schedule"] == "1f1b"
    assert sum(result["config"]["layout"]["partition"]) == 4 and len(result["losses"]) == 3


def test_entry_point_starts_directly_under_accelerate_launch(tmp_path):
    pytest.importorskip("accelerate")
    out = tmp_path / "result.json"
    proc = subprocess.run([PY, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                           "-m", "distperf.train", *TINY, "--dp", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["world_size"] == 2 and result["backend"] in ("gloo", "nccl") and len(result["losses"]) == 3


def test_entry_point_without_a_launcher_says_how_to_start_it():
    proc = subprocess.run([PY, "-m", "distperf.train", *TINY, "--dp", "2"], capture_output=True, text=True,
                          timeout=60, env={k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")})
    assert proc.returncode == 2 and "torchrun" in proc.stderr and "Traceback" not in proc.stderr
