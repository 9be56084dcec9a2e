"""How the calibration's parallel-path probes become constants of the hardware profile (no torch: the book's
chapters recompute them from a calibration's sidecar, :func:`distperf.analysis.time_model.path_rounds`).

The probes themselves run in :mod:`distperf.measure.calibrate` (``parallel_paths``, ``pipeline_microbatch_time``)
on the shapes and counts defined here.
"""
from __future__ import annotations

PATH_PROBE = dict(name="path-probe", layers=4, hidden=256, heads=4, vocab=16, seq=64)  # no preset's shape
PATH_UNITS = 4
PIPE_MICROBATCHES = (2, 10)  # the two schedule lengths whose difference is the time of a microbatch


def path_constants(paths: dict, kernels: dict, fits: dict, world: int) -> dict:
    """What the parallel paths cost beyond the kernel time model's other terms, from
    :func:`distperf.measure.calibrate.parallel_paths`:

    - ``tp_collective_s``: per tensor-parallel collective, DTensor's cost beyond the α-β time of an all-reduce as a
      step issues it (``fits``), (tp layer − its compute − the one-rank wrapper − 4 all-reduces) / 4, the compute
      being the kernel model's for the shard scaled by the plain layer's measured time over the model's for it;
      ``tp_sp_collective_s`` the same with sequence parallelism, over its 4 all-gathers and 4 reduce-scatters;
    - ``fsdp_overlap``: the share of FSDP2's gathers and reduce-scatters that its forward and backward hide,
      1 − (FSDP2 stack − plain stack − the one-rank wrappers) / (its collectives' α-β time), at most 1; negative
      when the path costs more than that α-β time (then it is the excess: the cost model takes (1 − fsdp_overlap)
      times the α-β time), at least −``FSDP_EXPOSURE_MAX``.

    The pipeline engines' constants need the cost model on the whole profile: :func:`pipeline_actions`."""
    from ..config import ModelSpec
    from ..cost import kernels as kn
    from ..cost.collectives import collective_time
    from ..cost.parameters import layer_parameters

    costs = kn.KernelCosts.from_dict(kernels)
    spec = ModelSpec(**PATH_PROBE)
    message = spec.seq * spec.hidden * 4

    def ring(kind, nbytes):
        fit = fits[kind]["all"]
        return collective_time(kind, nbytes, world, fit["alpha"], fit["beta"], "nccl")

    def kernels(t: int, sp: bool) -> float:
        layer = kn.layer(costs, 1, spec.seq, spec.hidden, spec.heads, spec.ffn, t, sp, True, True, False, "none", False)
        return sum(sum(pair) for c, pair in layer.items() if c != "framework")

    # the shard's compute: the kernel model's, scaled to the plain layer measured beside it (same probe, same moment)
    scale = paths["plain_layer_s"] / kernels(1, False) if paths.get("plain_layer_s") else costs.contention_compute
    compute = kernels(world, False) * scale
    extra = (paths["tp_layer_s"] - compute - costs.tp_layer_s - 4 * ring("all-reduce", message)) / 4
    compute = kernels(world, True) * scale
    collectives = 4 * ring("all-gather", message) + 4 * ring("reduce-scatter", message)  # 2 + 2 each way
    extra_sp = (paths["tp_sp_layer_s"] - compute - costs.tp_sp_layer_s - collectives) / 8
    unit = layer_parameters(spec.hidden, spec.ffn) * 4
    gathers = PATH_UNITS * (2 * ring("all-gather", unit) + ring("reduce-scatter", unit))
    exposed = paths["fsdp_stack_s"] - paths["plain_stack_s"] - (PATH_UNITS + 1) * costs.fsdp_unit_s
    return {"tp_collective_s": max(extra, 0.0), "tp_sp_collective_s": max(extra_sp, 0.0),
            "fsdp_overlap": min(max(1 - exposed / gathers, -kn.FSDP_EXPOSURE_MAX), 1.0)}


def pipeline_actions(paths: dict, hw, world: int) -> dict:
    """``pp_action_s`` and ``twobw_action_s``: what torch's pipelining runtime and the 2BW engine cost per action (a
    microbatch's forward or backward on a stage) beyond every other term of the cost model: (what the engine adds to a
    microbatch in the probe, :func:`distperf.measure.calibrate.pipeline_microbatch_time` − what the cost model on
    ``hw``, without action costs, adds to it beyond compute: its sends and waits) / 2, at least 0."""
    from dataclasses import replace

    from ..config import Config, Layout, ModelSpec, validate
    from ..cost import predict

    bare = replace(hw, kernels=replace(hw.kernels, pp_action_s=0.0, twobw_action_s=0.0))
    spec, (m1, m2) = ModelSpec(**PATH_PROBE), PIPE_MICROBATCHES
    out = {}
    for schedule, key, action in (("1f1b", "pp_microbatch_s", "pp_action_s"),
                                  ("2bw", "twobw_microbatch_s", "twobw_action_s")):
        beyond = []
        for m in (m1, m2):
            t = predict(validate(Config(model=spec, layout=Layout(pp=world, micro_batch=1, microbatches=m,
                                                                  schedule=schedule))), bare, backend="gloo")["time_s"]
            beyond.append(t["iteration"] - t["compute"])
        out[action] = max((paths[key] - (beyond[1] - beyond[0]) / (m2 - m1)) / 2, 0.0)
    return out
