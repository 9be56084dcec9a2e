"""The cost model against published numbers and closed forms (chapter "The analytical framework").

The published numbers come from the committed table ``data/published/values.csv`` (:mod:`distperf.published`)."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from distperf import presets, published
from distperf.config import Config, Layout, ModelSpec, Training
from distperf.cost import activations, flops, parameters, predict, schedules
from distperf.cost.collectives import sent_bytes
from distperf.cost.model_states import bytes_per_parameter, zero_model_state_bytes
from distperf.hardware import PRESETS

MEGATRON = [name for name in presets.MODELS if name.startswith("megatron-")]
CHECKPOINTS = [r["item"] for r in published.select(source="radford2019language", quantity="parameters")]
IN_BILLIONS = [r["item"] for r in published.select(quantity="parameters", unit="billion")]


# Parameters ---------------------------------------------------------------------------------------

def test_the_published_table_covers_what_the_tests_read():
    assert len(CHECKPOINTS) == 4 and set(MEGATRON) <= set(IN_BILLIONS) and "2bw-gpt-28.3b" in IN_BILLIONS


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_gpt2_parameter_counts_match_the_released_checkpoints(name):
    """Hugging Face's GPT-2 checkpoints (tied head, learned positions, n_positions = 1024)."""
    m = presets.model(name)
    assert parameters.model_parameters(m.layers, m.hidden, m.ffn, m.vocab, m.seq, m.tied) == \
        published.parameter_count(name)[0]


@pytest.mark.parametrize("name", [n for n in IN_BILLIONS if n != "gpt3-175b"])
def test_parameter_count_rounds_to_the_papers_size(name):
    """Megatron-LM's Table 1 (Narayanan et al. 2021) and the 2BW paper name models by their size in
    billions to one decimal; our count must round to it. (GPT-3's 175.0B is a nominal size: the papers'
    chapter shows its miss.)"""
    m = presets.model(name)
    count = parameters.model_parameters(m.layers, m.hidden, m.ffn, m.vocab, m.seq, m.tied)
    assert round(count / 1e9, 1) == published.value(name, "parameters")


@pytest.mark.parametrize("name", MEGATRON + ["gpt2", "gpt3-175b"])
def test_parameter_count_is_the_closed_form_plus_the_final_layernorm(name):
    """12Lh²(1 + 13/(12h) + (V + s)/(12Lh)) counts layers and embeddings; the final LayerNorm adds 2h."""
    m = presets.model(name)
    count = parameters.model_parameters(m.layers, m.hidden, m.ffn, m.vocab, m.seq, m.tied)
    assert count == pytest.approx(parameters.narayanan_parameters(m.layers, m.hidden, m.vocab, m.seq) + 2 * m.hidden,
                                  rel=1e-12)


def test_layer_parameters_per_tp_rank_sum_back_to_the_layer():
    """t ranks each hold the sharded part /t plus the replicated 6h; the replicas are counted t times."""
    h, ffn = 1024, 4096
    for t in (1, 2, 4, 8):
        per_rank = parameters.layer_parameters_per_tp_rank(h, ffn, t)
        assert per_rank * t - (t - 1) * 6 * h == parameters.layer_parameters(h, ffn) == 12 * h * h + 13 * h
        assert sum(numel for _, numel in parameters.layer_tensors(h, ffn, t)) == per_rank


# FLOPs ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", MEGATRON + ["gpt3-175b"])
@pytest.mark.parametrize("batch", [1, 512, 1536])
def test_flops_reproduce_megatron_72_and_96_forms(name, batch):
    m = presets.model(name)
    args = (batch, m.layers, m.seq, m.hidden, m.ffn, m.vocab)
    assert flops.model_flops(*args) == pytest.approx(
        flops.narayanan_flops(batch, m.layers, m.seq, m.hidden, m.vocab, full_recompute=False), rel=1e-12)
    assert flops.hardware_flops(*args, "full") == pytest.approx(
        flops.narayanan_flops(batch, m.layers, m.seq, m.hidden, m.vocab, full_recompute=True), rel=1e-12)
    assert flops.hardware_flops(*args, "none") == flops.model_flops(*args)


def test_predict_reports_whole_iteration_flops_for_the_global_batch():
    m = presets.model("megatron-18.4b")
    cfg = Config(model=m, layout=Layout(dp=4, tp=8, pp=2, schedule="1f1b", micro_batch=2, microbatches=16,
                                        recompute="full"), training=Training("mixed"))
    out = predict(cfg)
    batch = 2 * 16 * 4
    assert out["flops"]["model"] == pytest.approx(flops.narayanan_flops(batch, m.layers, m.seq, m.hidden, m.vocab, False))
    assert out["flops"]["hardware"] == pytest.approx(flops.narayanan_flops(batch, m.layers, m.seq, m.hidden, m.vocab, True))


# ZeRO -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("stage", range(4))
def test_zero_paper_figure_1(stage):
    """ZeRO paper, Fig. 1: Ψ = 7.5B, N_d = 64, K = 12 → 120 GB, 31.4 GB, 16.6 GB, 1.9 GB per device."""
    gb = published.value(f"psi=7.5e9 N=64 zero={stage}", "model states per device")
    assert round(sum(zero_model_state_bytes(7.5e9, 64, stage)) / 1e9, 1) == gb


def test_zero_paper_section_3_1():
    """ZeRO paper, §3.1: Ψ = 1.5B parameters take 3 GB in 16 bits and 24 GB of mixed-precision Adam states."""
    p16, g16, k = bytes_per_parameter("mixed", "adam")
    assert 1.5e9 * p16 / 1e9 == published.value("psi=1.5e9", "16-bit weights")
    assert 1.5e9 * (p16 + g16 + k) / 1e9 == published.value("psi=1.5e9", "model states, mixed-precision Adam")


@pytest.mark.parametrize("n", [2, 4, 8, 64])
def test_zero_stage_formulas(n):
    psi = 1e9
    total = [sum(zero_model_state_bytes(psi, n, stage)) for stage in range(4)]
    assert total == pytest.approx([16 * psi, 4 * psi + 12 * psi / n, 2 * psi + 14 * psi / n, 16 * psi / n])


def test_bytes_per_parameter_conventions():
    assert sum(bytes_per_parameter("mixed", "adam")) == 16
    assert bytes_per_parameter("fp32", "adam") == (4, 4, 8)
    assert bytes_per_parameter("fp32", "sgd", momentum=True) == (4, 4, 4)
    assert bytes_per_parameter("mixed", "sgd", momentum=True) == (2, 2, 8)
    assert bytes_per_parameter("fp32", "sgd", momentum=False) == (4, 4, 0)
    assert bytes_per_parameter("mixed", "sgd", momentum=False) == (2, 2, 4)


def _divisible_model():
    # every dim-0 divisible by dp = 4, so that FSDP's chunks are exact and Ψ/N has no rounding
    return ModelSpec(name="even", layers=4, hidden=64, heads=4, vocab=256, seq=32, tied=False)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_predicted_model_states_are_the_zero_formulas_plus_one_unit_in_flight(zero):
    """Under the papers' convention (16-bit weights and gradients, one FSDP unit unsharded at a time); what the
    trainer holds is tested in test_cost_model.py against FSDP2's behaviour."""
    spec, dp = _divisible_model(), 4
    cfg = Config(model=spec, layout=Layout(dp=dp, zero=zero), training=Training("mixed"))
    mem = predict(cfg, convention="paper")["memory_bytes"]
    psi = parameters.model_parameters(spec.layers, spec.hidden, spec.ffn, spec.vocab, spec.seq, spec.tied)
    expected = list(zero_model_state_bytes(psi, dp, zero))
    # FSDP keeps one unit (the largest: here the embeddings, V·h + s·h) unsharded while it works
    unit = max(parameters.layer_parameters(spec.hidden, spec.ffn), (spec.vocab + spec.seq) * spec.hidden)
    if zero >= 2:
        expected[1] += 2 * unit
    if zero == 3:
        expected[0] += 2 * unit
    got = [mem["parameters"], mem["gradients"], mem["optimizer_states"]]
    if zero == 1:  # whole tensors per rank: the most loaded rank holds at least Ψ/N
        assert got[:2] == expected[:2] and got[2] >= expected[2]
        assert got[2] < expected[2] * 1.5
    else:
        assert got == pytest.approx(expected)


@pytest.mark.parametrize("zero, factor", [(0, 2), (1, 2), (2, 2), (3, 3)])
@pytest.mark.parametrize("n", [2, 8, 64])
def test_zero_communication_is_2_or_3_psi_per_rank(zero, factor, n):
    """ZeRO paper §7: DP and ZeRO-1/2 move 2Ψ per rank and iteration, ZeRO-3 3Ψ (ring, × (n − 1)/n), in 16 bits,
    the papers' convention (ZeRO-1 as a reduce-scatter and an all-gather)."""
    spec = _divisible_model()
    out = predict(Config(model=spec, layout=Layout(dp=n, zero=zero), training=Training("mixed")), convention="paper")
    psi = parameters.model_parameters(spec.layers, spec.hidden, spec.ffn, spec.vocab, spec.seq, spec.tied)
    assert out["communication_bytes"]["data_parallel"] == pytest.approx(factor * 2 * psi * (n - 1) / n)


# Activations (Korthikanti et al. 2022, Table 2) -------------------------------------------------------

GPT3 = dict(s=2048, b=1, h=12288, a=96)


@pytest.mark.parametrize("t", [1, 2, 8])
def test_korthikanti_table_2(t):
    """Korthikanti et al. 2022, Table 2 (16-bit with dropout), read from the published table."""
    s, b, h, a = GPT3["s"], GPT3["b"], GPT3["h"], GPT3["a"]
    layer = activations.layer_activation_bytes
    form = published.korthikanti_layer_bytes
    assert layer(s, b, h, a) == pytest.approx(form("no parallelism", s, b, h, a))
    assert layer(s, b, h, a, t=t) == pytest.approx(form("tensor parallel", s, b, h, a, t))
    assert layer(s, b, h, a, t=t, recompute="full") == form("full recompute", s, b, h, a, t)
    assert layer(s, b, h, a, t=t, recompute="selective") == pytest.approx(
        form("tensor parallel + selective recompute", s, b, h, a, t))
    if t > 1:
        assert layer(s, b, h, a, t=t, sp=True) == pytest.approx(form("tensor + sequence parallel", s, b, h, a, t))
        assert layer(s, b, h, a, t=t, sp=True, recompute="selective") == pytest.approx(
            form("tensor + sequence parallel + selective recompute", s, b, h, a, t))


def test_activations_without_dropout_or_in_fp32():
    s, b, h, a = 512, 4, 1024, 16
    sbh = s * b * h
    layer = activations.layer_activation_bytes
    # no dropout: no masks (2·sbh, as²b bytes) and no dropout output (2·as²b)
    assert layer(s, b, h, a, dropout=False) == pytest.approx(sbh * (32 + 2 * a * s / h))
    # fp32 doubles the values, not the one-byte masks
    assert layer(s, b, h, a, value_bytes=4) == pytest.approx(sbh * (66 + 9 * a * s / h))


def test_predicted_activations_are_l_layers_of_korthikanti_for_a_single_device():
    spec = replace(presets.model("gpt2-medium"), dropout=0.1, attention="math")
    cfg = Config(model=spec, layout=Layout(micro_batch=4), training=Training("mixed"))
    s, b, h, a = spec.seq, 4, spec.hidden, spec.heads
    per_layer = published.korthikanti_layer_bytes("no parallelism", s, b, h, a)
    extra = activations.embedding_stash_bytes(s, b, h, True) + activations.head_stash_bytes(s, b, h, spec.vocab, 1, False, 2)
    assert predict(cfg, convention="paper")["memory_bytes"]["activations"] == pytest.approx(
        spec.layers * per_layer + extra)


# Pipelines ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("p, m", [(2, 1), (4, 4), (4, 16), (8, 32)])
def test_bubble_fraction_gpipe_and_1f1b(p, m):
    assert schedules.bubble_fraction(p, m) == (p - 1) / (m + p - 1)
    for schedule in ("gpipe", "1f1b"):
        pipe = schedules.pipeline_time(schedule, [1.0] * p, m, 1)
        assert pipe == m + p - 1
        assert (pipe - m) / pipe == pytest.approx(schedules.bubble_fraction(p, m))


@pytest.mark.parametrize("p, m, v", [(4, 8, 2), (8, 16, 4)])
def test_bubble_fraction_interleaved(p, m, v):
    """Narayanan et al. 2021: the bubble shrinks by v; (p − 1)/(v·m) of the ideal time."""
    t = 1.0  # a rank's time per microbatch, all its chunks together
    pipe = schedules.pipeline_time("interleaved", [t] * p, m, v)
    assert (pipe - m * t) / (m * t) == pytest.approx((p - 1) / (v * m))
    assert (pipe - m * t) / pipe == pytest.approx(schedules.bubble_fraction(p, m, v))


def _ideal_hardware():
    """Free communication and optimizer steps: an iteration is the pipeline's compute alone."""
    return replace(PRESETS["A100-80GB"], name="ideal", memory_bandwidth=math.inf, intra_latency=0.0,
                   inter_latency=0.0, intra_bandwidth=math.inf, inter_bandwidth=math.inf)


@pytest.mark.parametrize("schedule, v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)])
def test_predicted_bubble_fraction_approaches_the_closed_form_for_near_equal_stages(schedule, v):
    """A tiny vocabulary makes embedding and head nearly free, so stages are almost equal."""
    spec = ModelSpec(name="deep", layers=32, hidden=1024, heads=16, vocab=2, seq=512)
    p, m = 4, 8
    cfg = Config(model=spec, layout=Layout(pp=p, schedule=schedule, chunks=v, microbatches=m), training=Training("mixed"))
    out = predict(cfg, _ideal_hardware())
    assert out["bubble_fraction"] == pytest.approx(schedules.bubble_fraction(p, m, v), rel=2e-4)


def test_no_flush_schedules_have_no_bubble():
    """As the papers count them; in the trainer, 2BW with a tied embedding waits for its update (test_cost_model)."""
    spec = ModelSpec(name="deep", layers=8, hidden=256, heads=4, vocab=256, seq=128)
    for schedule in ("2bw", "pipedream"):
        cfg = Config(model=spec, layout=Layout(pp=4, schedule=schedule, microbatches=8))
        assert predict(cfg, convention="paper")["bubble_fraction"] == 0.0
        assert predict(replace(cfg, model=replace(spec, tied=False)))["bubble_fraction"] == 0.0
    assert predict(Config(model=spec, layout=Layout(pp=4, schedule="2bw", microbatches=8)))["bubble_fraction"] > 0


def _one_layer_per_stage(schedule, d, m):
    """Under the papers' convention, with the unfused attention they count."""
    spec = ModelSpec(name="d", layers=d, hidden=256, heads=8, vocab=512, seq=128, dropout=0.1, attention="math")
    cfg = Config(model=spec, layout=Layout(pp=d, schedule=schedule, microbatches=m, micro_batch=2, recompute="full"),
                 training=Training("mixed"))
    return spec, predict(cfg, convention="paper")["memory_bytes_by_stage"]


@pytest.mark.parametrize("d, m", [(4, 4), (4, 8), (8, 16)])
def test_2bw_and_gpipe_memory_match_the_2bw_paper(d, m):
    """arXiv 2006.09503, §3.1 and App. A.1.2, with recomputation: 2BW 2|W|/d + |A_total(b)|/d + d·|A_input(b)|,
    GPipe |W|/d + |A_total(b)|/d + m·|A_input(b)|. With one layer per stage, |W|/d is a layer's weights,
    |A_total(b)|/d a layer's activations (recomputed in backward) and |A_input(b)| its input. The paper's
    d in-flight inputs are the first stage's count; stage r holds d − r."""
    spec, twobw = _one_layer_per_stage("2bw", d, m)
    _, gpipe = _one_layer_per_stage("gpipe", d, m)
    s, b, h, a = spec.seq, 2, spec.hidden, spec.heads
    weights = d * parameters.layer_parameters(h, spec.ffn) * 2  # |W| over the d layer stages, 16-bit
    a_total = d * activations.layer_activation_bytes(s, b, h, a)
    a_input = activations.layer_activation_bytes(s, b, h, a, recompute="full")
    for r in range(1, d - 1):  # the middle stages: no embedding, no head; |A_total(b)|/d is the recomputed layer
        assert twobw[r]["parameters"] + twobw[r]["activations"] + twobw[r]["recompute_working"] == pytest.approx(
            schedules.pipedream_2bw_memory(weights, a_total, a_input, d) - r * a_input)
        assert gpipe[r]["parameters"] + gpipe[r]["activations"] + gpipe[r]["recompute_working"] == pytest.approx(
            schedules.gpipe_memory(weights, a_total, a_input, d, m))


@pytest.mark.parametrize("schedule", ["1f1b", "2bw"])
def test_1f1b_keeps_at_most_d_minus_r_microbatches_at_stage_r(schedule):
    d, m = 8, 16
    spec, stages = _one_layer_per_stage(schedule, d, m)
    a_input = activations.layer_activation_bytes(spec.seq, 2, spec.hidden, spec.heads, recompute="full")
    working = activations.recompute_working_bytes(spec.seq, 2, spec.hidden, spec.heads, 1, False, True, 2, "full")
    for r in range(1, d - 1):  # the recomputed layer's working set is reported apart from the stash
        assert stages[r]["activations"] / a_input == pytest.approx(d - r)
        assert stages[r]["recompute_working"] == working
    assert [schedules.in_flight(schedule, d, m, 1, r) for r in range(d)] == [(d - r,) for r in range(d)]
    assert [schedules.in_flight(schedule, d, 3, 1, r) for r in range(d)] == [(min(d - r, 3),) for r in range(d)]


# Collectives ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 3, 8, 64])
def test_ring_collective_volumes(n):
    assert sent_bytes("all-reduce", 1000.0, n) == pytest.approx(2 * (n - 1) / n * 1000)
    assert sent_bytes("all-gather", 1000.0, n) == pytest.approx((n - 1) / n * 1000)
    assert sent_bytes("reduce-scatter", 1000.0, n) == pytest.approx((n - 1) / n * 1000)
