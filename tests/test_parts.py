"""The profiled mode's part times (distperf.measure.parts) and how the cost model composes them."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from distperf import presets
from distperf.config import Config, Layout, validate
from distperf.cost import predict
from distperf.cost.parameters import layer_tensors
from distperf.hardware import PRESETS
from distperf.measure.parts import ShardedLayer, _optimizer_tensors, rank_part_times

from test_kernels import synthetic_costs

SPEC = presets.model("tiny")


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("sp", [False, True])
def test_a_sharded_layer_holds_the_ranks_tensors_and_keeps_its_positions(tp, sp):
    layer = ShardedLayer(SPEC, tp, sp)
    held = sorted(p.numel() for p in layer.parameters())
    assert held == sorted(numel for _, numel in layer_tensors(SPEC.hidden, SPEC.ffn, tp))
    positions = SPEC.seq // tp if sp and tp > 1 else SPEC.seq
    x = torch.randn(2, positions, SPEC.hidden, requires_grad=True)
    y = layer(x)
    assert y.shape == x.shape
    y.sum().backward()
    assert all(p.grad is not None for p in layer.parameters())


def test_a_sharded_layer_at_one_rank_is_the_plain_layer():
    from distperf.model import Block

    torch.manual_seed(0)
    plain = Block(SPEC)
    torch.manual_seed(0)
    layer = ShardedLayer(SPEC, 1, True)
    x = torch.randn(1, SPEC.seq, SPEC.hidden)
    assert torch.equal(layer(x), plain(x))


def test_the_optimizer_groups_are_the_ranks_tensors_cut_in_shards():
    whole = _optimizer_tensors(SPEC, 1, 1, True)
    assert sum(whole["layer_s"]) == sum(n for _, n in layer_tensors(SPEC.hidden, SPEC.ffn, 1))
    assert whole["first_s"] == [SPEC.vocab * SPEC.hidden, SPEC.seq * SPEC.hidden]
    assert whole["last_s"] == [SPEC.hidden, SPEC.hidden, SPEC.vocab * SPEC.hidden]
    assert _optimizer_tensors(SPEC, 1, 1, False)["last_s"] == [SPEC.hidden, SPEC.hidden]  # tied, one stage
    halves = _optimizer_tensors(SPEC, 2, 2, True)
    assert halves["layer_s"] == [-(-n // 2) for _, n in layer_tensors(SPEC.hidden, SPEC.ffn, 2)]


def test_one_rank_times_every_part():
    cfg = validate(Config(model=SPEC, layout=Layout(micro_batch=2)))
    times = rank_part_times(cfg, torch.device("cpu"), distributed=False)
    for part in ("layer", "embedding", "head"):
        f, b = times[part]
        assert f > 0 and b >= 0
    assert set(times["optimizer"]) == {"layer_s", "first_s", "last_s"} and min(times["optimizer"].values()) > 0


def _times(layer=(1e-3, 2e-3), embedding=(1e-4, 2e-4), head=(3e-4, 6e-4), optimizer=(1e-4, 2e-5, 3e-5), at_once=True):
    out = {"layer": layer, "embedding": embedding, "head": head}
    if at_once:
        out.update(ranks_at_once=2, optimizer=dict(zip(("layer_s", "first_s", "last_s"), optimizer)))
    return out


def test_parts_measured_at_once_are_the_ranks_own_share_and_already_contended():
    hw = replace(PRESETS["A100-80GB"], kernels=synthetic_costs(contention_compute=3.0))
    tp = validate(Config(model=SPEC, layout=Layout(tp=2, micro_batch=1)))
    layers = SPEC.layers
    plain = predict(tp, replace(hw, kernels=None), check=False, layer_times=_times())["time_s"]["compute"]
    one = predict(tp, replace(hw, kernels=None), check=False, layer_times=_times(at_once=False))["time_s"]["compute"]
    assert plain - one == pytest.approx(layers * 3e-3 / 2)  # the rank's own layer, not one process's whole one / t
    contended = predict(tp, hw, check=False, layer_times=_times(at_once=False))["time_s"]["compute"]
    measured = predict(tp, hw, check=False, layer_times=_times())["time_s"]["compute"]
    assert contended > measured  # only one process's times are multiplied by the contention factor


def test_the_measured_optimizer_step_is_composed_per_layer_and_end():
    hw = replace(PRESETS["A100-80GB"], kernels=synthetic_costs())
    one = validate(Config(model=SPEC, layout=Layout(micro_batch=1)))
    base = predict(one, hw, check=False, layer_times=_times())["time_s"]["iteration"]
    slower = predict(one, hw, check=False, layer_times=_times(optimizer=(2e-4, 3e-5, 5e-5)))["time_s"]["iteration"]
    assert slower - base == pytest.approx(SPEC.layers * 1e-4 + 1e-5 + 2e-5)
    zero1 = validate(Config(model=SPEC, layout=Layout(dp=2, zero=1, micro_batch=1)))
    base = predict(zero1, hw, check=False, layer_times=_times())["time_s"]["iteration"]
    slower = predict(zero1, hw, check=False, layer_times=_times(optimizer=(2e-4, 3e-5, 5e-5)))["time_s"]["iteration"]
    assert 0 < slower - base < SPEC.layers * 1e-4 + 1e-5 + 2e-5  # ZeRO-1 updates its share of whole tensors


def test_the_analysis_reads_the_parts_a_run_measured():
    import pandas as pd

    from distperf.analysis.time_model import LAYER_TIMES, profiled_prediction

    cfg = validate(Config(model=SPEC, layout=Layout(dp=2, zero=3, micro_batch=1)))
    hw = replace(PRESETS["A100-80GB"], kernels=synthetic_costs())
    times = _times()
    row = {f"config.{k}": v for k, v in pd.json_normalize(cfg.to_dict()).iloc[0].items()}
    for part in ("layer", "embedding", "head"):
        row[f"{LAYER_TIMES}{part}.forward_s"], row[f"{LAYER_TIMES}{part}.backward_s"] = times[part]
    row[f"{LAYER_TIMES}ranks_at_once"] = 2
    for group, seconds in times["optimizer"].items():
        row[f"{LAYER_TIMES}optimizer.{group}"] = seconds
    expected = predict(cfg, hw, check=False, layer_times=times)["time_s"]["iteration"]
    assert profiled_prediction(pd.Series(row), hw) == pytest.approx(expected)
    del row[f"{LAYER_TIMES}ranks_at_once"]  # one process's layer times: composed the older way, a different answer
    assert profiled_prediction(pd.Series(row), hw) != pytest.approx(expected)


def test_the_analysis_prices_a_run_at_the_bucket_it_used():
    import pandas as pd

    from distperf.analysis.time_model import LAYER_TIMES, profiled_prediction

    cfg = validate(Config(model=SPEC, layout=Layout(dp=2, micro_batch=1)))
    hw = replace(PRESETS["A100-80GB"], kernels=synthetic_costs())
    times = {part: pair for part, pair in _times().items() if part in ("layer", "embedding", "head")}
    row = {f"config.{k}": v for k, v in pd.json_normalize(cfg.to_dict()).iloc[0].items()}
    for part in ("layer", "embedding", "head"):
        row[f"{LAYER_TIMES}{part}.forward_s"], row[f"{LAYER_TIMES}{part}.backward_s"] = times[part]
    default = predict(cfg, hw, check=False, layer_times=times)["time_s"]["iteration"]
    assert profiled_prediction(pd.Series(row), hw) == pytest.approx(default)
    row["options.bucket_mb"] = 0.001
    small = predict(cfg, hw, 0.001 * 2**20, check=False, layer_times=times)["time_s"]["iteration"]
    assert profiled_prediction(pd.Series(row), hw) == pytest.approx(small) != pytest.approx(default)


def test_the_profiled_mode_adds_recomputations_checkpoint_to_the_parts_measured_without_it():
    # the parts are timed without checkpoint: the recomputed forward comes from the layer's measured forward, the
    # checkpoint's own cost from the profile's constant, per recomputed layer and microbatch
    hw = replace(PRESETS["A100-80GB"], kernels=synthetic_costs())
    full = validate(Config(model=SPEC, layout=Layout(micro_batch=1, microbatches=2, recompute="full")))
    base = predict(full, hw, check=False, layer_times=_times())["time_s"]["compute"]
    costly = replace(hw, kernels=replace(hw.kernels, recompute_layer_s=1e-3))
    gained = predict(full, costly, check=False, layer_times=_times())["time_s"]["compute"] - base
    assert gained == pytest.approx(2 * SPEC.layers * 1e-3)
    plain = validate(Config(model=SPEC, layout=Layout(micro_batch=1, microbatches=2)))
    assert base - predict(plain, hw, check=False, layer_times=_times())["time_s"]["compute"] == pytest.approx(
        2 * SPEC.layers * 1e-3)  # the repeated forward: the measured layer's 1 ms, twice
