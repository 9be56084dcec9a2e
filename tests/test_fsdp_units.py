"""FSDP2's units priced by their size, the book's what-if since the term left the model: the ``fsdp_units`` table, how
the cost model adds it where a what-if sets it, that no profile sets it, how it is derived from the calibration's
probe, and the probe itself on two real gloo ranks."""
from __future__ import annotations

from dataclasses import replace

import pytest

from distperf.config import Layout, Training
from distperf.cost import kernels as kn
from distperf.cost import predict
from distperf.cost.communication import data_parallel
from distperf.cost.predict import rank_spans
from distperf.cost.stage import Compute, Span, model_states
from distperf.hardware import PRESETS
from distperf.measure.path_fits import fsdp_unit_probe_spec, fsdp_unit_table, with_fsdp_units
from test_kernels import small_cfg, synthetic_costs

TABLE = ((1_000_000, 3, 0.001, 0.002), (3_000_000, 3, 0.005, 0.004), (1_000_000, 2, 0.0005, 0.0))


def test_a_unit_is_priced_between_the_rows_of_its_stage_and_in_proportion_beyond_them():
    costs = synthetic_costs(fsdp_units=TABLE)
    assert kn.fsdp_unit_extra(costs, 3, 1_000_000) == pytest.approx((0.001, 0.002))
    assert kn.fsdp_unit_extra(costs, 3, 2_000_000) == pytest.approx((0.003, 0.003))  # half way
    assert kn.fsdp_unit_extra(costs, 3, 500_000) == pytest.approx((0.0005, 0.001))  # below: proportional
    assert kn.fsdp_unit_extra(costs, 3, 6_000_000) == pytest.approx((0.010, 0.008))  # above: proportional
    assert kn.fsdp_unit_extra(costs, 2, 2_000_000) == pytest.approx((0.001, 0.0))  # one row: proportional
    assert kn.fsdp_unit_extra(synthetic_costs(), 3, 2_000_000) == (0.0, 0.0)


def test_no_profile_carries_the_table_and_it_scales_with_the_machine_and_leaves_with_the_framework():
    costs = synthetic_costs(fsdp_units=TABLE)
    assert "fsdp_units" not in costs.to_dict()
    carried = {**costs.to_dict(), "fsdp_units": [[1_000_000, 3, 0.001, 0.002]]}  # as the profiles of 5 December
    assert kn.KernelCosts.from_dict(carried) == synthetic_costs()
    assert costs.without("framework").fsdp_units == ()
    slower = costs.at_speed({"gemm": 1.0, "elementwise": 2.0, "python": 1.0})
    assert [row[2:] for row in slower.fsdp_units] == [(2 * mb, 2 * st) for _, _, mb, st in TABLE]


@pytest.mark.parametrize("zero", [2, 3])
def test_each_microbatch_pays_the_units_gathers_and_the_step_their_reduction(zero):
    bare = replace(PRESETS["A100-80GB"], kernels=synthetic_costs())
    table = tuple((n, zero, mb, st) for n, _, mb, st in TABLE[:2])
    priced = replace(bare, kernels=synthetic_costs(fsdp_units=table))
    cfg = small_cfg(dp=2, zero=zero, microbatches=4)
    units = model_states(cfg.model, cfg.layout, cfg.training, rank_spans(cfg)[0]).units
    per_microbatch = sum(count * kn.fsdp_unit_extra(priced.kernels, zero, 2 * shard)[0] for count, shard in units)
    per_step = sum(count * kn.fsdp_unit_extra(priced.kernels, zero, 2 * shard)[1] for count, shard in units)
    assert per_microbatch > 0 and per_step > 0
    with_units, without = predict(cfg, priced)["time_s"], predict(cfg, bare)["time_s"]
    added = 4 * per_microbatch + per_step
    assert with_units["iteration"] - without["iteration"] == pytest.approx(added)
    assert with_units["compute"] - without["compute"] == pytest.approx(added)
    assert with_units["communication_exposed"] == pytest.approx(without["communication_exposed"])
    # nothing else is priced by it: data parallel without sharding, one replica, the paper's convention
    for other in (small_cfg(dp=2, zero=0, microbatches=4), small_cfg(zero=3, microbatches=4)):
        assert predict(other, priced)["time_s"] == predict(other, bare)["time_s"]
    assert predict(cfg, priced, convention="paper")["time_s"] == predict(cfg, bare, convention="paper")["time_s"]


def test_the_breakdown_files_the_units_under_other_operators():
    from distperf.analysis.time_model import fsdp_units_time, predicted_classes

    bare = replace(PRESETS["A100-80GB"], kernels=synthetic_costs())
    priced = replace(bare, kernels=synthetic_costs(fsdp_units=TABLE))
    cfg = small_cfg(dp=2, zero=3, microbatches=2)
    added = fsdp_units_time(cfg, priced, rank_spans(cfg)[0])
    assert added > 0 and fsdp_units_time(cfg, bare, rank_spans(cfg)[0]) == 0.0
    with_units, without = predicted_classes(cfg, priced), predicted_classes(cfg, bare)
    assert with_units["other_operators"] - without["other_operators"] == pytest.approx(added)
    assert with_units["optimizer"] == pytest.approx(without["optimizer"])


def test_the_table_is_what_the_probe_measured_beyond_what_the_model_prices():
    hw = replace(PRESETS["A100-80GB"], kernels=synthetic_costs(fsdp_unit_s=0.001, fsdp_overlap=-0.5))
    rows = [{"hidden": 384, "zero": 3, "plain_s": 0.010, "nosync_s": 0.030, "sync_s": 0.050},
            {"hidden": 384, "zero": 2, "plain_s": 0.010, "nosync_s": 0.010, "sync_s": 0.010}]
    table = fsdp_unit_table(rows, hw, 2)
    spec, training = fsdp_unit_probe_spec(384), Training()
    lay = Layout(dp=2, zero=3)
    states = model_states(spec, lay, training, Span(1, False, False))
    priced = data_parallel(spec, lay, training, hw, states, Compute(0.010 / 3, 0.020 / 3), 0.0, backend="gloo")
    assert priced.exposed_microbatch > 0 and priced.exposed_step > 0
    elements, zero, microbatch, step = table[0]
    assert (elements, zero) == (2 * states.units[0][1], 3) and elements >= 12 * 384**2
    assert microbatch == pytest.approx(0.020 - priced.exposed_microbatch - 0.001)
    assert step == pytest.approx(0.020 - priced.exposed_step)
    assert table[1][2:] == (0.0, 0.0)  # a probe faster than the model's price adds nothing
    assert with_fsdp_units(hw, [], 2) is hw
    assert with_fsdp_units(hw, rows, 2).kernels.fsdp_units == table


def test_the_probe_times_a_layer_plain_and_sharded_with_and_without_synchronization():
    from distperf.measure.fsdp_overhead import fsdp_unit_times

    found = fsdp_unit_times(2, (32,), reps=1, timeout=120)
    assert [(row["hidden"], row["zero"]) for row in found["rows"]] == [(32, 2), (32, 3)]
    assert all(row[k] > 0 for row in found["rows"] for k in ("plain_s", "nosync_s", "sync_s"))
    assert found["reps"] == 1 and "pinned" in found["placement"]


def test_the_units_command_refuses_no_rounds(capsys, tmp_path):
    from distperf.measure.fsdp_overhead import main

    out = tmp_path / "units.json"
    assert main(["--units", str(out), "--rounds", "0"]) == 2
    assert "rounds: must be a whole number of at least 1" in capsys.readouterr().err and not out.exists()


def test_the_rule_sentence_prices_the_sharded_runs_with_and_without_the_calibrations_table():
    import pandas as pd

    from distperf.analysis import time_model as tm
    from test_analysis_time_model import HW, row

    # measured a third slower than the model prices them, whose profiled mode prices them 15 % too low
    found = {"dp_zero": pd.DataFrame([row("small", 1.3, 0.85, dp=2, zero=3), row("small", 1.3, 0.85, dp=2, zero=2),
                                      row("small", 1.0, 1.0, dp=2)])}
    assert tm.fsdp_units_rule_sentence(found, HW, None).startswith("this calibration did not run the FSDP2 unit probe")
    assert "ZeRO-3 run of small (analytical / profiled) -23.1%" in tm.fsdp_units_rule_sentence(found, HW, None)
    rows = [{"hidden": 384, "zero": zero, "plain_s": 0.01, "nosync_s": 0.02, "sync_s": 0.03} for zero in (2, 3)]
    side = {"ranks": 2, "conditions": {"fsdp_units": {"rows": rows}}}
    assert with_fsdp_units(HW, rows, 2).kernels.fsdp_units  # the table prices something on HW
    text = tm.fsdp_units_rule_sentence(found, HW, side)
    assert "over the 2 held-out sharded configurations" in text and "The table would stand" in text
    assert "without it (the model): median signed error analytical -23.1%" in text
    # measured faster than the model without the table prices them: the table moves them away from zero
    fast = {"dp_zero": pd.DataFrame([row("small", 0.9, 1.1, dp=2, zero=3), row("small", 0.9, 1.1, dp=2, zero=2)])}
    assert "does not stand" in tm.fsdp_units_rule_sentence(fast, HW, side)
    assert tm.fsdp_units_rule_sentence({"dp_zero": pd.DataFrame([row("small", 1.0, 1.0, dp=2)])}, HW, side) == \
        "no held-out run sharded its model with FSDP2"
