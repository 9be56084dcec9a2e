"""The PipeDream-2BW planner: its search space, its ranking under the memory limit, its topology
awareness, its rejections, and the command line."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from distperf import presets
from distperf.config import ConfigError, Config, Training
from distperf.cost import predict
from distperf.hardware import GIB, PRESETS
from distperf.planner import best, candidates, plan, topology

V100 = PRESETS["V100-16GB"]
NODE_25GBIT = 25e9 / 8
KEYS = {"schedule", "w", "d", "micro_batch", "recompute", "accumulation", "throughput", "memory_bytes", "iteration_s"}


def _paper_plan(name="2bw-gpt-2.2b", gpus=64, batch=512, **kw):
    return plan(presets.model(name), gpus, V100, batch, gpus_per_node=8, node_bandwidth=NODE_25GBIT, **kw)


def test_every_candidate_is_planned_or_rejected_and_plans_are_ranked():
    model = presets.model("2bw-gpt-2.2b")
    result = _paper_plan()
    plans, rejected = result["plans"], result["rejected"]
    assert len(plans) + len(rejected) == len(candidates(model, 64))
    assert plans and rejected
    assert [p["throughput"] for p in plans] == sorted((p["throughput"] for p in plans), reverse=True)
    for p in plans:
        assert KEYS <= set(p)
        assert p["w"] * p["d"] * p["tp"] == 64
        assert p["memory_bytes"] <= V100.memory_capacity
        assert p["micro_batch"] * p["w"] * p["accumulation"] == 512
        assert p["throughput"] == pytest.approx(512 / p["iteration_s"])
        if p["schedule"] in ("2bw", "1f1b"):
            assert p["accumulation"] >= p["d"]
    for r in rejected:
        assert r["reason"].startswith(("out of memory", "invalid"))
        if r["reason"].startswith("out of memory"):
            assert r["memory_bytes"] > V100.memory_capacity


def test_plan_values_are_the_cost_models_on_the_candidates_topology():
    result = _paper_plan()
    top = result["plans"][0]
    from distperf.config import Layout

    layout = Layout(dp=top["w"], tp=top["tp"], pp=top["d"], schedule=top["schedule"], micro_batch=top["micro_batch"],
                    microbatches=top["accumulation"], recompute=top["recompute"])
    cfg = Config(model=presets.model("2bw-gpt-2.2b"), layout=layout, training=Training(precision="mixed"))
    r = predict(cfg, topology(V100, 8, NODE_25GBIT, top["tp"], top["w"]))
    assert r["time_s"]["iteration"] == pytest.approx(top["iteration_s"])
    assert r["memory_bytes"]["total"] == pytest.approx(top["memory_bytes"])


def test_a_lower_memory_limit_rejects_the_first_choice_and_picks_one_that_fits():
    first = _paper_plan()["plans"][0]
    limit = first["memory_bytes"] - 1
    tighter = _paper_plan(memory_limit=limit)
    assert all(p["memory_bytes"] <= limit for p in tighter["plans"])
    same = [r for r in tighter["rejected"] if all(r[k] == first[k] for k in ("schedule", "w", "d", "micro_batch", "recompute"))]
    assert len(same) == 1 and same[0]["reason"].startswith("out of memory")
    assert tighter["plans"][0]["throughput"] <= first["throughput"]


def test_recomputation_is_what_fits_when_memory_is_short():
    """With little memory, only configurations with recomputation remain (App. A.1.2: it keeps only the
    layer inputs)."""
    loose = _paper_plan("2bw-gpt-3.8b")
    limit = min(p["memory_bytes"] for p in loose["plans"] if p["recompute"] == "none") - 1
    tight = _paper_plan("2bw-gpt-3.8b", memory_limit=limit)
    assert tight["plans"] and all(p["recompute"] == "full" for p in tight["plans"])


def test_gpipe_needs_more_memory_than_2bw_and_flush_at_the_same_batch():
    """GPipe stashes all m microbatches, 2BW and Flush at most d (arXiv 2006.09503, §3 and Fig. 7)."""
    result = _paper_plan(gpus=8, batch=64)
    everything = result["plans"] + result["rejected"]

    def memory(schedule):
        return next(e["memory_bytes"] for e in everything if e["schedule"] == schedule and e["d"] == 8
                    and e["micro_batch"] == 1 and e["recompute"] == "none")

    assert memory("gpipe") > memory("2bw") > memory("1f1b")


def test_replicas_inside_a_node_are_shielded_from_a_slow_network():
    """Topology: with k devices per node, width w ≤ k keeps the all-reduce of a stage's replicas on the
    node's links; the data-parallel baseline (w = N > k) all-reduces across nodes. Slowing the node
    interface 10× must therefore slow data parallelism far more than a pipeline with w ≤ k, which
    crosses nodes only with its activations (untied head: a tied one all-reduces the embedding's
    gradient between the first and the last stage, across nodes too). In the paper's convention: 16-bit
    activations between stages (under autocast the trainers send the fp32 residual stream, twice the bytes)."""
    model = replace(presets.model("2bw-gpt-355m"), tied=False)
    fast = plan(model, 16, V100, 256, gpus_per_node=8, node_bandwidth=NODE_25GBIT, convention="paper")
    slow = plan(model, 16, V100, 256, gpus_per_node=8, node_bandwidth=NODE_25GBIT / 10, convention="paper")

    def throughput(result, **match):
        return max(e["throughput"] for e in result["plans"] if all(e[k] == v for k, v in match.items()))

    dp_slowdown = throughput(fast, strategy="data-parallel") / throughput(slow, strategy="data-parallel")
    pipe_slowdown = throughput(fast, schedule="2bw", w=8, d=2) / throughput(slow, schedule="2bw", w=8, d=2)
    assert dp_slowdown > 5
    assert dp_slowdown > 2 * pipe_slowdown


def test_topology_shares_the_node_interface_among_the_devices_that_cross_nodes():
    assert topology(V100, 8, 8.0, tp=1, w=2).inter_bandwidth == pytest.approx(4.0)
    assert topology(V100, 8, 8.0, tp=1, w=16).inter_bandwidth == pytest.approx(1.0)
    assert topology(V100, 8, 8.0, tp=4, w=4).inter_bandwidth == pytest.approx(1.0)
    assert topology(V100, 4, None, tp=1, w=1).devices_per_node == 4
    assert topology(V100, None, None, tp=1, w=1) is V100


def test_profiled_layer_times_replace_flops_and_missing_sizes_are_rejected():
    model = presets.model("small")
    cpu = replace(V100, name="cpu-like")
    times = {2: {"layer": (1e-3, 2e-3), "embedding": (1e-4, 1e-4), "head": (5e-4, 1e-3)}}
    result = plan(model, 2, cpu, 16, precision="fp32", max_micro_batch=4, layer_times=times)
    assert {p["micro_batch"] for p in result["plans"]} == {2}
    assert any("no profiled layer times" in r["reason"] for r in result["rejected"])
    slower = plan(model, 2, cpu, 16, precision="fp32", max_micro_batch=4,
                  layer_times={2: {part: (10 * f, 10 * b) for part, (f, b) in times[2].items()}})
    assert slower["plans"][-1]["iteration_s"] > result["plans"][-1]["iteration_s"]


def test_nothing_fits_gives_no_plan():
    assert best(presets.model("gpt3-175b"), 8, V100, 64) is None


@pytest.mark.parametrize("kwargs, field", [
    (dict(gpus=0), "gpus"),
    (dict(global_batch=0), "global_batch"),
    (dict(gpus=12, gpus_per_node=8), "gpus_per_node"),
    (dict(memory_limit=-1.0), "memory_limit"),
    (dict(node_bandwidth=0.0), "node_bandwidth"),
    (dict(max_micro_batch=0), "max_micro_batch"),
])
def test_bad_input_names_the_field(kwargs, field):
    args = dict(model=presets.model("small"), gpus=8, hw=V100, global_batch=64) | kwargs
    with pytest.raises(ConfigError) as e:
        plan(**args)
    assert e.value.field == field


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "distperf", "plan", *args], capture_output=True, text=True, timeout=60)


def test_command_line_json_and_table():
    args = ["--model", "2bw-gpt-2.2b", "--gpus", "8", "--hardware", "V100-16GB", "--global-batch", "64",
            "--node-gbit", "25"]
    out = _cli(*args, "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert KEYS <= set(data["plans"][0]) and data["rejected"] and "reason" in data["rejected"][0]
    assert data["inputs"]["memory_limit_bytes"] == 16 * GIB
    table = _cli(*args, "--memory-limit", "12GiB", "--top", "3")
    assert table.returncode == 0, table.stderr
    assert "out of memory" in table.stdout and "rank" in table.stdout and "12.00 GiB" in table.stdout


@pytest.mark.parametrize("extra, field", [
    (["--memory-limit", "12 parsecs"], "memory_limit"),
    (["--schedules", "2bw,bogus"], "schedules"),
    (["--node-gbit", "-3"], "node_gbit"),
    (["--hardware", "no-such-gpu"], "hardware"),
    # the inputs that once hung, or were taken when they should not have been
    (["--gpus", str(10**12)], "gpus"),  # the divisors were found by counting up to N
    (["--memory-limit", "1e400"], "memory_limit"),  # the JSON then held Infinity
    (["--node-gbit", "inf"], "node_gbit"),
    (["--node-gbit", "nan"], "node_gbit"),
    (["--top", "-1"], "top"),  # silently dropped a plan
    (["--top", "0"], "top"),
    (["--max-micro-batch", "0"], "max_micro_batch"),
    (["--global-batch", str(2**31)], "global_batch"),
    (["--hidden", "100", "--heads", "3"], "heads"),  # a model of one's own, checked like predict's
    (["--layers", str(2**25)], "layers"),
])
def test_command_line_bad_input_is_one_line_and_status_2(extra, field):
    out = _cli("--model", "small", "--gpus", "2", "--global-batch", "8", *extra)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and f"error: {field}:" in out.stderr


def test_plan_takes_the_model_flags_and_presets_in_any_case():
    out = _cli("--model", "SMALL", "--layers", "8", "--hidden", "256", "--heads", "8", "--gpus", "8",
               "--global-batch", "16", "--hardware", "v100-16gb", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
    assert data["inputs"]["hardware"] == "V100-16GB"
    depths = {p["d"] for p in data["plans"] if p["strategy"] == "pipeline"}
    assert 8 in depths  # eight layers: a depth the 4-layer preset could not have
