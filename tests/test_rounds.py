"""When the calibration's noisy probes have been repeated enough (distperf.measure.rounds)."""
from __future__ import annotations

import pytest

from distperf.cost.collectives import ring_terms
from distperf.measure import rounds as rd


def issued(alpha: float, beta: float, outlier: float = 0.0) -> list[dict]:
    rows = []
    for nbytes in (4, 1024, 65536, 1048576):
        steps, volume = ring_terms("all-reduce", 2, nbytes)
        rows.append({"collective": "all-reduce", "ranks": 2, "bytes": nbytes,
                     "seconds": steps * alpha + volume / beta + (outlier if nbytes < 65536 else 0.0)})
    return rows


def test_median_rows_take_each_points_median_over_the_rounds():
    rows = rd.median_rows([issued(1e-4, 1e9), issued(1e-4, 1e9, outlier=3e-3), issued(1e-4, 1e9, outlier=1e-5)])
    assert [r["bytes"] for r in rows] == [4, 1024, 65536, 1048576]
    assert rows[0]["seconds"] == pytest.approx(issued(1e-4, 1e9, outlier=1e-5)[0]["seconds"])  # not the 3 ms one


def test_an_outlier_round_moves_the_watched_alpha_and_a_quiet_one_does_not():
    paths = [{"tp_layer_s": 0.03}] * 3
    quiet = rd.moves([issued(1e-4, 1e9)] * 3, paths)
    assert quiet["all-reduce alpha"] == pytest.approx(0.0, abs=1e-9) and quiet["tp_layer_s"] == 0.0
    loud = rd.moves([issued(1e-4, 1e9), issued(1e-4, 1e9, outlier=3e-3)], paths[:2])
    assert loud["all-reduce alpha"] > rd.SETTLED and rd.settled(quiet) and not rd.settled(loud)


def test_rounds_go_on_until_settled_within_the_least_the_most_and_the_budget():
    loud, quiet = {"x": rd.SETTLED * 2}, {"x": rd.SETTLED / 2}
    assert rd.another_round(1, 0.0, {}) and rd.another_round(rd.ROUNDS_MIN - 1, 1e9, quiet)  # below the least
    assert rd.another_round(rd.ROUNDS_MIN, 10.0, loud) and not rd.another_round(rd.ROUNDS_MIN, 10.0, quiet)
    assert not rd.another_round(rd.ROUNDS_MAX, 10.0, loud)
    assert not rd.another_round(rd.ROUNDS_MIN, rd.ROUNDS_BUDGET_S + 1, loud)
    assert not rd.another_round(1, 0.0, {}, least=1, most=1)  # a quick calibration: one round


def test_a_path_median_that_moves_is_watched():
    moved = rd.moves([], [{"tp_layer_s": 0.02}, {"tp_layer_s": 0.04}, {"tp_layer_s": 0.05}])
    assert moved == {"tp_layer_s": pytest.approx(0.04 / 0.03 - 1)}  # median 0.03 of two rounds, then 0.04


def test_a_profile_is_recomputed_from_the_rounds_a_rule_chooses():
    from dataclasses import replace

    from distperf.hardware import PRESETS
    from distperf.measure.path_fits import path_constants

    from test_kernels import synthetic_costs

    hw = replace(PRESETS["A100-80GB"], kernels=synthetic_costs(),
                 collectives=(("all-gather", 4e-4, 1e9), ("all-reduce", 5e-4, 1e9), ("reduce-scatter", 6e-4, 1e9),
                              ("send", 2e-4, 2e9)))
    paths = [{"plain_layer_s": 0.01, "tp_layer_s": x, "tp_sp_layer_s": 0.03, "plain_stack_s": 0.02,
              "fsdp_stack_s": 0.05} for x in (0.03, 0.05, 0.04)]
    side = {"ranks": 2, "conditions": {
        "issued_rounds": [issued(a, 1e9) for a in (1e-4, 9e-4, 3e-4)], "path_rounds": paths,
        "contention_rounds": [{"memory": 1.4, "compute": 1.1}, {"memory": 1.2, "compute": 1.3}, None]}}
    first = rd.profile_from_rounds(hw, side, slice(0, 1), slice(0, 1), slice(0, 1))
    assert dict((k, a) for k, a, _ in first.collectives)["all-reduce"] == pytest.approx(1e-4, rel=1e-6)
    assert dict((k, a) for k, a, _ in first.collectives)["send"] == 2e-4  # no send measured: the profile's stays
    assert (first.kernels.contention_memory, first.kernels.contention_compute) == (1.4, 1.1)
    every = rd.profile_from_rounds(hw, side)
    assert dict((k, a) for k, a, _ in every.collectives)["all-reduce"] == pytest.approx(3e-4, rel=1e-6)  # median
    assert (every.kernels.contention_memory, every.kernels.contention_compute) == (1.2, 1.1)  # least of each
    fits = {k: {"all": {"alpha": a, "beta": b}} for k, a, b in every.collectives}
    expected = path_constants({**paths[0], "tp_layer_s": 0.04}, hw.kernels.to_dict(), fits, 2)
    assert every.kernels.tp_collective_s == pytest.approx(expected["tp_collective_s"])
    assert first.kernels.tp_collective_s < every.kernels.tp_collective_s  # 0.03 s against the median 0.04 s
    with pytest.raises(ValueError, match="no rounds"):
        rd.profile_from_rounds(hw, {"conditions": {}})


def test_the_tensor_parallel_path_is_fitted_on_the_tiny_presets_steps():
    from dataclasses import replace

    from distperf import presets
    from distperf.config import Config, Layout
    from distperf.cost import predict
    from distperf.hardware import PRESETS
    from distperf.measure.path_fits import PER_BYTE, TP_FIT_BATCHES, tensor_parallel_paths, with_path_constants

    from test_kernels import synthetic_costs

    true = dict(tp_collective_s=3e-4, tp_collective_byte_s=2e-9, tp_sp_collective_s=5e-5, tp_sp_collective_byte_s=0.0)
    hw = replace(PRESETS["A100-80GB"], kernels=synthetic_costs(**true))

    def step(b, sp):  # what the trainer would measure if DTensor cost the constants above
        cfg = Config(model=presets.model("tiny"), layout=Layout(tp=2, micro_batch=b, sequence_parallel=sp))
        return predict(cfg, hw, backend="gloo")["time_s"]["iteration"]

    paths = {f"{'tp_sp' if sp else 'tp'}_b{b}_step_s": step(b, sp) for sp in (False, True) for b in TP_FIT_BATCHES}
    bare = replace(hw, kernels=replace(hw.kernels, **dict.fromkeys(true, 0.0)))
    found = tensor_parallel_paths(paths, bare, 2, per_byte=True)
    assert found == pytest.approx(true, rel=1e-6, abs=1e-15)
    # the per-call constant alone (the rule until 5 December 2026): the median over the steps of residual / calls,
    # which the per-byte cost of the larger messages pushes above the true per-call cost
    alone = tensor_parallel_paths(paths, bare, 2)  # the calibration's rule since the tie-break build (PER_BYTE)
    assert not PER_BYTE and alone == tensor_parallel_paths(paths, bare, 2, per_byte=False)
    assert alone["tp_collective_byte_s"] == alone["tp_sp_collective_byte_s"] == 0.0
    assert alone["tp_collective_s"] > 3e-4 and alone["tp_sp_collective_s"] == pytest.approx(5e-5, rel=1e-6)
    # a calibration that stepped at micro-batches 1, 2 and 4 only (messages of 2 to 8 KiB): no per-byte term
    early = {f"tp_b{b}_step_s": step(b, False) for b in (1, 2, 4)}
    assert tensor_parallel_paths(early, bare, 2, per_byte=True)["tp_collective_byte_s"] == 0.0
    faster = {k: v * 0.1 for k, v in paths.items()}  # steps faster than the model without DTensor's cost: 0, not less
    assert tensor_parallel_paths(faster, bare, 2, per_byte=True) == dict.fromkeys(true, 0.0)
    assert tensor_parallel_paths({}, bare, 2) == {}  # not measured: the profile's stay
    issued = tuple((kind, 1e-4, 1e9) for kind in ("all-gather", "all-reduce", "reduce-scatter", "send"))
    skew = ((2, 0.01, 0.001),)  # a what-if's waits, which no profile's JSON carries, stay
    kept = with_path_constants(replace(hw, collectives=issued, kernels=replace(hw.kernels, skew=skew)),
                               {"plain_stack_s": 0.02, "fsdp_stack_s": 0.05}, 2).kernels
    assert (kept.tp_collective_s, kept.tp_sp_collective_s, kept.skew) == (3e-4, 5e-5, skew)


def test_the_part_of_dtensors_cost_inside_its_collectives_is_recovered_from_profiled_steps():
    """tensor_parallel_waits: profiled steps whose communication is the collectives' α-β time plus w per collective
    give back w; steps that saw less communication than α-β give 0; steps not profiled keep the profile's."""
    from dataclasses import replace

    from distperf.hardware import PRESETS
    from distperf.measure.path_fits import TP_FIT_BATCHES, step_prediction, step_terms, tensor_parallel_waits

    from test_kernels import synthetic_costs

    hw = replace(PRESETS["A100-80GB"], kernels=synthetic_costs(tp_collective_s=3e-4, tp_sp_collective_s=5e-4))
    true = {"tp": 1e-4, "tp_sp": 2e-4}
    paths = {}
    for sp, prefix in ((False, "tp"), (True, "tp_sp")):
        for b in TP_FIT_BATCHES:
            alpha_beta = step_prediction("tiny", b, sp, hw, 2, 0.0, 0.0)["communication_exposed"]
            calls = step_terms("tiny", b, sp, hw, 2)[1]
            paths[f"{prefix}_b{b}_step_s"] = 1.0
            paths[f"{prefix}_b{b}_wait_s"] = alpha_beta + calls * true[prefix]
    found = tensor_parallel_waits(paths, hw, 2)
    assert found == pytest.approx({"tp_collective_wait_s": 1e-4, "tp_sp_collective_wait_s": 2e-4}, rel=1e-6)
    less = {k: v * 1e-3 if k.endswith("_wait_s") else v for k, v in paths.items()}
    assert tensor_parallel_waits(less, hw, 2) == {"tp_collective_wait_s": 0.0, "tp_sp_collective_wait_s": 0.0}
    timed_only = {k: v for k, v in paths.items() if k.endswith("_step_s")}  # a calibration before 5 December 2026
    assert tensor_parallel_waits(timed_only, hw, 2) == {}


def test_the_all_reduce_at_ddps_bucket_enters_the_fit_only_by_the_rule():
    from dataclasses import replace

    from distperf.hardware import PRESETS

    from test_kernels import synthetic_costs

    bucket = rd.ISSUED_LARGEST["all-reduce"]
    steps, volume = ring_terms("all-reduce", 2, bucket)
    slow = {"collective": "all-reduce", "ranks": 2, "bytes": bucket, "seconds": steps * 1e-4 + volume / 2e8}
    rows = issued(1e-4, 1e9) + [slow]
    assert rd.fitted_rows(rows, bucket=False) == rows[:-1] and rd.fitted_rows(rows, bucket=True) == rows
    assert rd.fitted_rows(rows) == (rows if rd.BUCKET_IN_FIT else rows[:-1])
    hw = replace(PRESETS["A100-80GB"], kernels=synthetic_costs(), collectives=tuple((kind, 5e-4, 1e9) for kind in (
        "all-gather", "all-reduce", "reduce-scatter", "send")))
    paths = [{"plain_layer_s": 0.01, "tp_layer_s": 0.03, "tp_sp_layer_s": 0.03, "plain_stack_s": 0.02,
              "fsdp_stack_s": 0.05}] * 3
    side = {"ranks": 2, "conditions": {"issued_rounds": [rows] * 3, "path_rounds": paths,
                                       "contention_rounds": [{"memory": 1.0, "compute": 1.0}] * 3}}
    beta = {bucket: dict((k, b) for k, _, b in rd.profile_from_rounds(hw, side, bucket=bucket).collectives)
            ["all-reduce"] for bucket in (False, True)}
    assert beta[False] == pytest.approx(1e9, rel=1e-6) and beta[True] < 0.9e9  # the slow bucket pulls β down
    assert rd.watched([rows] * 2, [])["all-reduce beta"] == pytest.approx(beta[rd.BUCKET_IN_FIT])
