"""The cost model's pieces against independent references: torch's own algorithms, brute force, invariants."""
from __future__ import annotations

import ast
import json
import itertools
import math
import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B, _ComputationType

from distperf import presets
from distperf.config import Config, ConfigError, Layout, ModelSpec, Training, validate
from distperf.cost import predict
from distperf.cost.benchmark import GRID_MODELS
from distperf.cost.collectives import bucketed_exposed_time, collective_time, ddp_bucket_count, gloo_sent_bytes
from distperf.cost.model_states import fsdp_shard_elements, greedy_partition_max, zero_partition_loads
from distperf.cost.parameters import layer_tensors
from distperf.cost.schedules import in_flight
from distperf.cost.stage import Span, ddp_bucket_bytes, ddp_buckets

COST = Path(__file__).resolve().parents[1] / "lib" / "distperf" / "cost"


def test_cost_model_imports_no_torch():
    for path in COST.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] == "torch" for n in names), path.name


def test_every_cost_function_states_its_equation():
    for path in COST.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and path.name != "benchmark.py":
                assert ast.get_docstring(node), f"{path.name}:{node.name} has no docstring"


# ZeRO-1: torch's ZeroRedundancyOptimizer partition ---------------------------------------------------

def _torch_greedy(sizes: list[int], n: int) -> int:
    """ZeroRedundancyOptimizer._partition_parameters, one tensor at a time (torch 2.13 source)."""
    loads = [0] * n
    for size in sorted(sizes, reverse=True):
        rank = loads.index(min(loads))
        loads[rank] += size
    return max(loads)


def test_greedy_partition_matches_torch_algorithm_on_random_tensor_sets():
    rng = random.Random(0)
    for _ in range(300):
        tensors = tuple((rng.randint(1, 40), 1, rng.choice([1, 2, 3, 64, 100, 4096, 5000, 65536]))
                        for _ in range(rng.randint(1, 6)))
        n = rng.choice([2, 3, 4, 7, 8, 16, 64])
        sizes = [numel for count, _, numel in tensors for _ in range(count)]
        assert greedy_partition_max(tensors, n) == _torch_greedy(sizes, n)


def _torch_loads(sizes: list[int], n: int) -> list[int]:
    loads = [0] * n
    for size in sorted(sizes, reverse=True):
        loads[loads.index(min(loads))] += size
    return loads


def test_zero_partition_loads_by_rank_match_torch_algorithm():
    """Rank by rank (which rank owns what decides who broadcasts it), including ties between equal loads."""
    rng = random.Random(3)
    for _ in range(300):
        tensors = tuple((rng.randint(1, 40), 1, rng.choice([1, 2, 3, 64, 100, 4096, 5000, 65536]))
                        for _ in range(rng.randint(1, 6)))
        n = rng.choice([2, 3, 4, 7, 8, 16, 64])
        sizes = [numel for count, _, numel in tensors for _ in range(count)]
        assert list(zero_partition_loads(tensors, n)) == _torch_loads(sizes, n)


def test_gloo_ring_all_reduce_sends_most_from_the_ranks_beside_the_short_chunks():
    """gloo's ring on 2n segments, rank by rank (gloo's allreduce.cc): the most any rank sends is the closed form."""
    rng = random.Random(4)
    for _ in range(2000):
        n, element = rng.randint(2, 70), rng.choice([1, 2, 4, 8])
        total = element * rng.choice([rng.randint(1, 5000), rng.randint(1, 10**7)])
        segment = -(-(-(-total // (2 * n))) // element) * element
        lengths = [max(0, min(segment, total - j * segment)) for j in range(2 * n)]
        sent = [sum(lengths) * 2 - sum(lengths[2 * c] + lengths[2 * c + 1] for c in (r, (r - 1) % n))
                for r in range(n)]
        assert [gloo_sent_bytes("all-reduce", total, n, r, element_size=element) for r in range(n)] == sent
        assert gloo_sent_bytes("all-reduce", total, n, element_size=element) == max(sent)


def test_greedy_partition_on_a_real_layer_stack():
    h, ffn, layers = 768, 3072, 12
    tensors = tuple((layers, d0, numel) for d0, numel in layer_tensors(h, ffn, 1)) + ((1, 50257, 50257 * h),)
    sizes = [numel for count, _, numel in tensors for _ in range(count)]
    for n in (2, 4, 8):
        assert greedy_partition_max(tensors, n) == _torch_greedy(sizes, n)


# FSDP2: dim-0 chunks -----------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_fsdp_shard_is_torch_chunk_of_dim_0(n):
    h, ffn, t = 96, 384, 2
    shapes = [(3 * h // t, h), (3 * h // t,), (h, h // t), (h,), (ffn // t, h), (h, ffn // t), (h,), (7, h), (1, h)]
    tensors = tuple((1, shape[0], math.prod(shape)) for shape in shapes)
    rank0 = sum(torch.empty(shape).chunk(n, dim=0)[0].numel() if shape[0] >= n else
                math.prod(shape[1:]) for shape in shapes)  # fewer rows than ranks: rank 0 holds one row
    assert fsdp_shard_elements(tensors, n) == rank0


# Interleaved 1F1B: torch's own schedule ---------------------------------------------------------------

def _torch_interleaved_peak(p: int, m: int, v: int, rank: int) -> tuple[int, ...]:
    """Microbatches in flight per local chunk when rank's total first peaks, from torch's action list."""
    schedule = object.__new__(ScheduleInterleaved1F1B)  # only the order computation, no process group
    rounds = max(1, m // p)
    schedule.n_local_stages, schedule.pp_group_size, schedule._n_microbatches = v, p, m
    schedule.number_of_rounds, schedule.microbatches_per_round = rounds, m // rounds
    live, best = [0] * v, (0, None)
    for action in schedule._calculate_single_rank_operations(rank):
        if action is None:
            continue
        local = (action.stage_index - rank) // p
        if action.computation_type == _ComputationType.FORWARD:
            live[local] += 1
        elif action.computation_type == _ComputationType.FULL_BACKWARD:
            live[local] -= 1
        if sum(live) > best[0]:
            best = (sum(live), tuple(live))
    return best[1]


@pytest.mark.parametrize("p, v", [(2, 2), (4, 2), (4, 3), (8, 2)])
def test_interleaved_in_flight_matches_torch_schedule(p, v):
    for m in (1, 2, 3, 4, 8, 12, 16, 32):
        if m % max(1, m // p):
            continue  # torch rejects these
        for rank in range(p):
            assert in_flight("interleaved", p, m, v, rank) == _torch_interleaved_peak(p, m, v, rank), (p, v, m, rank)


# Bucketed overlap -----------------------------------------------------------------------------------

def _simulated_exposed(total, bucket, compute, kind, n, alpha, beta, first=None, backend="nccl"):
    """Buckets ready as their gradients are; each waits for the link, then takes its collective time."""
    free, ready, left = 0.0, 0.0, total
    size = min(bucket if first is None else first, left)
    while left > 0:
        ready += compute * size / total
        free = max(free, ready) + collective_time(kind, size, n, alpha, beta, backend)
        left -= size
        size = min(bucket, left)
    return max(0.0, free - compute)


def test_bucketed_overlap_matches_a_bucket_by_bucket_simulation():
    rng = random.Random(1)
    for _ in range(300):
        bucket = rng.choice([1e4, 1e6, 25 * 2**20, 1e8, 2e9])
        total = rng.uniform(1e5, min(1e9, 1000 * bucket))
        compute = rng.choice([0.0, 1e-4, 1e-2, 1.0])
        args = (total, bucket, compute, rng.choice(["all-reduce", "reduce-scatter"]), rng.choice([2, 8, 64]),
                rng.choice([0.0, 1e-5]), rng.choice([1e9, 1e11]))
        # the simulation adds ready times bucket by bucket: allow its rounding, ~1e-16 s per bucket-second
        assert bucketed_exposed_time(*args) == pytest.approx(_simulated_exposed(*args), rel=1e-9, abs=1e-12)


def test_a_small_first_bucket_and_gloos_reduce_scatter_match_the_simulation():
    """DDP's 1 MiB first bucket (when bucket_cap_mb is unset), and gloo, whose reduce-scatter is an all-reduce."""
    rng = random.Random(2)
    for _ in range(300):
        bucket = rng.choice([1e6, 25 * 2**20, 1e8])
        total = rng.uniform(1e5, 300 * bucket)
        args = (total, bucket, rng.choice([0.0, 1e-2, 1.0]), rng.choice(["all-reduce", "reduce-scatter"]),
                rng.choice([2, 8]), rng.choice([0.0, 1e-5]), rng.choice([1e9, 1e11]))
        first, backend = rng.choice([None, 2**20, 3e6]), rng.choice(["nccl", "gloo"])
        assert bucketed_exposed_time(*args, first_bucket_bytes=first, backend=backend) == pytest.approx(
            _simulated_exposed(*args, first=first, backend=backend), rel=1e-9, abs=1e-12)
    assert collective_time("reduce-scatter", 1e8, 4, 1e-5, 1e10, "gloo") == collective_time("all-reduce", 1e8, 4,
                                                                                            1e-5, 1e10)


def test_one_bucket_exposes_the_whole_all_reduce():
    t = collective_time("all-reduce", 1e8, 8, 1e-5, 1e10)
    assert bucketed_exposed_time(1e8, 1e9, 0.5, "all-reduce", 8, 1e-5, 1e10) == pytest.approx(t)



def test_ddp_bucket_count_skips_repeating_layers_exactly():
    """Packing every tensor of every layer one by one (torch's rule: a bucket closes once it holds the cap or more)
    gives the count that skips the layers' repeats."""
    rng = random.Random(3)
    for _ in range(500):
        def tensors(most):
            return tuple(rng.choice([4, 128, 4096, 10**5, 3 * 10**6]) for _ in range(rng.randint(0, most)))

        head, layer, ends = tensors(3), tensors(12) or (4,), tensors(2)
        layers, cap = rng.randint(0, 300), rng.choice([1, 100, 5000, 2**20, 25 * 2**20, 10**9])
        closed, filled = 0, 0
        for size in head + layer * layers + ends:
            filled += size
            if filled >= cap:
                closed, filled = closed + 1, 0
        assert ddp_bucket_count(head, layer, layers, ends, cap) == closed + (filled > 0)


def test_ddp_buckets_of_a_cap_below_the_largest_tensors_are_fewer_than_total_over_cap():
    spec = presets.MODELS["small"]
    count, total = ddp_buckets(spec, 1, 1, Span(spec.layers, True, True), 4, 1)  # a cap of one byte
    assert count == spec.layers * 12 + 4  # one bucket per tensor: 12 a layer, the two embeddings, ln_f's two
    assert ddp_bucket_bytes(spec, 1, 1, Span(spec.layers, True, True), 4, 1) == total / count
    assert ddp_bucket_bytes(spec, 1, 1, Span(spec.layers, True, True), 4, 2 * total) == 2 * total  # one bucket

# Predictions: invariants over a grid -------------------------------------------------------------------

def _sample_of_configurations(count: int, seed: int = 0) -> list[Config]:
    """Valid configurations drawn from every model, schedule, ZeRO stage, recomputation and precision."""
    axes = itertools.product(GRID_MODELS, (1, 4), (1, 2), (1, 4), ("1f1b", "gpipe", "interleaved", "2bw", "pipedream"),
                             (4, 16), range(4), ("none", "selective", "full"), ("mixed", "fp32"))
    configs = []
    for name, dp, tp, pp, schedule, m, zero, rc, precision in random.Random(seed).sample(list(axes), count):
        layout = Layout(dp=dp, tp=tp, pp=pp, sequence_parallel=tp > 1 and rc != "full", schedule=schedule if pp > 1 else "none",
                        chunks=2 if schedule == "interleaved" and pp > 1 else 1, micro_batch=2, microbatches=m,
                        zero=zero, recompute=rc)
        cfg = Config(model=presets.model(name), layout=layout, training=Training(precision=precision))
        try:
            configs.append(validate(cfg))
        except ConfigError:
            pass
    return configs


def test_predictions_are_consistent_over_a_sample_of_configurations():
    configs = _sample_of_configurations(1500)
    assert len(configs) > 1000
    for cfg in configs:
        out = predict(cfg)
        for stage in out["memory_bytes_by_stage"]:
            parts = (stage["parameters"] + stage["gradients"] + stage["optimizer_states"] + stage["activations"]
                     + stage["recompute_working"])
            assert stage["total"] == pytest.approx(parts)
            assert min(stage.values()) >= 0
        assert out["memory_bytes"] == out["memory_bytes_by_stage"][out["peak_stage"]]
        assert out["memory_bytes"]["total"] == max(out["memory_bytes_per_stage"])
        assert sum(out["parameters_per_stage"]) >= out["parameters"] / cfg.layout.tp
        time = out["time_s"]
        assert time["compute"] > 0 and time["communication_exposed"] >= 0 and time["bubble"] >= -1e-12
        assert time["iteration"] == pytest.approx(time["compute"] + time["communication_exposed"] + time["bubble"])
        assert 0 <= out["bubble_fraction"] < 1
        if cfg.layout.dp == 1:
            assert out["communication_bytes"]["data_parallel"] == 0


@pytest.mark.parametrize("dp", [2, 8])
def test_each_zero_stage_lowers_model_states_when_stages_hold_several_layers(dp):
    """As the ZeRO paper counts, each stage lowers the peak; the trainer's FSDP2 shards parameters at rest for
    ZeRO-2 as for ZeRO-3, and under torch's pipelining keeps every unit gathered and every gradient unsharded
    until the last microbatch, so that its ZeRO-2 and ZeRO-3 peaks are the same."""
    spec = presets.model("megatron-1.7b")
    totals, trainer, at_rest = [], [], []
    for zero in range(4):
        cfg = Config(model=spec, layout=Layout(dp=dp, pp=2, schedule="1f1b", zero=zero, microbatches=4),
                     training=Training("mixed"))
        for out, into in ((predict(cfg, convention="paper")["memory_bytes"], totals),
                          (predict(cfg)["memory_bytes"], trainer), (predict(cfg)["model_states_at_rest"], at_rest)):
            into.append(out["parameters"] + out["gradients"] + out["optimizer_states"])
    assert totals == sorted(totals, reverse=True) and len(set(totals)) == 4
    assert trainer[0] > trainer[1] and trainer[2] == trainer[3]
    assert at_rest[0] > at_rest[1] > at_rest[2] == at_rest[3]


def test_recomputation_trades_memory_for_flops():
    spec = presets.model("gpt2-medium")
    out = {rc: predict(Config(model=spec, layout=Layout(micro_batch=8, recompute=rc), training=Training("mixed")))
           for rc in ("none", "selective", "full")}
    acts = [out[rc]["memory_bytes"]["activations"] for rc in ("none", "selective", "full")]
    hw = [out[rc]["flops"]["hardware"] for rc in ("none", "selective", "full")]
    assert acts == sorted(acts, reverse=True) and hw == sorted(hw)


def test_tensor_parallel_communication_is_four_all_reduces_per_layer_and_microbatch():
    """Megatron's four all-reduces per layer and microbatch; in 16 bits as the papers count, while the trainer's
    bf16 autocast sends the forward's in bf16 and the backward's (gradients of fp32 LayerNorm outputs) in fp32."""
    spec = ModelSpec(name="x", layers=6, hidden=512, heads=8, vocab=1000, seq=256)
    t, b, m = 4, 2, 3
    cfg = Config(model=spec, layout=Layout(tp=t, micro_batch=b, microbatches=m), training=Training("mixed"))
    elements, ring = b * spec.seq * spec.hidden, 2 * (t - 1) / t
    assert predict(cfg, convention="paper")["communication_bytes"]["tensor_parallel"] == pytest.approx(
        m * spec.layers * 4 * ring * elements * 2)
    assert predict(cfg)["communication_bytes"]["tensor_parallel"] == pytest.approx(
        m * spec.layers * 2 * ring * elements * (2 + 4))
    # full recomputation reruns the layer up to fc2's input: the attention's all-reduce again, not the MLP's
    full = predict(cfg.replace(layout=replace(cfg.layout, recompute="full")))["communication_bytes"]
    assert full["tensor_parallel"] == pytest.approx(m * spec.layers * ring * elements * (3 * 2 + 2 * 4))


def test_pipeline_sends_one_activation_and_one_gradient_per_microbatch_and_boundary():
    spec = ModelSpec(name="x", layers=8, hidden=256, heads=4, vocab=1000, seq=128, tied=False)
    b, m = 4, 6
    out = predict(Config(model=spec, layout=Layout(pp=4, schedule="1f1b", micro_batch=b, microbatches=m)))
    # a middle rank sends its output forward and its input gradient backward, fp32
    assert out["communication_bytes"]["pipeline_parallel"] == 2 * m * b * spec.seq * spec.hidden * 4


def test_2bw_holds_two_weight_versions_and_pipedream_one_per_microbatch_in_flight():
    spec = ModelSpec(name="x", layers=8, hidden=256, heads=4, vocab=1000, seq=128)
    stages = {s: predict(Config(model=spec, layout=Layout(pp=4, schedule=s, microbatches=8)))["memory_bytes_by_stage"]
              for s in ("1f1b", "2bw", "pipedream")}
    for r in range(4):
        assert stages["2bw"][r]["parameters"] == 2 * stages["1f1b"][r]["parameters"]
        assert stages["pipedream"][r]["parameters"] == (4 - r) * stages["1f1b"][r]["parameters"]


def test_predict_rejects_an_invalid_configuration():
    with pytest.raises(ConfigError) as e:
        predict(Config(model=ModelSpec(heads=3), layout=Layout()))
    assert e.value.field == "heads"


def test_benchmark_runs(capsys):
    from distperf.cost import benchmark

    assert benchmark.main(["--count", "200", "--shuffle", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    assert "200 configurations" in out and "the median of 2 passes" in out


@pytest.mark.parametrize("option", ["--count", "--repeats"])
@pytest.mark.parametrize("value", ["0", "-3", "x"])
def test_benchmark_refuses_a_count_or_repeats_below_one(option, value, capsys):
    from distperf.cost import benchmark

    with pytest.raises(SystemExit) as exit_:
        benchmark.main([option, value])
    assert exit_.value.code == 2 and "must be a whole number of at least 1" in capsys.readouterr().err


def test_pipedream_reduces_gradients_after_every_microbatch():
    spec = ModelSpec(name="x", layers=8, hidden=256, heads=4, vocab=1000, seq=128)
    m = 8
    comm = {s: predict(Config(model=spec, layout=Layout(dp=4, pp=4, schedule=s, microbatches=m)))["communication_bytes"]
            for s in ("1f1b", "pipedream")}
    assert comm["pipedream"]["data_parallel"] == pytest.approx(m * comm["1f1b"]["data_parallel"])


def test_small_buckets_pay_latency_and_one_huge_bucket_cannot_overlap():
    """The exposed all-reduce is U-shaped in the bucket size (Lu et al.'s "communication block size")."""
    grads, backward = 4e8, 0.05
    exposed = [bucketed_exposed_time(grads, bucket, backward, "all-reduce", 8, 2e-5, 2e10)
               for bucket in (2**14, 2**20, 2**25, 2**30)]
    assert exposed[0] > exposed[2] < exposed[3] and exposed[1] > exposed[2]


def test_the_prediction_fingerprint_is_the_same_twice_and_covers_every_strategy(tmp_path):
    """scripts/prediction_fingerprint.py, which compares the cost model across commits, is deterministic."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "scripts" / "prediction_fingerprint.py"
    runs = [subprocess.run([sys.executable, str(script), "--count", "300", "--out", str(tmp_path / f"{k}.jsonl")],
                           capture_output=True, text=True, timeout=120) for k in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr
    assert runs[0].stdout == runs[1].stdout and "sha256" in runs[0].stdout
    lines = (tmp_path / "0.jsonl").read_text().splitlines()
    layouts = [json.loads(line)["config"]["layout"] for line in lines]
    assert len(lines) == 300 and {lay["schedule"] for lay in layouts} >= {"none", "gpipe", "1f1b", "interleaved",
                                                                          "2bw", "pipedream"}
    assert {lay["zero"] for lay in layouts} == {0, 1, 2, 3} and any(lay["sequence_parallel"] for lay in layouts)


@pytest.mark.parametrize("pp", [2, 4])
def test_2bw_with_a_tied_embedding_waits_each_step_for_the_first_ranks_update(pp, monkeypatch):
    """Under 2BW the last rank's update all-reduces the tied embedding with the first rank's, which follows the last
    gradient across ranks p − 2 … 0: the last rank's step gains Σ drain_r of those ranks, as idle time (the bubble),
    and the iteration is the slowest rank's; an untied model, the flushing schedules and the papers' count do not
    wait."""
    import importlib

    from distperf.cost.stage import stage_costs

    prediction = importlib.import_module("distperf.cost.predict")

    spec = ModelSpec(name="t", layers=8, hidden=64, heads=4, vocab=4096, seq=16, ffn=256, tied=True)
    cfg = validate(Config(model=spec, layout=Layout(pp=pp, micro_batch=1, microbatches=8, schedule="2bw")))
    waited = predict(cfg)["time_s"]
    lay = cfg.layout
    spans, unique, which, _ = prediction._spans(lay.partition or prediction._uniform(spec.layers, pp), pp, 1)
    stages = stage_costs(spec, lay, cfg.training, prediction.PRESETS[prediction.DEFAULT], unique,
                         prediction.DDP_BUCKET_BYTES)
    ranks = [stages[i] for i in which]
    wait = sum(rank.drain for rank in ranks[:-1])
    assert wait > 0 and prediction.tied_update_wait(ranks) == pytest.approx(wait)
    last = ranks[-1]
    m = lay.microbatches
    last_end = m * last.microbatch + wait + last.step_exposed + last.optimizer + (m - 1) * last.accumulate
    monkeypatch.setattr(prediction, "tied_update_wait", lambda ranks: 0.0)
    free = predict(cfg)["time_s"]
    assert waited["iteration"] == pytest.approx(max(free["iteration"], last_end))  # the slowest rank sets the pace
    if last_end > free["iteration"]:  # then the last rank ends the iteration, idle for the wait
        assert waited["bubble"] == pytest.approx(wait)
    monkeypatch.undo()
    untied = validate(Config(model=replace(spec, tied=False), layout=lay))
    flush = validate(Config(model=spec, layout=replace(lay, schedule="1f1b")))
    monkeypatch.setattr(prediction, "tied_update_wait", lambda ranks: 1e9)  # never asked for these three
    assert predict(untied)["time_s"]["iteration"] < 1e9 and predict(flush)["time_s"]["iteration"] < 1e9
    assert predict(cfg, convention="paper")["time_s"]["iteration"] < 1e9  # the papers count no wait


def test_a_checked_model_does_not_vouch_for_an_equal_one_of_another_type():
    """validate remembers the model objects whose rules held (a sweep checks a few models 10^5 times); a spec that
    compares equal but holds a bool where a size belongs (True == 1) is still refused."""
    ok = ModelSpec(name="m", layers=1, hidden=32, heads=4, vocab=64, seq=8, ffn=64)
    validate(Config(model=ok))
    assert validate(Config(model=ok)).model is ok  # remembered
    with pytest.raises(ConfigError) as e:
        validate(Config(model=replace(ok, layers=True)))
    assert e.value.field == "layers"


# Memory-bound operators over FLOPs (GPU presets) -----------------------------------------------------------

def test_memory_bound_traffic_is_the_papers_stash_count_in_each_pass():
    from distperf.cost import activations as act

    s, b, h, a, t = 2048, 1, 1024, 16, 4
    for sp in (False, True):
        full = act.layer_activation_bytes(s, b, h, a, t, sp, True, 2, "none", "math")
        no_scores = act.layer_activation_bytes(s, b, h, a, t, sp, True, 2, "selective", "math")
        scores = full - no_scores
        assert scores > 0
        assert act.layer_traffic_bytes(s, b, h, a, t, sp, True, 2, "none", "math") == pytest.approx((full, 2 * full))
        assert act.layer_traffic_bytes(s, b, h, a, t, sp, True, 2, "full", "math") == pytest.approx((full, 3 * full))
        assert act.layer_traffic_bytes(s, b, h, a, t, sp, True, 2, "selective", "math") == pytest.approx(
            (full, 2 * full + scores))
        # a fused attention never writes the scores: nothing of them to move, nor to recompute
        assert act.layer_traffic_bytes(s, b, h, a, t, sp, True, 2, "selective", "sdpa") == pytest.approx(
            (no_scores, 2 * no_scores))
    # Korthikanti et al.'s sbh(34 + 5as/h) for t = 1
    assert act.layer_traffic_bytes(s, b, h, a, 1, False, True, 2, "none", "math")[0] == pytest.approx(
        s * b * h * (34 + 5 * a * s / h))


def test_memory_passes_add_the_memory_bound_operators_to_the_compute_over_flops():
    from distperf.cost import activations as act, stage
    from distperf.hardware import PRESETS

    spec = ModelSpec(layers=4, hidden=1024, heads=16, vocab=5000, seq=512, dropout=0.1, attention="math")
    lay, tr = Layout(tp=2, micro_batch=2, recompute="full"), Training(precision="mixed")
    base = PRESETS["A100-80GB"]
    span = stage.Span(layers=3, first=False, last=True)
    plain = stage.compute(spec, lay, tr, base, span)
    passes = replace(base, memory_passes=2.5)
    more = stage.compute(spec, lay, tr, passes, span)
    forward, backward = act.layer_traffic_bytes(512, 2, 1024, 16, 2, False, True, 2, "full", "math")
    per_byte = 2.5 * 3 / base.memory_bandwidth
    assert more.forward - plain.forward == pytest.approx(forward * per_byte)
    assert more.backward - plain.backward == pytest.approx(backward * per_byte)
    # a rank with no layer moves nothing; the presets leave the term out
    ends = stage.Span(layers=0, first=True, last=True)
    assert stage.compute(spec, lay, tr, passes, ends) == stage.compute(spec, lay, tr, base, ends)
    assert all(hw.memory_passes == 0 for hw in PRESETS.values())
    cfg = Config(model=spec, layout=lay, training=tr)
    assert predict(cfg, passes)["time_s"]["iteration"] > predict(cfg, base)["time_s"]["iteration"]
