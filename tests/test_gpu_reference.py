"""scripts/gpu_reference.py, the one script a session with a lent GPU runs: its plan names existing notebooks
with the GPU scale, it refuses a missing GPU with one line and status 2, and its publishing step keeps only the
measuring machine's rows, with their provenance, and the machine's hardware profile. `make book DEVICE=cuda`
selects scale gpu."""
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from distperf.config import ConfigError
from distperf.results import PROVENANCE_COLUMNS

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_reference.py"
spec = importlib.util.spec_from_file_location("gpu_reference", SCRIPT)
gpu_reference = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_reference)


def test_plan_runs_existing_notebooks_and_the_step_sweep_at_the_gpu_scale_within_ten_minutes():
    cmds = gpu_reference.plan("gpu", "cuda")
    notebooks, own = cmds[:3], cmds[3:]
    assert [Path(c[-2]).stem for c in notebooks] == list(gpu_reference.NOTEBOOK_STEPS)
    assert [name for name, _, _ in gpu_reference.STEPS] == [*gpu_reference.NOTEBOOK_STEPS, "gpu_step_time",
                                                            "gpu_step_profile"]
    assert all((ROOT / c[-2]).is_file() for c in notebooks)
    assert all(c[c.index("scale") + 1] == "gpu" and c[c.index("device") + 1] == "cuda" for c in notebooks)
    assert [c[2] for c in own] == ["--step-time", "--step-profile"]
    assert all(c[c.index("--scale") + 1] == "gpu" and c[c.index("--device") + 1] == "cuda" for c in own)
    assert sum(limit for _, limit, _ in gpu_reference.STEPS) <= 600


@pytest.mark.parametrize("scale", ["smoke", "gpu"])
def test_step_time_sweep_is_a_valid_experiment_of_one_device(scale):
    from distperf.runner.grid import Experiment, expand

    exp = Experiment.from_dict({"scale": scale, **gpu_reference.step_time_experiment(scale, "cpu")},
                               workdir=ROOT)
    configs = expand(exp)
    assert len(configs) == len(gpu_reference.STEP_TIME[scale]["model"]) * 2 * 2 * 2
    assert all(c.params.get("dp", 1) == 1 and c.params["hardware"] == "H200" for c in configs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible here")
def test_no_gpu_is_one_line_and_status_2():
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "cuda" in done.stderr, done.stderr


def rows(machine, n):
    prov = {c: f"{c}-value" for c in PROVENANCE_COLUMNS}
    return [dict(prov, machine=machine, hidden=64 * (i + 1), time_s=0.1 * (i + 1), scale="gpu") for i in range(n)]


def test_publish_keeps_this_machines_rows_and_profile(tmp_path):
    fresh, ref = tmp_path / "fresh", tmp_path / "reference"
    fresh.mkdir()
    old = fresh / "old_experiment.csv"
    pd.DataFrame(rows("nvidia-h200", 1)).to_csv(old, index=False)
    since = time.time() + 1
    import os
    os.utime(old, (since - 100, since - 100))  # written before the run: not published
    pd.DataFrame(rows("nvidia-h200", 3) + rows("cpu-2c", 2)).to_csv(fresh / "layer_timing.csv", index=False)
    (fresh / "hardware.json").write_text(json.dumps({"name": "calibrated-nvidia-h200"}))
    for p in (fresh / "layer_timing.csv", fresh / "hardware.json"):
        os.utime(p, (since + 1, since + 1))
    written = gpu_reference.publish(fresh, ref, "nvidia-h200", since)
    assert [p.name for p in written] == ["MANIFEST.json", "hardware.json", "layer_timing.csv.gz"]
    table = pd.read_csv(ref / "nvidia-h200" / "layer_timing.csv.gz")
    assert len(table) == 3 and set(table.machine) == {"nvidia-h200"}
    assert set(PROVENANCE_COLUMNS) <= set(table.columns)
    assert not list((ref / "nvidia-h200").glob("old_experiment*"))
    from distperf import reference

    manifest = reference.read_manifest(ref / "nvidia-h200")  # the canonical archive's form, checked the same way
    assert manifest["machine"] == "nvidia-h200" and manifest["scale"] == "gpu"
    assert list(manifest["tables"]) == ["layer_timing.csv.gz"] and reference.check(ref / "nvidia-h200") == []
    assert gpu_reference.publish(fresh, ref, "nvidia-a100", since) == []  # no row of that machine: nothing


def test_publish_refuses_a_table_without_provenance(tmp_path):
    (tmp_path / "bare.csv").write_text("hidden,time_s\n64,0.1\n")
    with pytest.raises(ConfigError, match="bare.csv.*provenance"):
        gpu_reference.publish(tmp_path, tmp_path / "ref", "nvidia-h200", 0)


def test_make_book_with_cuda_selects_scale_gpu():
    dry = subprocess.run(["make", "-n", "-B", "data", "DEVICE=cuda"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert "-p scale gpu -p device cuda" in dry.stdout, dry.stdout[-2000:] + dry.stderr[-2000:]
