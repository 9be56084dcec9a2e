"""``python -m distperf predict``: output keys and units, hardware profiles, and bad input (exit 2, one line)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from distperf import cli
from distperf.hardware import PRESETS, Hardware, load_profile, save_profile

KEYS = {
    "parameters": None,
    "flops": {"model", "hardware"},
    "memory_bytes": {"parameters", "gradients", "optimizer_states", "activations", "recompute_working", "total"},
    "memory_bytes_per_stage": None,
    "communication_bytes": {"data_parallel", "tensor_parallel", "pipeline_parallel"},
    "communication_wire_bytes": {"data_parallel", "tensor_parallel", "pipeline_parallel"},
    "convention": None,
    "backend": None,
    "time_s": {"compute", "communication_exposed", "bubble", "iteration"},
    "bubble_fraction": None,
}


def run(capsys, *argv):
    code = cli.main(["predict", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_has_the_documented_keys(capsys):
    code, out, _ = run(capsys, "--model", "gpt2", "--dp", "2", "--tp", "2", "--pp", "2", "--microbatches", "4", "--json")
    assert code == 0
    result = json.loads(out)
    for key, inner in KEYS.items():
        assert key in result
        if inner:
            assert set(result[key]) == inner
    assert len(result["memory_bytes_per_stage"]) == 2
    assert result["parameters"] == 124_439_808


def test_table_is_readable_with_units(capsys):
    code, out, _ = run(capsys, "--model", "gpt3-175b", "--tp", "8", "--pp", "8", "--dp", "4", "--sequence-parallel",
                       "--recompute", "selective", "--precision", "mixed", "--global-batch", "512",
                       "--hardware", "H100-80GB")
    assert code == 0
    for text in ("GiB", "parameters", "optimizer states", "activations", "bubble fraction", " s", "H100-80GB"):
        assert text in out


def test_model_overrides_and_global_batch(capsys):
    code, out, _ = run(capsys, "--model", "gpt2", "--layers", "4", "--hidden", "256", "--heads", "4", "--vocab", "1000",
                       "--seq", "128", "--dp", "2", "--micro-batch", "2", "--global-batch", "16", "--json")
    result = json.loads(out)
    assert code == 0
    assert result["parameters"] == 4 * (12 * 256**2 + 13 * 256) + (1000 + 128) * 256 + 2 * 256
    assert result["flops"]["model"] == 3 * 16 * (4 * (24 * 128 * 256**2 + 4 * 128**2 * 256) + 2 * 128 * 256 * 1000)


def test_hardware_profile_file(capsys, tmp_path):
    path = tmp_path / "this-machine.json"
    save_profile(Hardware("cpu", 1e11, 1e11, 2e10, 24 * 2**30, 5e9, 2e-5, 1e9, 1e-4, 2, 0.5), path)
    assert load_profile(path).flops_efficiency == 0.5
    code, out, _ = run(capsys, "--hardware", str(path), "--json")
    assert code == 0 and json.loads(out)["hardware"] == "cpu"


def test_every_preset_predicts(capsys):
    for name in PRESETS:
        assert run(capsys, "--hardware", name, "--json")[0] == 0


BAD = [
    (["--model", "gpt-5"], "model"),
    (["--tp", "3"], "tp"),  # small: 4 heads
    (["--hidden", "130", "--tp", "4"], "heads"),  # 130 not divisible by 4 heads
    (["--model", "tiny", "--pp", "3"], "pp"),  # 2 layers
    (["--pp", "2", "--schedule", "none"], "schedule"),
    (["--pp", "4", "--schedule", "2bw", "--microbatches", "2"], "microbatches"),
    (["--dp", "3", "--global-batch", "16"], "global_batch"),
    (["--micro-batch", "0"], "micro_batch"),
    (["--layers", "-1"], "layers"),
    (["--dp", "0"], "dp"),
    (["--zero", "4"], "zero"),
    (["--pp", "2", "--partition", "3,3"], "partition"),
    (["--hardware", "TPU-v9"], "hardware"),
    (["--bucket-mb", "-1"], "bucket_mb"),
    # the inputs that once ended in a traceback or were taken when they should not have been
    (["--layers", "1" + "0" * 400], "layers"),  # OverflowError in the float division
    (["--dp", str(10**12), "--zero", "1"], "dp"),  # MemoryError: ZeRO-1's partition of dp items
    (["--dp", "2", "--bucket-mb", "1e-320"], "bucket_mb"),  # OverflowError in the bucketed exposed time
    (["--dp", "2", "--bucket-mb", "inf"], "bucket_mb"),
    (["--dp", "2", "--bucket-mb", "nan"], "bucket_mb"),
    (["--pp", "4", "--microbatches", "2"], "microbatches"),  # 1F1B, as run and plan refuse it
    (["--pp", str(2**14 + 1), "--layers", str(2**15)], "pp"),
    (["--pp", "2", "--schedule", "interleaved", "--chunks", str(2**14), "--layers", str(2**16)], "chunks"),
    (["--dp", str(2**10), "--tp", str(2**10), "--pp", "2", "--heads", str(2**10), "--hidden", str(2**10)], "dp"),
    (["--micro-batch", str(2**30 + 1)], "micro_batch"),
]


def test_the_bounds_accept_their_largest_value(capsys):
    code, out, err = run(capsys, "--model", "tiny", "--layers", str(2**14), "--pp", str(2**14), "--microbatches",
                         str(2**14), "--json")
    assert code == 0, err
    assert json.loads(out)["time_s"]["iteration"] > 0


def test_presets_match_in_any_case_and_json_is_strict(capsys, tmp_path):
    code, out, err = run(capsys, "--model", "GPT2", "--hardware", "v100-16gb", "--json")
    assert code == 0, err
    data = json.loads(out, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
    assert data["hardware"] == "V100-16GB"
    # pipedream has no trainer, but predict still prices it (the theory chapters use it)
    assert run(capsys, "--pp", "2", "--schedule", "pipedream", "--microbatches", "4")[0] == 0


def test_a_profile_whose_name_is_not_a_string_is_refused(capsys, tmp_path):
    path = tmp_path / "hw.json"
    save_profile(PRESETS["V100-16GB"], path)
    path.write_text(path.read_text().replace('"name": "V100-16GB"', '"name": {"an": "object"}'))
    code, _, err = run(capsys, "--hardware", str(path))
    assert code == 2 and err.count("\n") == 1 and "name must be a non-empty string" in err


@pytest.mark.parametrize("argv, field", BAD)
def test_bad_input_is_one_line_naming_the_field(capsys, argv, field):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"distperf predict: error: {field}: ")


@pytest.mark.parametrize("content, rule", [
    ("not json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    ('{"flops_fp32": 1e12}', "missing field"),
    ('{"flops_fp32": -1, "flops_16bit": 1, "memory_bandwidth": 1, "memory_capacity": 1, "intra_bandwidth": 1,'
     ' "intra_latency": 1, "inter_bandwidth": 1, "inter_latency": 1, "devices_per_node": 1}', "positive number"),
    ('{"flops_fp32": 1, "flops_16bit": 1, "memory_bandwidth": 1, "memory_capacity": 1, "intra_bandwidth": 1,'
     ' "intra_latency": 1, "inter_bandwidth": 1, "inter_latency": 1, "devices_per_node": 1, "colour": 2}', "unknown field"),
    ('{"flops_fp32": 1, "flops_16bit": 1, "memory_bandwidth": 1, "memory_capacity": 1, "intra_bandwidth": 1,'
     ' "intra_latency": 1, "inter_bandwidth": 1, "inter_latency": 1, "devices_per_node": 1, "memory_passes": -2}',
     "memory_passes must be a positive number"),
])
def test_malformed_hardware_file(capsys, tmp_path, content, rule):
    path = tmp_path / "bad.json"
    path.write_text(content)
    code, _, err = run(capsys, "--hardware", str(path))
    assert code == 2 and err.count("\n") == 1 and "error: hardware: " in err and rule in err


def test_command_line_exit_status_and_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "distperf", "predict", "--model", "small", "--tp", "3"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == ["distperf predict: error: tp: heads (4) must be divisible by tp (3)"]


def test_attention_flag_chooses_the_activation_count(capsys):
    """--attention math keeps the s×s scores the fused sdpa does not: L·a·s²·b fp32 values more."""
    acts = {}
    for attention in ("sdpa", "math"):
        code, out, _ = run(capsys, "--model", "small", "--attention", attention, "--json")
        assert code == 0
        acts[attention] = json.loads(out)["memory_bytes"]["activations"]
    assert acts["math"] - acts["sdpa"] == 4 * 4 * 128 * 128 * 4 - 4 * 4 * 128 * 4  # scores in, log-sum-exp out
