"""``python -m distperf run`` and the per-rank entry point ``python -m distperf.train``.

Launches go through torch's launcher as a user's would (a few seconds each): the JSON result, equality
with the single-device run, refusal of bad layouts before any process starts, and failing, exiting
and hanging ranks ending the run inside its timeout with no process left behind.
"""
from __future__ import annotations

import json
import math
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
    return tagged_processes("TEST_RUN_TAG", tag, strict=True)


def distperf(*args, env=None, timeout=240):
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


def test_the_process_that_launches_the_ranks_imports_no_torch():
    """Only the ranks and torch's launcher import torch (seconds of every launch); ``run`` itself needs none."""
    code = ("import json, sys\n"
            "from distperf import cli\n"
            "from distperf.commands import run\n"
            "run.launch = lambda *a, **k: {'options': {'device': 'cpu'}}\n"
            "status = cli.main(['run', '--model', 'tiny', '--dp', '2', '--pp', '2', '--microbatches', '2', "
            "'--hardware', 'none', '--json'])\n"
            "print(json.dumps({'status': status, 'torch': 'torch' in sys.modules}))\n")
    proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == {"status": 0, "torch": False}


def test_two_rank_runs_report_json_and_parameters_equal_to_the_single_device_run(tmp_path):
    import torch

    from distperf import presets
    from distperf.model import build_model

    def run(name, *layout):
        path = tmp_path / f"{name}.pt"
        # SGD: Adam's division by √v magnifies round-off in near-zero gradients
        proc, _ = distperf("run", *TINY, *layout, "--optimizer", "sgd", "--lr", "0.2", "--hardware", "none",
                           "--no-measure", "--json",
                           "--parameters-out", str(path))
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout), torch.load(path)

    (r2, p2), (pp, ppp), (r1, p1) = (run("dp", "--dp", "2"), run("pp", "--pp", "2", "--microbatches", "2"),
                                     run("one", "--micro-batch", "2"))
    assert r2["config"]["layout"]["dp"] == 2 and r2["backend"] == "gloo" and r2["world_size"] == 2
    # without measuring, a run still times its ranks' parts (each repeat of a sweep profiles itself)
    assert "memory_bytes" not in r2 and r2["part_times"]["ranks_at_once"] == 2
    initial = {n: p.detach() for n, p in build_model(presets.model("tiny"), 0).named_parameters()}
    assert set(p1) == set(initial)
    assert relative_error(torch.cat([p1[n].ravel() for n in p1]), torch.cat([initial[n].ravel() for n in p1])) > (
        100 * TOLERANCE)  # the weights moved: equal parameters mean something
    for result, parameters in ((r2, p2), (pp, ppp)):
        assert len(result["losses"]) == len(r1["losses"]) == 3
        for a, b in zip(result["losses"], r1["losses"]):
            assert relative_error(a, b) <= TOLERANCE
        held = set()
        for name, value in parameters.items():  # the pipeline's last stage holds the tied head's own copy
            name = "tok.weight" if name == "head.weight" and name not in p1 else name
            assert relative_error(value, p1[name]) <= TOLERANCE, name
            held.add(name)
        assert held == set(p1)
    assert "head.weight" in ppp and set(p2) == set(p1)  # each stage's tensors, gathered from both ranks
    it = r2["iteration_time_s"]
    assert 0 < it["p10"] <= it["median"] <= it["p90"]
    assert r2["tokens_per_s"] == pytest.approx(2 * 16 / it["median"])
    assert len(r2["model_state_bytes_at_rest"]) == 2 and r2["model_state_bytes_at_rest"][0]["parameters"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dp.pt", "one.pt", "pp.pt"]  # no temporary file left
    ddp = {"allreduce_s", "allreduce_bytes", "allreduce_ranks"}  # DDP's ranks also time their all-reduce
    shared = {"contention_memory", "contention_compute"}  # the layer's probe is the calibration's alone
    for result, contended in ((r1, set()), (r2, shared | ddp), (pp, shared)):
        probe = result["speed_probe"]  # the machine's speed around the timed steps (distperf.measure.speed)
        assert set(probe) == {"gemm_s", "elementwise_s", "python_s", "before", "after"} | contended
        assert probe["gemm_s"] == pytest.approx((probe["before"]["gemm_s"] * probe["after"]["gemm_s"]) ** 0.5)
        for k in contended - ddp:  # two ranks also read their contention: at least 1, the lesser of before and after
            assert probe[k] >= 1 and probe[k] == min(probe["before"][k], probe["after"][k])
        if contended:  # and keep each rank's reading, of which the probe takes the geometric mean
            ranks = probe["before"]["ranks"]
            assert set(ranks) == {"gemm_s", "elementwise_s", "python_s"} and all(len(v) == 2 for v in ranks.values())
            assert probe["before"]["gemm_s"] == pytest.approx(math.prod(ranks["gemm_s"]) ** 0.5)
    probe = r2["speed_probe"]
    assert probe["allreduce_bytes"] == 4 * sum(p.numel() for p in p1.values()) and probe["allreduce_ranks"] == 2
    before, after = probe["before"]["allreduce_s"], probe["after"]["allreduce_s"]
    assert probe["allreduce_s"] == pytest.approx((before * after) ** 0.5) and probe["allreduce_s"] > 0


def test_time_balanced_pipeline_run():
    proc, _ = distperf("run", *TINY, "--layers", "4", "--pp", "2", "--schedule", "gpipe", "--partition", "time",
                       "--data", "text", "--hardware", "none", "--no-measure", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    parts = result["config"]["layout"]["partition"]
    assert len(parts) == 2 and sum(parts) == 4
    assert result["data"]["source"] == "text" and len(result["losses"]) == 3


# A rank that raises or exits ends the run long before its --timeout, which only leaves room for a busy machine
# (tests run two at a time); the hanging rank is ended by it.
@pytest.mark.parametrize("fault, seconds, expect", [
    ("raise:1:1", 60, "rank 1: RuntimeError: injected fault at step 1"),
    ("exit:0:1", 60, "rank 0 exited with status 3"),
    ("hang:1:1", 12, "did not finish within --timeout 12 s"),
])
def test_a_failing_rank_ends_the_run_with_an_error_and_no_process_left(fault, seconds, expect):
    proc, tag = distperf("run", *TINY, "--dp", "2", "--timeout", str(seconds), env={"DISTPERF_FAULT": fault},
                         timeout=seconds + 60)
    assert proc.returncode == 1
    assert expect in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("distperf run: error:")
    assert _tagged(tag) == []


def test_entry_point_starts_directly_under_torchrun(tmp_path):
    out = tmp_path / "result.json"
    proc = subprocess.run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "distperf.train", *TINY, "--layers", "4", "--pp", "2", "--schedule", "1f1b",
                           "--partition", "params", "--no-measure", "--out", str(out)],
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
                           "-m", "distperf.train", *TINY, "--dp", "2", "--no-measure", "--out", str(out)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["world_size"] == 2 and result["backend"] in ("gloo", "nccl") and len(result["losses"]) == 3


def test_entry_point_without_a_launcher_says_how_to_start_it():
    proc = subprocess.run([PY, "-m", "distperf.train", *TINY, "--dp", "2"], capture_output=True, text=True,
                          timeout=60, env={k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")})
    assert proc.returncode == 2 and "torchrun" in proc.stderr and "Traceback" not in proc.stderr


TORCHRUN_SUMMARY = """
Failures:
[1]:
  time      : 2026-12-01_19:11:11
  rank      : {other} (local_rank: {other})
  exitcode  : {other_code} (pid: 2)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_19:11:11
  rank      : {first} (local_rank: {first})
  exitcode  : {first_code} (pid: 1)
"""


@pytest.mark.parametrize("first, first_code, other, other_code, expected", [
    (1, -9, 0, -15, "rank 1 was killed by signal 9 first"),  # torchrun's own SIGTERM of the survivor is not named
    (0, 1, 1, -9, "rank 0 exited with status 1 first; rank 1 was killed by signal 9"),  # the peer observed first
    (0, 1, 1, 3, "rank 0 exited with status 1 first"),
])
def test_the_root_cause_names_a_rank_killed_by_a_signal_even_when_a_peer_was_seen_first(
        tmp_path, first, first_code, other, other_code, expected):
    from distperf.launch import root_cause

    log = tmp_path / "launch0.log"
    log.write_text("some rank output\n" + TORCHRUN_SUMMARY.format(first=first, first_code=first_code, other=other,
                                                                   other_code=other_code))
    assert root_cause(str(log)) == expected
    log.write_text("no summary at all\n")
    assert root_cause(str(log)) == ""
