"""scripts/tp_residuals.py: the tensor-parallel trainer stepped on two real gloo ranks, the residual per collective."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "tp_residuals.py"


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SCRIPT.parents[1] / "lib"), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def test_it_prints_a_residual_per_collective_and_message_size(quick_profile):
    profile, proc = quick_profile
    assert proc.returncode == 0, proc.stderr
    out = _run("--hardware", str(profile), "--micro-batches", "1,4", "--reps", "1")
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if line.split() and line.split()[0].isdigit()]
    assert [r[0] for r in rows] == ["1", "4"]
    assert [float(r[4]) for r in rows] == [2.0, 8.0]  # tiny: b·16·32·4 bytes per message
    assert all(len(r) == 7 and float(r[1]) > 0 and float(r[3]) == 8 for r in rows)  # a measured step; 8 collectives


def test_bad_input_gets_one_message_and_no_ranks(tmp_path):
    missing = _run("--hardware", str(tmp_path / "none.json"))
    assert missing.returncode == 2 and missing.stderr.startswith("error:") and "Traceback" not in missing.stderr
    bad = _run("--micro-batches", "1,x")
    assert bad.returncode == 2 and "whole numbers of at least 1 separated by commas" in bad.stderr
    assert _run("--reps", "0").returncode == 2
