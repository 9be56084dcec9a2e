"""The kernel time model: its interpolation, its inventory of a layer against what torch runs, its constants in a
hardware profile, and its place in the prediction."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from distperf import presets
from distperf.config import Config, ConfigError, Layout, validate
from distperf.cost import kernels as kn
from distperf.cost import predict
from distperf.hardware import PRESETS, load_profile, save_profile


def synthetic_costs(scale: float = 1.0, **changes) -> kn.KernelCosts:
    """Kernel times of an invented machine: a linear layer costs 10 µs + 2n³ / 10 GFLOP/s, every elementwise kind
    1 µs + 1 ns per element, attention 5 µs per call + 1 ns per (s²·d) per head, Adam 10 µs + 2 ns per element."""
    linear = tuple((n, scale * (1e-5 + 2 * n**3 / 1e10), scale * 2 * (1e-5 + 2 * n**3 / 1e10))
                   for n in (8, 32, 128, 512, 2048))
    attention = tuple((c, s, d, 5e-6, 1e-9 * s * s * d, 1e-5, 2e-9 * s * s * d)
                      for c in (True, False) for s in (16, 256, 1024) for d in (8, 128))
    elementwise = tuple((kind, n, 1e-6 + 1e-9 * n, 2e-6 + 2e-9 * n) for kind in
                        ("layer_norm", "gelu", "add", "copy", "cross_entropy", "embedding") for n in (64, 4096, 1 << 22))
    adam = tuple((n, 1e-5 + 2e-9 * n) for n in (1, 1024, 1 << 22))
    return replace(kn.KernelCosts(linear_fp32=linear, linear_bf16=(), attention=attention, elementwise=elementwise,
                                  view=(1e-6, 2e-6), module_call_s=1e-6, backward_call_s=1e-5, adam=adam,
                                  step_s=1e-4), **changes)


def test_loglog_interpolates_between_points_and_extrapolates_by_the_power():
    table = ((10, 1.0), (100, 100.0))
    assert kn.loglog(table, 10) == 1.0
    assert math.isclose(kn.loglog(table, math.sqrt(10 * 100)), 10.0)  # y ∝ x² between the points
    assert kn.loglog(table, 1) == 1.0  # below: the fixed cost
    assert math.isclose(kn.loglog(table, 1000, 3.0), 100.0 * 1000)  # above: ∝ x³
    assert math.isclose(kn.loglog(table, 1000), 1000.0)


def test_a_linear_layer_costs_what_the_square_one_of_the_same_work_costs():
    costs = synthetic_costs()
    f, b = kn.linear(costs, 32, 32, 32, False)
    assert math.isclose(f, 1e-5 + 2 * 32**3 / 1e10) and math.isclose(b, 2 * f)
    # 64 × 16 × 32 is the work of 32³: the same time
    assert kn.linear(costs, 64, 16, 32, False) == pytest.approx((f, b))
    # bf16 falls back to the fp32 table when it was not measured
    assert kn.linear(costs, 32, 32, 32, True) == (f, b)


def test_attention_is_a_call_plus_per_head_time():
    costs = synthetic_costs()
    one = kn.attention(costs, True, 1, 256, 8)
    eight = kn.attention(costs, True, 8, 256, 8)
    assert math.isclose(eight[0] - one[0], 7 * 1e-9 * 256 * 256 * 8, rel_tol=1e-6)
    assert math.isclose(one[0], 5e-6 + 1e-9 * 256 * 256 * 8, rel_tol=1e-6)
    assert kn.attention(costs, True, 1, 4096, 8)[0] > 15 * one[0]  # beyond the table: ∝ s²


def test_a_layers_classes_add_up_and_recomputation_repeats_the_forward():
    costs = synthetic_costs()
    args = (2, 64, 128, 4, 512, 1, False, True, True, False)
    plain = kn.layer(costs, *args, "none", False)
    full = kn.layer(costs, *args, "full", False)
    selective = kn.layer(costs, *args, "selective", False)
    for c in kn.CLASSES:
        assert full[c][1] == pytest.approx(plain[c][1] + plain[c][0])
    assert selective["attention"][1] == pytest.approx(plain["attention"][1] + plain["attention"][0])
    assert selective["matrix_products"] == plain["matrix_products"]
    # the four linear layers: QKV, projection, MLP in and out
    m = 2 * 64
    expected = sum(kn.linear(costs, m, n, k, False)[0] for n, k in ((384, 128), (128, 128), (512, 128), (128, 512)))
    assert plain["matrix_products"][0] == pytest.approx(expected)
    # tensor parallelism shards the products
    assert kn.layer(costs, 2, 64, 128, 4, 512, 2, False, True, True, False, "none", False)["matrix_products"][0] \
        < plain["matrix_products"][0]


def test_without_drops_the_ablated_terms():
    costs = synthetic_costs(tp_layer_s=1e-3, contention_memory=2.0, tp_collective_s=1e-3)
    bare = costs.without("optimizer", "framework", "contention")
    assert bare.adam == () and bare.module_call_s == 0 and bare.step_s == 0 and bare.tp_layer_s == 0
    assert bare.contention_memory == 1.0 and bare.tp_collective_s == 1e-3  # a collective's cost is not framework
    assert costs.without("collectives").tp_collective_s == 0 and costs.without("collectives").tp_layer_s == 1e-3
    assert costs.without("framework").adam == costs.adam


def test_dtensors_cost_outside_its_collectives_is_framework_and_changes_no_time():
    """TensorParallelTerms.outside = calls · (per-call cost − the part inside, at most the per-call cost); the split
    moves time between the predicted breakdown's communication and framework and leaves the step's time alone."""
    from distperf import presets
    from distperf.analysis.time_model import predicted_classes, tp_outside
    from distperf.config import Config, Layout, validate
    from distperf.cost import predict
    from distperf.cost.communication import tensor_parallel
    from distperf.cost.predict import rank_spans

    cfg = validate(Config(model=presets.model("small"), layout=Layout(tp=2, micro_batch=2, microbatches=3)))
    span = rank_spans(cfg)[0]

    def at(wait):
        hw = replace(PRESETS["A100-80GB"], kernels=synthetic_costs(tp_collective_s=1e-3, tp_collective_wait_s=wait))
        terms = tensor_parallel(cfg.model, cfg.layout, cfg.training, hw, span)
        return hw, terms, predict(cfg, hw, check=False)["time_s"]["iteration"], predicted_classes(cfg, hw)

    (hw, some, time_some, classes_some), (_, none_, time_none, classes_none) = at(4e-4), at(0.0)
    assert some.calls > 0 and some.outside == pytest.approx(some.calls * 6e-4)
    assert none_.outside == pytest.approx(none_.calls * 1e-3) and at(2e-3)[1].outside == 0.0
    assert time_some == time_none and tp_outside(cfg, hw, span) == pytest.approx(3 * some.outside)
    assert classes_some["communication"] - classes_none["communication"] == pytest.approx(3 * some.calls * 4e-4)
    assert sum(classes_some.values()) == pytest.approx(sum(classes_none.values()))
    plain = replace(cfg, layout=replace(cfg.layout, tp=1))
    assert tp_outside(plain, hw, rank_spans(plain)[0]) == 0.0


def test_contention_slows_what_ranks_share_only_when_there_are_several():
    calm = replace(PRESETS["A100-80GB"], kernels=synthetic_costs())
    busy = replace(PRESETS["A100-80GB"], kernels=synthetic_costs(contention_memory=2.0, contention_compute=1.5))
    one, two = small_cfg(), small_cfg(dp=2)
    assert predict(one, busy)["time_s"] == predict(one, calm)["time_s"]
    assert predict(two, busy)["time_s"]["compute"] > 1.4 * predict(two, calm)["time_s"]["compute"]


def test_a_layers_contention_prices_every_kernel_class_of_a_layer_in_place_of_the_two_others():
    """With ``contention_layer`` (a what-if) a run of several ranks pays that ratio on matrix products, attention and
    the other operators alike, whatever the compute- and memory-bound ratios; one rank pays none; without it (0) the
    two others price them; a profile's JSON never sets it; the ablation's contention takes it out."""
    from distperf.cost.kernels import KernelCosts
    from distperf.cost.stage import layer_contention

    base = synthetic_costs(contention_memory=2.0, contention_compute=1.5)
    assert layer_contention(base) == {"matrix_products": 1.5, "attention": 1.5, "other_operators": 2.0}
    layered = replace(base, contention_layer=1.1)
    assert layer_contention(layered) == dict.fromkeys(("matrix_products", "attention", "other_operators"), 1.1)
    calm = replace(PRESETS["A100-80GB"], kernels=synthetic_costs())
    one, two = small_cfg(), small_cfg(pp=2, schedule="1f1b", microbatches=2)
    assert predict(one, replace(calm, kernels=layered))["time_s"] == predict(one, calm)["time_s"]
    alone = predict(two, calm)["time_s"]["compute"]
    assert predict(two, replace(calm, kernels=replace(synthetic_costs(), contention_layer=1.1)))["time_s"][
        "compute"] > 1.05 * alone
    profile = layered.to_dict()
    profile["contention"]["layer"] = 1.1  # as a calibration writes it: a profile never prices it (its rule failed)
    assert "layer" not in base.to_dict()["contention"] and KernelCosts.from_dict(profile) == base
    assert layered.without("contention").contention_layer == 0.0


def small_cfg(**layout) -> Config:
    return validate(Config(model=presets.model("small"), layout=Layout(**{"micro_batch": 2, **layout})))


def test_predict_prices_compute_by_kernels_when_the_profile_has_them():
    hw = replace(PRESETS["A100-80GB"], kernels=synthetic_costs())
    out = predict(small_cfg(), hw)
    assert out["compute_from"] == "kernels"
    assert predict(small_cfg(), PRESETS["A100-80GB"])["compute_from"] == "flops"
    slower = replace(PRESETS["A100-80GB"], kernels=synthetic_costs(scale=2.0))
    assert predict(small_cfg(), slower)["time_s"]["compute"] > out["time_s"]["compute"]
    # the wrappers' costs land where their parallelism runs, and only there
    wrapped = replace(PRESETS["A100-80GB"], kernels=synthetic_costs(tp_layer_s=1e-3, fsdp_unit_s=1e-3))
    tp = small_cfg(tp=2)
    gained = predict(tp, wrapped)["time_s"]["compute"] - predict(tp, hw)["time_s"]["compute"]
    assert gained == pytest.approx(tp.layout.microbatches * tp.model.layers * 1e-3, rel=1e-6)
    dp = small_cfg(dp=2)
    assert predict(dp, wrapped)["time_s"]["compute"] == pytest.approx(predict(dp, hw)["time_s"]["compute"])
    z3 = small_cfg(dp=2, zero=3)
    gained = predict(z3, wrapped)["time_s"]["compute"] - predict(z3, hw)["time_s"]["compute"]
    assert gained == pytest.approx(z3.layout.microbatches * (z3.model.layers + 1) * 1e-3, rel=1e-6)


@pytest.mark.parametrize("tp, sp, recompute, constant", [
    (1, False, "full", "recompute_layer_s"), (1, False, "selective", "recompute_core_s"),
    (2, False, "full", "tp_recompute_layer_s"), (2, False, "selective", "tp_recompute_core_s"),
    (2, True, "full", "tp_sp_recompute_layer_s"), (2, True, "selective", "tp_sp_recompute_core_s")])
def test_recomputation_costs_its_own_constant_per_recomputed_layer_and_no_other(tp, sp, recompute, constant):
    hw = replace(PRESETS["A100-80GB"], kernels=synthetic_costs())
    cfg = small_cfg(tp=tp, sequence_parallel=sp, recompute=recompute)
    base = predict(cfg, hw)["time_s"]["compute"]
    for name in kn.RECOMPUTE_WRAPPERS:
        with_it = replace(hw, kernels=replace(hw.kernels, **{name: 1e-3}))
        gained = predict(cfg, with_it)["time_s"]["compute"] - base
        expected = cfg.layout.microbatches * cfg.model.layers * 1e-3 if name == constant else 0.0
        assert gained == pytest.approx(expected, abs=1e-12), name
    # without recomputation none of them counts
    plain = small_cfg(tp=tp, sequence_parallel=sp)
    every = replace(hw, kernels=replace(hw.kernels, **dict.fromkeys(kn.RECOMPUTE_WRAPPERS, 1e-3)))
    assert predict(plain, every)["time_s"]["compute"] == predict(plain, hw)["time_s"]["compute"]


def test_the_optimizer_is_adams_loop_over_the_ranks_tensors():
    from distperf.cost.model_states import state_bytes
    from distperf.model import build_model

    costs = synthetic_costs()
    hw = replace(PRESETS["A100-80GB"], kernels=costs)
    cfg = small_cfg()
    with_loop = predict(cfg, hw)["time_s"]["compute"]
    with_bandwidth = predict(cfg, replace(hw, kernels=costs.without("optimizer")))["time_s"]["compute"]
    sizes = [p.numel() for p in build_model(cfg.model).parameters()]
    pb, gb, ob = state_bytes(cfg.training, "trainer")
    loop = sum(kn.loglog(costs.adam, n) for n in sizes)
    assert with_loop - with_bandwidth == pytest.approx(loop - sum(sizes) * (gb + 2 * ob + 2 * pb) / hw.memory_bandwidth)


def test_kernels_round_trip_through_a_profile_and_a_malformed_one_is_refused(tmp_path):
    hw = replace(PRESETS["A100-80GB"], name="k", kernels=synthetic_costs(tp_layer_s=1e-3))
    path = tmp_path / "hw.json"
    save_profile(hw, path)
    assert load_profile(path) == hw
    data = json.loads(path.read_text())
    data["kernels"]["adam"] = [[1, -1.0]]
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="kernels is malformed"):
        load_profile(path)
    data["kernels"] = {"linear_fp32": []}
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="kernels is malformed"):
        load_profile(path)


def test_the_inventory_of_a_layer_is_what_torch_runs():
    """The hand count of :func:`distperf.cost.kernels.layer` against a profiled forward of the trainers' Block: its
    linear layers, attention calls and module calls."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from distperf.config import ModelSpec
    from distperf.model import Block, layer_input

    spec = ModelSpec(name="probe", layers=1, hidden=32, heads=4, vocab=16, seq=8)
    block = Block(spec)
    calls = []
    for module in block.modules():
        module.register_forward_pre_hook(lambda *_: calls.append(1))
    x = layer_input(spec, 2)
    with profile(activities=[ProfilerActivity.CPU]) as prof, torch.no_grad():
        block(x)
    names = [e.name for e in prof.events()]
    assert names.count("aten::linear") == 4
    assert sum("scaled_dot_product" in n and "flash" not in n for n in names) == 1
    assert len(calls) == kn.MODULES_PER_LAYER


def test_each_collective_kind_is_timed_with_its_own_fit_on_the_link_it_was_fitted_on():
    from distperf.cost.communication import _link

    base = replace(PRESETS["A100-80GB"], intra_latency=1e-4, intra_bandwidth=1e9)
    fitted = replace(base, collectives=(("all-reduce", 2e-4, 1e9), ("reduce-scatter", 3e-4, 5e8)),
                     collectives_on=(1e-4, 1e9))
    assert fitted.fitted("reduce-scatter", 2) == (3e-4, 5e8)
    assert _link(fitted, "reduce-scatter", 2, "gloo") == (3e-4, 5e8, "nccl")  # the fit's own (ring) terms
    assert _link(fitted, "send", 2, "gloo") == (1e-4, 1e9, "gloo")  # no fit: the link and gloo's algorithms
    assert fitted.fitted("reduce-scatter", 64) is None  # across nodes
    moved = replace(fitted, intra_bandwidth=2e9)  # the intra-node link replaced: the fits no longer apply
    assert moved.fitted("reduce-scatter", 2) is None
    cfg = small_cfg(dp=2, zero=3)
    slower = replace(fitted, collectives=(("all-reduce", 2e-4, 1e9), ("reduce-scatter", 3e-4, 1e8),
                                          ("all-gather", 3e-4, 1e8)))
    assert predict(cfg, slower, backend="gloo")["time_s"]["iteration"] > \
        predict(cfg, fitted, backend="gloo")["time_s"]["iteration"]
    assert predict(cfg, base)["time_s"] == predict(cfg, replace(base, collectives=()))["time_s"]


def test_a_malformed_collectives_row_is_refused(tmp_path):
    hw = replace(PRESETS["A100-80GB"], name="c", collectives=(("all-reduce", 1e-4, 1e9),), collectives_on=(1e-5, 1e9))
    path = tmp_path / "hw.json"
    save_profile(hw, path)
    assert load_profile(path) == hw
    data = json.loads(path.read_text())
    data["collectives"] = [["all-reduce", 0, 1e9]]
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="collectives must be"):
        load_profile(path)
    data["collectives"], data["collectives_on"] = [["all-reduce", 1e-4, 1e9]], None
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="collectives_on must be"):
        load_profile(path)


def test_overlap_hides_only_its_share_of_the_data_parallel_communication():
    cfg = small_cfg(dp=2)
    full = replace(PRESETS["A100-80GB"], intra_latency=1e-4, intra_bandwidth=1e8, kernels=synthetic_costs())
    none = replace(full, kernels=synthetic_costs(overlap=0.0))
    half = replace(full, kernels=synthetic_costs(overlap=0.5))
    exposed = [predict(cfg, hw, bucket_bytes=2**18)["time_s"]["communication_exposed"] for hw in (full, half, none)]
    assert exposed[0] < exposed[1] < exposed[2]
    assert exposed[1] == pytest.approx((exposed[0] + exposed[2]) / 2)


def test_every_microbatch_after_the_first_adds_its_gradients():
    hw = replace(PRESETS["A100-80GB"], kernels=synthetic_costs())
    four = small_cfg(microbatches=4)
    from distperf.cost.predict import rank_spans
    from distperf.cost.stage import accumulate_time, stage_costs

    span = rank_spans(four)[0]
    added = accumulate_time(four.model, four.layout, hw, span)
    assert added > 0 and accumulate_time(four.model, four.layout, PRESETS["A100-80GB"], span) == 0.0
    rank = stage_costs(four.model, four.layout, four.training, hw, (span,), 25 * 2**20)[0]
    assert predict(four, hw)["time_s"]["iteration"] == pytest.approx(4 * rank.microbatch + rank.optimizer + 3 * added)


def test_the_parallel_paths_own_costs():
    hw = replace(PRESETS["A100-80GB"], intra_latency=1e-4, intra_bandwidth=1e8, kernels=synthetic_costs())
    tp = small_cfg(tp=2)
    slower = replace(hw, kernels=synthetic_costs(tp_collective_s=1e-3))
    calls = 4 * tp.model.layers  # two all-reduces forward and two backward per layer
    gained = predict(tp, slower)["time_s"]["iteration"] - predict(tp, hw)["time_s"]["iteration"]
    assert gained == pytest.approx(tp.layout.microbatches * calls * 1e-3, rel=1e-6)
    z3 = small_cfg(dp=2, zero=3)
    hidden = predict(z3, replace(hw, kernels=synthetic_costs(fsdp_overlap=1.0)))["time_s"]["communication_exposed"]
    shown = predict(z3, replace(hw, kernels=synthetic_costs(fsdp_overlap=0.0)))["time_s"]["communication_exposed"]
    assert shown > hidden
    costly = predict(z3, replace(hw, kernels=synthetic_costs(fsdp_overlap=-1.0)))["time_s"]["communication_exposed"]
    assert costly == pytest.approx(2 * shown)  # a path that costs twice its collectives' α-β time, hiding none
    ddp = small_cfg(dp=2)  # FSDP2's overlap is its own: DDP keeps the plain one
    assert predict(ddp, replace(hw, kernels=synthetic_costs(fsdp_overlap=0.0)))["time_s"] == \
        predict(ddp, hw)["time_s"]


def test_path_constants_from_the_probe_times():
    from distperf.measure.path_fits import PATH_UNITS, path_constants

    kernels = synthetic_costs(tp_layer_s=1e-4, fsdp_unit_s=1e-4).to_dict()
    fits = {kind: {"all": {"alpha": 1e-4, "beta": 1e9}} for kind in ("all-reduce", "all-gather", "reduce-scatter")}
    base = path_constants({"tp_layer_s": 0.0, "tp_sp_layer_s": 0.0, "plain_stack_s": 0.01,
                           "fsdp_stack_s": 0.01 + (PATH_UNITS + 1) * 1e-4, "plain_layer_s": 0.0}, kernels, fits, 2)
    assert base["tp_collective_s"] == base["tp_sp_collective_s"] == 0.0 and base["fsdp_overlap"] == 1.0
    slow = path_constants({"tp_layer_s": 1.0, "tp_sp_layer_s": 1.0, "plain_stack_s": 0.01, "fsdp_stack_s": 10.0,
                           "plain_layer_s": 0.0}, kernels, fits, 2)
    assert slow["tp_collective_s"] > 0.2 and slow["tp_sp_collective_s"] > 0.1 and slow["fsdp_overlap"] < -1.0
    unit = path_constants({"tp_layer_s": 0.0, "tp_sp_layer_s": 0.0, "plain_stack_s": 0.01, "fsdp_stack_s": 10.0,
                           "plain_layer_s": 0.0}, kernels, {k: {"all": {"alpha": 1e-4, "beta": 1e12}} for k in fits}, 2)
    assert unit["fsdp_overlap"] == -kn.FSDP_EXPOSURE_MAX  # bounded: a profile cannot make FSDP2 cost without limit


def test_each_pipeline_engine_costs_two_actions_per_microbatch_and_stage():
    hw = replace(PRESETS["A100-80GB"], kernels=synthetic_costs())
    engines = replace(hw, kernels=synthetic_costs(pp_action_s=1e-3, twobw_action_s=3e-3))
    # an interleaved rank holds two stages (chunks), each with the same layers and ends as a 1F1B rank's: priced
    # after 1F1B, its stage costs must not be 1F1B's
    for schedule, action, chunks in (("1f1b", 1e-3, 1), ("gpipe", 1e-3, 1), ("2bw", 3e-3, 1),
                                     ("interleaved", 1e-3, 2)):
        cfg = small_cfg(pp=2, microbatches=4, schedule=schedule, chunks=chunks)
        gained = predict(cfg, engines)["time_s"]["compute"] - predict(cfg, hw)["time_s"]["compute"]
        assert gained == pytest.approx(cfg.layout.microbatches * 2 * chunks * action, rel=1e-6)  # the slowest's
    # the stage costs are cached apart for the two engines: the same layout under 1F1B, then 2BW, then 1F1B again
    one, two = small_cfg(pp=2, microbatches=4, schedule="1f1b"), small_cfg(pp=2, microbatches=4, schedule="2bw")
    first = predict(one, engines)["time_s"]
    assert predict(two, engines)["time_s"]["compute"] > first["compute"] and predict(one, engines)["time_s"] == first
    assert predict(small_cfg(dp=2), engines)["time_s"] == predict(small_cfg(dp=2), hw)["time_s"]  # no pipeline


def test_pipeline_actions_are_the_probes_time_beyond_the_models_other_terms():
    from distperf.measure.path_fits import pipeline_actions

    hw = replace(PRESETS["A100-80GB"], kernels=synthetic_costs())
    none = pipeline_actions({"pp_microbatch_s": 0.0, "twobw_microbatch_s": 0.0}, hw, 2)
    assert none == {"pp_action_s": 0.0, "twobw_action_s": 0.0}  # never negative
    base = {"pp_microbatch_s": 1.0, "twobw_microbatch_s": 1.0}
    more = pipeline_actions({"pp_microbatch_s": 1.004, "twobw_microbatch_s": 1.010}, hw, 2)
    less = pipeline_actions(base, hw, 2)
    assert more["pp_action_s"] - less["pp_action_s"] == pytest.approx(2e-3)
    assert more["twobw_action_s"] - less["twobw_action_s"] == pytest.approx(5e-3)


def test_the_part_of_an_action_inside_communication_is_the_profiled_probe_beyond_the_model():
    """pipeline_waits: the probe's profiled communication per microbatch less what the model prices there, / 2, at
    least 0; action_inside: 2·v·min(wait, action) per microbatch, moving time from framework to communication in the
    predicted breakdown and leaving the step's time alone."""
    from distperf.analysis import time_model as tm
    from distperf.analysis.time_model import predicted_classes
    from distperf.cost.stage import action_inside
    from distperf.measure.path_fits import pipeline_actions, pipeline_waits

    hw = replace(PRESETS["A100-80GB"], kernels=synthetic_costs())
    timed = {"pp_microbatch_s": 1.0, "twobw_microbatch_s": 1.0}
    assert pipeline_waits(timed, hw, 2) == {}  # a calibration before 5 December 2026: the profile's stay
    waits = {"pp_microbatch_wait_s": 0.0, "twobw_microbatch_wait_s": 0.0}
    assert pipeline_waits(waits, hw, 2) == {"pp_action_wait_s": 0.0, "twobw_action_wait_s": 0.0}  # never negative
    less, more = pipeline_waits(dict(timed, pp_microbatch_wait_s=1.0, twobw_microbatch_wait_s=1.0), hw, 2), \
        pipeline_waits(dict(timed, pp_microbatch_wait_s=1.004, twobw_microbatch_wait_s=1.010), hw, 2)
    assert more["pp_action_wait_s"] - less["pp_action_wait_s"] == pytest.approx(2e-3)
    assert more["twobw_action_wait_s"] - less["twobw_action_wait_s"] == pytest.approx(5e-3)
    assert less["pp_action_wait_s"] == pytest.approx(pipeline_actions(timed, hw, 2)["pp_action_s"])  # same model

    def at(wait):
        costs = synthetic_costs(pp_action_s=1e-3, pp_action_wait_s=wait)
        return replace(PRESETS["A100-80GB"], kernels=costs)

    cfg = small_cfg(pp=2, microbatches=4, schedule="interleaved", chunks=2)
    assert action_inside(at(4e-4).kernels, cfg.layout) == pytest.approx(2 * 2 * 4e-4)
    assert action_inside(at(5e-3).kernels, cfg.layout) == pytest.approx(2 * 2 * 1e-3)  # at most the action
    assert action_inside(at(4e-4).kernels, small_cfg(dp=2).layout) == 0.0 and action_inside(None, cfg.layout) == 0.0
    split, whole = predicted_classes(cfg, at(4e-4), pipeline_split=True), predicted_classes(cfg, at(0.0))
    assert predicted_classes(cfg, at(4e-4)) == (split if tm.PIPELINE_SPLIT else whole)  # as the rule decided
    assert split["communication"] - whole["communication"] == pytest.approx(4 * 2 * 2 * 4e-4)
    assert whole["framework"] - split["framework"] == pytest.approx(4 * 2 * 2 * 4e-4)
    assert predict(cfg, at(4e-4))["time_s"] == predict(cfg, at(0.0))["time_s"]


def test_a_size_sweep_stops_before_a_call_longer_than_the_budget(monkeypatch):
    import torch

    from distperf.measure import calibrate
    from distperf.measure import kernels as mk

    assert mk.affordable(0.1, 512, 1024) and not mk.affordable(0.2, 512, 1024)  # 8× the time at twice n

    def fake_time(fn):
        # a call at n = 512 takes 0.2 s in bf16 (a CPU without bf16 units) and 1 ms in fp32, × n³
        tensor = next(c.cell_contents for c in fn.__closure__ if isinstance(c.cell_contents, torch.Tensor))
        per = 0.2 if tensor.dtype == torch.bfloat16 else 1e-3
        return per * (tensor.shape[-1] / 512) ** 3

    monkeypatch.setattr(calibrate, "_timer_median", lambda fn, t: fake_time(fn))
    rows = calibrate.gemm_rates((128, 256, 512, 1024, 2048), [torch.float32, torch.bfloat16])
    assert [r["n"] for r in rows if r["dtype"] == "float32"] == [128, 256, 512, 1024, 2048]
    assert [r["n"] for r in rows if r["dtype"] == "bfloat16"] == [128, 256, 512]  # 1024 would take 1.6 s
    monkeypatch.setattr(mk, "_forward_backward", lambda fn, t, base: (fake_time(fn), 2 * fake_time(fn)))
    # forward and backward at 512 take 0.6 s in bf16, so 1024 would take 4.8 s
    assert [r[0] for r in mk.linear_times((128, 256, 512, 1024), torch.bfloat16)] == [128, 256, 512]
    assert [r[0] for r in mk.linear_times((128, 256, 512, 1024), torch.float32)] == [128, 256, 512, 1024]


def test_recomputation_constants_are_the_checkpointed_steps_beyond_the_plain_one_and_at_least_0(monkeypatch):
    """The formula of :func:`measure.kernels.recompute_times`, on scripted times (no timing): the checkpointed step
    less the plain step less the forward (or core) it repeats, clamped at 0 where noise makes it negative."""
    import torch.distributed.tensor.parallel as tp

    from distperf.config import ModelSpec
    from distperf.measure import kernels as measured
    from distperf.model import layer_input

    # forward, core, then (plain, full, selective) step for plain, tensor- and sequence-parallel layers
    times = iter([1.0, 0.5, 3.0, 5.0, 3.2, 4.0, 7.5, 4.0, 4.0, 4.5, 6.0])
    monkeypatch.setattr(measured, "median_time", lambda fn, min_run_time: next(times))
    monkeypatch.setattr(tp, "parallelize_module", lambda module, mesh, plan: module)
    spec = ModelSpec(**measured.PROBE)
    out = measured.recompute_times(spec, layer_input(spec, 1), None, 0.1)
    assert out == {"recompute_layer_s": 1.0, "recompute_core_s": 0.0, "tp_recompute_layer_s": 2.5,
                   "tp_recompute_core_s": 0.0, "tp_sp_recompute_layer_s": 0.0, "tp_sp_recompute_core_s": 1.5}
    assert set(out) == set(kn.RECOMPUTE_WRAPPERS) and next(times, None) is None


def test_ddp_slopes_are_the_extra_times_slopes_over_tensors_and_bytes_and_at_least_0(monkeypatch):
    """The formula of :func:`measure.kernels.ddp_slopes`, on scripted times (no timing): DDP's extra (wrapped − plain)
    over 1 and 64 tiny tensors per tensor, over one tensor of 1 and of 16 MiB per byte, clamped at 0."""
    import torch.nn.parallel

    from distperf.measure import kernels as measured

    # (wrapped, plain) for 1 tensor, 64 tensors, 1 MiB, 16 MiB
    times = iter([3e-4, 1e-4, 4.41e-4, 1e-4, 5e-4, 1e-4, 2.0e-3, 1e-4])
    monkeypatch.setattr(measured, "median_time", lambda fn, min_run_time: next(times))
    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", lambda module, process_group: module)
    out = measured.ddp_slopes(None, 0.1)
    assert out["ddp_tensor_s"] == pytest.approx((3.41e-4 - 2e-4) / 63)
    assert out["ddp_byte_s"] == pytest.approx((1.9e-3 - 4e-4) / (15 << 20))
    assert next(times, None) is None
    times = iter([3e-4, 1e-4, 1e-4, 1e-4, 5e-4, 1e-4, 2e-4, 1e-4])  # noise: fewer seconds with more
    assert measured.ddp_slopes(None, 0.1) == {"ddp_tensor_s": 0.0, "ddp_byte_s": 0.0}


def test_the_ddp_probe_block_has_the_tensors_the_cost_model_subtracts():
    from distperf.config import ModelSpec
    from distperf.measure import kernels as measured
    from distperf.model import Block

    assert len(list(Block(ModelSpec(**measured.PROBE)).parameters())) == kn.DDP_PROBE_TENSORS


def test_ddp_costs_its_step_and_its_slopes_beyond_the_probe_and_only_under_ddp():
    from distperf.cost.predict import rank_spans
    from distperf.cost.stage import ddp_time, rank_tensors

    costs = synthetic_costs(ddp_step_s=1e-4, ddp_tensor_s=2e-6, ddp_byte_s=1e-10)
    cfg = small_cfg(dp=2)
    span = rank_spans(cfg)[0]
    tensors = rank_tensors(cfg.model, cfg.layout, span)
    count, elements = sum(c for c, _, _ in tensors), sum(c * n for c, _, n in tensors)
    assert count > kn.DDP_PROBE_TENSORS and 4 * elements > 1 << 20  # the small model's 3 MiB of gradients
    expected = 1e-4 + 2e-6 * (count - kn.DDP_PROBE_TENSORS) + 1e-10 * 4 * elements
    assert ddp_time(costs, cfg.layout, tensors, 4) == pytest.approx(expected)
    hw = replace(PRESETS["A100-80GB"], kernels=synthetic_costs(ddp_step_s=1e-4))
    sloped = replace(hw, kernels=costs)
    gained = predict(cfg, sloped)["time_s"]["iteration"] - predict(cfg, hw)["time_s"]["iteration"]
    assert gained == pytest.approx(expected - 1e-4, rel=1e-6)
    for other in (small_cfg(), small_cfg(dp=2, zero=2), small_cfg(tp=2)):  # no DDP: the slopes cost nothing
        assert predict(other, sloped)["time_s"] == predict(other, hw)["time_s"]
