"""``--mesh-order dp,pp,tp``: a replica's pipeline on neighbouring ranks (one emulated node) instead of a
stage's replicas; the mesh keeps its (pp, dp, tp) dimensions, and training equals the single-device run."""
from __future__ import annotations

from dist_harness import check_against_reference, run_options, spawn
from distperf.config import Layout


def _coordinates(pp, dp, tp, order):
    from distperf.parallel.mesh import build_mesh, coordinates, init_distributed

    device = init_distributed("cpu", 60)
    return coordinates(build_mesh(Layout(pp=pp, dp=dp, tp=tp, schedule="1f1b" if pp > 1 else "none"), device, order))


def test_dp_pp_tp_order_puts_a_replicas_pipeline_on_neighbouring_ranks():
    coords = spawn(_coordinates, 8, 2, 2, 2, "dp,pp,tp")
    assert [(c["pp"], c["dp"], c["tp"]) for c in coords] == [
        (p, d, t) for d in range(2) for p in range(2) for t in range(2)]


def test_dp_pp_tp_order_trains_like_the_single_device_run():
    check_against_reference(Layout(dp=2, pp=2, schedule="1f1b", micro_batch=1, microbatches=2),
                            opts=run_options(mesh_order="dp,pp,tp"))
