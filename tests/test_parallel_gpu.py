"""The same trainers on CUDA: NCCL between GPUs, the CUDA device per LOCAL_RANK. Skipped without CUDA
(the multi-GPU cases without enough GPUs). Runs the CLI in fresh processes, so CUDA is never
initialised in the test process itself."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest
import torch

from dist_harness import relative_error

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
GPU_TOLERANCE = 1e-4  # different kernels (cuBLAS, fused attention) sum in other orders than the CPU
COMMON = ["--model", "tiny", "--layers", "4", "--steps", "3", "--optimizer", "sgd", "--lr", "0.2", "--json"]


def run(*args):
    """``distperf run`` with its final parameters (``--parameters-out``, gathered from every rank)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "parameters.pt")
        proc = subprocess.run([sys.executable, "-m", "distperf", "run", *COMMON, *args, "--parameters-out", path],
                              capture_output=True, text=True, timeout=300, env={**os.environ})
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = json.loads(proc.stdout)
        result["parameters"] = torch.load(path)
    return result


def _gpus(n):
    return pytest.mark.skipif(torch.cuda.device_count() < n, reason=f"needs {n} GPUs")


def assert_same_losses(result, reference):
    """Losses of every step and every parameter tensor (after the last step) equal within GPU_TOLERANCE."""
    assert len(result["losses"]) == len(reference["losses"]) == 3
    for a, b in zip(result["losses"], reference["losses"]):
        assert relative_error(a, b) <= GPU_TOLERANCE, (result["losses"], reference["losses"])
    assert set(result["parameters"]) == set(reference["parameters"])
    for name, value in result["parameters"].items():
        assert relative_error(value.numpy(), reference["parameters"][name].numpy()) <= GPU_TOLERANCE, name


def test_single_gpu_equals_cpu():
    gpu = run("--device", "cuda", "--micro-batch", "4")
    assert gpu["options"]["device"] == "cuda"
    assert_same_losses(gpu, run("--device", "cpu", "--micro-batch", "4"))


@_gpus(2)
@pytest.mark.parametrize("layout", [
    ["--dp", "2", "--micro-batch", "2"],
    ["--dp", "2", "--micro-batch", "2", "--zero", "3"],
    ["--tp", "2", "--micro-batch", "4", "--sequence-parallel"],
    ["--pp", "2", "--schedule", "1f1b", "--microbatches", "4"],
    ["--pp", "2", "--schedule", "interleaved", "--microbatches", "4"],
])
def test_two_gpus_over_nccl_equal_one_gpu(layout):
    result = run("--device", "cuda", *layout)
    assert result["backend"] == "nccl"
    assert_same_losses(result, run("--device", "cuda", "--micro-batch", "4"))


@_gpus(8)
def test_three_dimensional_hybrid_on_eight_gpus():
    result = run("--device", "cuda", "--dp", "2", "--tp", "2", "--pp", "2", "--schedule", "1f1b",
                 "--microbatches", "2")
    assert_same_losses(result, run("--device", "cuda", "--micro-batch", "4"))
