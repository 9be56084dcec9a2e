"""How the calibration's parallel-path probes become constants of the hardware profile (no torch: the book's
chapters recompute them from a calibration's sidecar, :func:`distperf.analysis.time_model.path_rounds`).

The probes themselves run in :mod:`distperf.measure.calibrate` (``parallel_paths``, ``pipeline_microbatch_time``)
on the shapes and counts defined here.
"""
from __future__ import annotations

from ..cost.kernels import STEP_FIT_MODEL

PATH_PROBE = dict(name="path-probe", layers=4, hidden=256, heads=4, vocab=16, seq=64)  # no preset's shape
PATH_UNITS = 4
PIPE_MICROBATCHES = (2, 10)  # the two schedule lengths whose difference is the time of a microbatch
# the micro-batches of the tiny preset's tensor-parallel steps: messages of b·16·32·4 bytes, 2 KiB to 512 KiB
TP_FIT_BATCHES = (1, 4, 16, 64, 256)
# whether the calibration fits DTensor's cost per byte of a collective's message beside its cost per call: it did on
# the builds of 5 December 2026 at cfa62fb and 9ae9b61; the rule that then decided it (the chapter "Where the time
# goes", section "Held-out validation") turned it down, so a calibration fits the per-call cost alone over
# TP_FIT_BATCHES (the per-byte term stays in the cost model for the profiles that carry it)
PER_BYTE = False
# one Transformer layer under FSDP2 at widths no preset has, whose units (12·h² + 13·h elements) bracket the presets'
# from 1.8 to 16 million (the wide preset's is 12.6 million; glibc's mmap threshold, 32 MiB of fp32, 8.4 million)
FSDP_UNIT_PROBE = dict(name="fsdp-unit-probe", layers=1, vocab=16, seq=64)
FSDP_UNIT_HIDDENS = (384, 640, 896, 1152)
FSDP_UNIT_HIDDENS_QUICK = (64, 128)


def path_constants(paths: dict, kernels: dict, fits: dict, world: int) -> dict:
    """What FSDP2's path costs beyond the kernel time model's other terms, from
    :func:`distperf.measure.calibrate.parallel_paths`:

    - ``fsdp_overlap``: the share of FSDP2's gathers and reduce-scatters that its forward and backward hide,
      1 − (FSDP2 stack − plain stack − the one-rank wrappers) / (its collectives' α-β time as a step issues them,
      ``fits``), at most 1; negative when the path costs more than that α-β time (then it is the excess: the cost
      model takes (1 − fsdp_overlap) times the α-β time), at least −``FSDP_EXPOSURE_MAX``.

    Calibrations before 3 December 2026 timed one tensor-parallel Block of :data:`PATH_PROBE`'s shape instead of the
    tiny preset's steps (``tp_layer_s``, ``tp_sp_layer_s``, ``plain_layer_s``); from those this also gives what they
    took: ``tp_collective_s``, (tp layer − its compute − the one-rank wrapper − 4 all-reduces) / 4, the compute being
    the kernel model's for the shard scaled by the plain layer's measured time over the model's for it, and
    ``tp_sp_collective_s`` the same over the sequence-parallel layer's 4 all-gathers and 4 reduce-scatters.
    The tensor-parallel constants of later calibrations and the pipeline engines' need the cost model on the whole
    profile: :func:`tensor_parallel_paths`, :func:`pipeline_actions` (:func:`with_path_constants` applies all)."""
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

    unit = layer_parameters(spec.hidden, spec.ffn) * 4
    gathers = PATH_UNITS * (2 * ring("all-gather", unit) + ring("reduce-scatter", unit))
    exposed = paths["fsdp_stack_s"] - paths["plain_stack_s"] - (PATH_UNITS + 1) * costs.fsdp_unit_s
    out = {"fsdp_overlap": min(max(1 - exposed / gathers, -kn.FSDP_EXPOSURE_MAX), 1.0)}
    if "tp_layer_s" not in paths:
        return out

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
    return {**out, "tp_collective_s": max(extra, 0.0), "tp_sp_collective_s": max(extra_sp, 0.0)}


def tensor_parallel_fits(world: int) -> bool:
    """Whether the tiny preset's heads and positions divide among ``world`` tensor-parallel ranks."""
    from .. import presets

    spec = presets.model(STEP_FIT_MODEL)
    return spec.heads % world == 0 and spec.seq % world == 0


def tensor_parallel_paths(paths: dict, hw, world: int, per_byte: bool = PER_BYTE) -> dict:
    """``tp_collective_s`` and ``tp_collective_byte_s`` (``tp_sp_collective_s``, ``tp_sp_collective_byte_s``): what a
    collective through DTensor costs beyond every other term of the cost model, per call and per byte of its message,
    fitted on the :data:`STEP_FIT_MODEL` preset (the one preset constants may be fitted on; no validation uses it).
    Per micro-batch b that the probes measured (:data:`TP_FIT_BATCHES`), the residual y_b = the tensor-parallel
    trainer's measured step (``tp_b<b>_step_s``; ``tp_sp_b<b>_step_s`` with sequence parallelism) − the cost model's
    step on ``hw`` with both constants 0, n_b the step's collectives and B_b their bytes (the cost model's own: the
    step's change per unit of each constant). The fit is y_b = c·n_b + c_B·B_b by least squares on the residuals
    relative to the measured step, with both at least 0 (c_B < 0: c_B = 0 and c as below; c < 0: c = 0 and c_B
    refitted alone). Without ``per_byte`` (the calibration's default, :data:`PER_BYTE`), or where the measured messages
    span less than :data:`BYTE_SPAN` (the calibrations until 5 December 2026 stepped at micro-batches 1, 2 and 4
    only), c_B = 0 and c = median_b(y_b / n_b), at least 0. A constant whose steps were not measured stays
    ``hw``'s."""
    out = {}
    for sp, prefix in ((False, "tp"), (True, "tp_sp")):
        points = []  # (measured, y_b, n_b, B_b)
        for b in stepped_batches(paths, prefix):
            measured = paths[f"{prefix}_b{b}_step_s"]
            bare, calls, nbytes = step_terms(STEP_FIT_MODEL, b, sp, hw, world)
            points.append((measured, measured - bare, calls, nbytes))
        if points:
            out[f"{prefix}_collective_s"], out[f"{prefix}_collective_byte_s"] = _per_call_and_byte(points, per_byte)
    return out


def stepped_batches(paths: dict, prefix: str = "tp") -> list[int]:
    """The micro-batches whose tensor-parallel steps ``paths`` holds (``<prefix>_b<b>_step_s``; ``prefix`` "tp", or
    "tp_sp" with sequence parallelism), in order."""
    import re

    return sorted(int(found.group(1)) for key in paths if (found := re.fullmatch(rf"{prefix}_b(\d+)_step_s", key)))


def step_terms(model: str, micro_batch: int, sequence_parallel: bool, hw, world: int) -> tuple[float, float, float]:
    """The tensor-parallel step of the preset ``model`` on ``world`` ranks as the cost model prices it on ``hw`` (gloo's
    algorithms) with DTensor's per-collective constants at 0, the step's collectives and their bytes (the step's
    change per second of the per-call constant and per second-per-byte of the per-byte one; the step is linear in
    both)."""
    at = [step_prediction(model, micro_batch, sequence_parallel, hw, world, c, c_b)["iteration"]
          for c, c_b in ((0.0, 0.0), (1.0, 0.0), (0.0, 1e-6))]
    return at[0], at[1] - at[0], (at[2] - at[0]) / 1e-6


def step_prediction(model: str, micro_batch: int, sequence_parallel: bool, hw, world: int, per_call: float,
                    per_byte: float) -> dict:
    """The cost model's ``time_s`` of that step on ``hw`` with DTensor's per-call and per-byte constants set."""
    from dataclasses import replace

    from .. import presets
    from ..config import Config, Layout, validate
    from ..cost import predict

    prefix = "tp_sp" if sequence_parallel else "tp"
    cfg = validate(Config(model=presets.model(model), layout=Layout(tp=world, micro_batch=micro_batch,
                                                                   sequence_parallel=sequence_parallel)))
    costs = replace(hw.kernels, **{f"{prefix}_collective_s": per_call, f"{prefix}_collective_byte_s": per_byte})
    return predict(cfg, replace(hw, kernels=costs), check=False, backend="gloo")["time_s"]


def tensor_parallel_waits(paths: dict, hw, world: int) -> dict:
    """``tp_collective_wait_s`` (``tp_sp_collective_wait_s``): the part of DTensor's cost per collective that the rank
    spends inside the collective, where a profiler sees communication, fitted on the :data:`STEP_FIT_MODEL` preset's
    profiled tensor-parallel steps (``tp_b<b>_wait_s``: the communication class of
    :class:`distperf.measure.breakdown.StepBreakdown`, on the rank that waited least, as the book reads a run's
    breakdown on the rank that ends it). Per micro-batch b, the measured communication less the cost model's on
    ``hw`` with DTensor's constants at 0 (the collectives' α-β time), over the step's collectives n_b; the constant is
    the median over b, at least 0. The cost model files at most the per-call cost as inside
    (:func:`distperf.cost.communication.tensor_parallel`); the rest is framework. A constant whose steps were not
    profiled stays ``hw``'s."""
    import statistics

    out = {}
    for sp, prefix in ((False, "tp"), (True, "tp_sp")):
        per_call = []
        for b in stepped_batches(paths, prefix):
            if f"{prefix}_b{b}_wait_s" in paths:
                bare, once = (step_prediction(STEP_FIT_MODEL, b, sp, hw, world, c, 0.0) for c in (0.0, 1.0))
                calls = once["iteration"] - bare["iteration"]  # the step's change per second of the per-call cost
                per_call.append((paths[f"{prefix}_b{b}_wait_s"] - bare["communication_exposed"]) / calls)
        if per_call:
            out[f"{prefix}_collective_wait_s"] = max(statistics.median(per_call), 0.0)
    return out


BYTE_SPAN = 16  # the per-byte term is fitted only on messages whose sizes span at least this factor


def _per_call_and_byte(points: list[tuple], per_byte: bool) -> tuple[float, float]:
    """(c, c_B) of :func:`tensor_parallel_paths` from its points (measured step, residual, collectives, bytes)."""
    import statistics

    alone = max(statistics.median(y / n for _, y, n, _ in points), 0.0)
    sizes = [nbytes / n for _, _, n, nbytes in points]
    if not per_byte or max(sizes) < BYTE_SPAN * min(sizes):
        return alone, 0.0
    rows = [(y / m, n / m, nbytes / m) for m, y, n, nbytes in points]  # each equation relative to its step
    saa, sab, sbb = (sum(a * a for _, a, _ in rows), sum(a * b for _, a, b in rows), sum(b * b for _, _, b in rows))
    sya, syb = sum(y * a for y, a, _ in rows), sum(y * b for y, _, b in rows)
    det = saa * sbb - sab * sab
    c, c_b = (sya * sbb - syb * sab) / det, (saa * syb - sab * sya) / det
    if c_b < 0:
        return alone, 0.0
    if c < 0:
        return 0.0, max(syb / sbb, 0.0)
    return c, c_b


def with_path_constants(hw, paths: dict, world: int, per_byte: bool = PER_BYTE):
    """``hw`` with every path constant taken from the path probes' times ``paths``: :func:`path_constants` (α-β of the
    profile's collectives as a step issues them), then :func:`tensor_parallel_paths` (with its per-byte terms unless
    ``per_byte`` is False), :func:`tensor_parallel_waits`, :func:`pipeline_actions` and :func:`pipeline_waits` where
    their probes ran."""
    from dataclasses import replace

    fits = {kind: {"all": {"alpha": a, "beta": b}} for kind, a, b in hw.collectives}
    found = path_constants(paths, hw.kernels.to_dict(), fits, world)
    out = replace(hw, kernels=replace(hw.kernels, fsdp_overlap=found.pop("fsdp_overlap"), **found))
    out = replace(out, kernels=replace(out.kernels, **tensor_parallel_paths(paths, out, world, per_byte)))
    out = replace(out, kernels=replace(out.kernels, **tensor_parallel_waits(paths, out, world)))
    if "pp_microbatch_s" in paths:
        out = replace(out, kernels=replace(out.kernels, **pipeline_actions(paths, out, world)))
    if "pp_microbatch_wait_s" in paths:
        out = replace(out, kernels=replace(out.kernels, **pipeline_waits(paths, out, world)))
    return out


def pipeline_actions(paths: dict, hw, world: int) -> dict:
    """``pp_action_s`` and ``twobw_action_s``: what torch's pipelining runtime and the 2BW engine cost per action (a
    microbatch's forward or backward on a stage) beyond every other term of the cost model: (what the engine adds to a
    microbatch in the probe, :func:`distperf.measure.calibrate.pipeline_microbatch_time` − what the cost model on
    ``hw``, without action costs, adds to it beyond compute: its sends and waits) / 2, at least 0."""
    beyond = _probe_beyond_compute(hw, world)
    return {action: max((paths[key] - beyond[schedule]) / 2, 0.0) for schedule, key, action, _, _ in PIPE_PROBES}


def pipeline_waits(paths: dict, hw, world: int) -> dict:
    """``pp_action_wait_s`` and ``twobw_action_wait_s``: the part of an action's cost the rank spends inside
    communication, where a profiler sees it: (the communication one more microbatch adds to a profiled step of the
    probe, ``pp_microbatch_wait_s`` / ``twobw_microbatch_wait_s`` from
    :func:`distperf.measure.calibrate.pipeline_microbatch_time` − what the cost model on ``hw``, without action costs,
    adds to it beyond compute) / 2, at least 0. The cost model files at most the action's cost as inside
    (:func:`distperf.cost.stage.action_inside`)."""
    beyond = _probe_beyond_compute(hw, world)
    return {wait: max((paths[key] - beyond[schedule]) / 2, 0.0) for schedule, _, _, key, wait in PIPE_PROBES
            if key in paths}


# per engine: the schedule, the probe's time per microbatch and the constant fitted on it, then the same for the
# communication of its profiled steps
PIPE_PROBES = (("1f1b", "pp_microbatch_s", "pp_action_s", "pp_microbatch_wait_s", "pp_action_wait_s"),
               ("2bw", "twobw_microbatch_s", "twobw_action_s", "twobw_microbatch_wait_s", "twobw_action_wait_s"))


def _probe_beyond_compute(hw, world: int) -> dict:
    """{schedule: what one more microbatch of the pipeline probe adds beyond compute} (its sends, waits and bubble)
    as the cost model prices it on ``hw`` without action costs, per microbatch between :data:`PIPE_MICROBATCHES`."""
    from dataclasses import replace

    from ..config import Config, Layout, ModelSpec, validate
    from ..cost import predict

    bare = replace(hw, kernels=replace(hw.kernels, pp_action_s=0.0, twobw_action_s=0.0))
    spec, (m1, m2) = ModelSpec(**PATH_PROBE), PIPE_MICROBATCHES
    out = {}
    for schedule, *_ in PIPE_PROBES:
        beyond = []
        for m in (m1, m2):
            t = predict(validate(Config(model=spec, layout=Layout(pp=world, micro_batch=1, microbatches=m,
                                                                  schedule=schedule))), bare, backend="gloo")["time_s"]
            beyond.append(t["iteration"] - t["compute"])
        out[schedule] = (beyond[1] - beyond[0]) / (m2 - m1)
    return out


def fsdp_unit_probe_spec(hidden: int):
    """The :class:`~distperf.config.ModelSpec` of the FSDP2 unit probe at ``hidden`` (heads of 64)."""
    from ..config import ModelSpec

    return ModelSpec(**FSDP_UNIT_PROBE, hidden=hidden, heads=max(1, hidden // 64))


def fsdp_unit_table(rows: list[dict], hw, world: int) -> tuple:
    """The ``fsdp_units`` table (the book's what-if: no profile carries it) from the FSDP2 unit probe
    (:func:`distperf.measure.fsdp_overhead.fsdp_unit_times`: one layer's forward + backward on ``world`` ranks at
    once, plain, under ``fully_shard`` without gradient synchronization, and with it), priced by the cost model on
    ``hw`` (the profile with its other path constants and no table): per row, (the unit's elements unsharded and
    padded, the ZeRO stage, microbatch_s = no-sync step − plain step − the unit's gathers as exposed on ``hw`` −
    ``fsdp_unit_s``, step_s = synchronized step − no-sync step − its reduce-scatter as exposed on ``hw``), each at
    least 0: what the unit costs beyond what the model already prices, as :func:`pipeline_actions` does for the
    engines. The exposed times are :func:`distperf.cost.communication.data_parallel`'s for a rank holding that one
    layer (gloo's algorithms), its compute the plain step split 1 : 2."""
    from ..config import Layout, Training
    from ..cost.communication import data_parallel
    from ..cost.stage import Compute, Span, model_states

    table = []
    for row in rows:
        spec, zero = fsdp_unit_probe_spec(row["hidden"]), row["zero"]
        lay, training = Layout(dp=world, zero=zero), Training()
        states = model_states(spec, lay, training, Span(1, False, False))
        plain = row["plain_s"]
        priced = data_parallel(spec, lay, training, hw, states, Compute(plain / 3, 2 * plain / 3), 0.0,
                               backend="gloo")
        microbatch = row["nosync_s"] - plain - priced.exposed_microbatch - hw.kernels.fsdp_unit_s
        step = row["sync_s"] - row["nosync_s"] - priced.exposed_step
        table.append((world * states.units[0][1], zero, max(microbatch, 0.0), max(step, 0.0)))
    return tuple(table)


def with_fsdp_units(hw, rows: list[dict] | None, world: int):
    """``hw`` with its ``fsdp_units`` table priced from the probe's ``rows`` (:func:`fsdp_unit_table`) on ``hw``
    without one; ``hw`` unchanged without rows or kernels."""
    from dataclasses import replace

    if not rows or hw.kernels is None:
        return hw
    bare = replace(hw, kernels=replace(hw.kernels, fsdp_units=()))
    return replace(hw, kernels=replace(hw.kernels, fsdp_units=fsdp_unit_table(rows, bare, world)))
