"""Hybrid layouts on a pp × dp × tp DeviceMesh equal the single-device run: DP × PP (4 ranks),
DP × TP (4 ranks, with DDP and with ZeRO-3) and DP × TP × PP (8 ranks, DDP and ZeRO-2)."""
from __future__ import annotations

import pytest

from dist_harness import check_against_reference, spawn
from distperf.config import Layout

CASES = {
    "dp2-pp2-1f1b": Layout(dp=2, pp=2, schedule="1f1b", micro_batch=1, microbatches=2),
    "dp2-pp2-gpipe-zero3": Layout(dp=2, pp=2, schedule="gpipe", micro_batch=1, microbatches=2, zero=3),
    "dp2-tp2": Layout(dp=2, tp=2, micro_batch=1, microbatches=2),
    "dp2-tp2-sp-zero3": Layout(dp=2, tp=2, micro_batch=2, sequence_parallel=True, zero=3),
    "tp2-pp2-sp-gpipe": Layout(tp=2, pp=2, schedule="gpipe", micro_batch=2, microbatches=2, sequence_parallel=True),
    "dp2-tp2-pp2-1f1b": Layout(dp=2, tp=2, pp=2, schedule="1f1b", micro_batch=1, microbatches=2),
    "dp2-tp2-pp2-zero2": Layout(dp=2, tp=2, pp=2, schedule="1f1b", micro_batch=1, microbatches=2, zero=2),
}


@pytest.mark.parametrize("name", CASES)
def test_hybrid_equals_single_device(name):
    check_against_reference(CASES[name])


def _coordinates(pp, dp, tp):
    from distperf.config import Layout
    from distperf.parallel.mesh import build_mesh, coordinates, init_distributed

    device = init_distributed("cpu", 60)
    return coordinates(build_mesh(Layout(pp=pp, dp=dp, tp=tp, schedule="1f1b" if pp > 1 else "none"), device))


def test_mesh_puts_tp_innermost_then_dp_then_pp():
    coords = spawn(_coordinates, 8, 2, 2, 2)
    assert [(c["pp"], c["dp"], c["tp"]) for c in coords] == [
        (p, d, t) for p in range(2) for d in range(2) for t in range(2)]
