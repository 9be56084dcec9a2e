"""What the chapter *Pipeline schedules* (``chapters/pipeline_schedules.md``) computes from the experiment
``pipeline_schedules``: the calibrated iteration time and bubble of each two-stage pipeline, the simulated
schedules against the closed-form bubble, memory per stage against the cost model, and the verdict.

- :func:`schedule_runs`, :func:`microbatch_reference`, :func:`calibrated_pipelines`: the time prediction
  calibrated on one process, :math:`T = m\\max_r t_r + (\\sum_r t_r - \\max_r t_r)/v`, with each rank's FLOP
  share (:func:`rank_shares`) of a microbatch's one-process time;
- :func:`flush_actions`, :func:`simulated_bubble`, :func:`bubble_check`: GPipe and 1F1B as action lists,
  simulated, against :func:`distperf.cost.schedules.bubble_fraction`;
- :func:`memory_by_stage` and the tables and numbers drawn from it: measured bytes per stage and category
  (:func:`distperf.analysis.rows.measured_memory`) beside :func:`distperf.cost.predict`'s;
- :func:`per_microbatch_trend`, :func:`speedup_over_1f1b`, :func:`verdict`, :func:`finding`: the verdict rule
  and the sentences the chapter builds from data;
- :func:`draw_gantt`, :func:`draw_bubble`, :func:`draw_memory`: the chapter's own figures.

The chapter :mod:`.twobw` reuses the calibration (:func:`chunk_flops`, :func:`microbatch_reference`) and
:mod:`.partitioning` the FLOPs per chunk and :func:`span`.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..config import MEMORY_CATEGORIES, Config, stage_layers
from ..cost import flops as fl
from ..cost import schedules
from ..parallel import twobw_schedule as tb
from ..results import signed_error
from . import rows
from .verdicts import threshold

SCHEDULES = ["gpipe", "1f1b", "interleaved", "2bw"]
NAMES = {"none": "one process", "gpipe": "GPipe", "1f1b": "1F1B (Flush)", "interleaved": "interleaved 1F1B",
         "2bw": "PipeDream-2BW"}
FLUSHING = ("gpipe", "1f1b")
FALLING_TREND = threshold("pipeline_schedules", "trend")  # Spearman ρ of time per microbatch with m: it "falls"
MIB = 2**20

TIME_TABLE_FORMAT = {"measured (ms)": "{:.1f}", "predicted (ms)": "{:.1f}", "signed error": "{:+.0%}",
                     "measured bubble": "{:+.2f}", "predicted bubble": "{:.2f}", "tokens/s": "{:.0f}"}
INFLIGHT_TABLE_FORMAT = {"measured activations (MiB)": "{:.2f}", "predicted activations (MiB)": "{:.2f}",
                         "signed error": "{:+.0%}"}
MEMORY_TABLE_FORMAT = {"measured (MiB)": "{:.2f}", "predicted (MiB)": "{:.2f}", "signed error": "{:+.1%}"}


def span(values, spec: str) -> str:
    """``"<min> to <max>"`` of ``values``, each formatted with the format ``spec`` (e.g. ``"+.0%"``)."""
    return f"{values.min():{spec}} to {values.max():{spec}}"


def chunk_flops(cfg: Config) -> list[int]:
    """Forward FLOPs of one microbatch on each model chunk: its layers
    (:func:`distperf.cost.flops.layer_forward_flops`), and the head on the last chunk."""
    spec, lay = cfg.model, cfg.layout
    b, s, h = lay.micro_batch, spec.seq, spec.hidden
    per_chunk = [n * fl.layer_forward_flops(b, s, h, spec.ffn) for n in stage_layers(spec, lay)]
    per_chunk[-1] += fl.head_forward_flops(b, s, h, spec.vocab)
    return per_chunk


def rank_flops(cfg: Config) -> list[int]:
    """Forward FLOPs of one microbatch on each pipeline rank: the chunks it holds (rank r holds chunks r, r + p,
    ... when interleaved)."""
    per_chunk = chunk_flops(cfg)
    return [sum(per_chunk[r::cfg.layout.pp]) for r in range(cfg.layout.pp)]


def rank_shares(cfg: Config) -> list[float]:
    """Each pipeline rank's share of one microbatch's FLOPs, F_r / Σ F."""
    per_rank = rank_flops(cfg)
    return [x / sum(per_rank) for x in per_rank]


def schedule_runs(raw):
    """The rows that ran, with ``m`` (microbatches), ``schedule`` and ``measured_s`` (the median step)."""
    runs = rows.ok(raw)
    runs["m"] = runs["config.layout.microbatches"].astype(int)
    runs["schedule"] = runs["config.layout.schedule"]
    runs["measured_s"] = runs["iteration_time_s.median"]
    return runs


def microbatch_reference(runs):
    """The time of one microbatch of the whole model on one process, T₁/m, per (machine, source): the median over
    the one-process runs (``schedule`` ``none``) of :func:`schedule_runs`."""
    single = runs[runs.schedule == "none"]
    return (single.measured_s / single.m).groupby([single.machine, single.source]).median()


def calibrated_time(row, reference) -> tuple[float, float]:
    """(predicted, ideal) iteration time of one pipeline row: with t_r = (T₁/m)·share_r,
    :func:`distperf.cost.schedules.pipeline_time` and the bubble-free m·max t_r."""
    cfg = rows.config_of_row(row)
    t_mb = reference.get((row.machine, row.source), np.nan)
    t_r = [t_mb * share for share in rank_shares(cfg)]
    return schedules.pipeline_time(row.schedule, t_r, row.m, cfg.layout.chunks), row.m * max(t_r)


def calibrated_pipelines(runs):
    """The pipeline rows of :func:`schedule_runs` with ``predicted_s``, ``ideal_s``, the measured and predicted
    bubble 1 − ideal/T, the signed ``error`` of the time and the schedule's ``name``; rows without a one-process
    reference on their machine are dropped."""
    reference = microbatch_reference(runs)
    pipes = runs[runs.schedule != "none"].copy()
    times = [calibrated_time(row, reference) for _, row in pipes.iterrows()]
    pipes["predicted_s"] = [t[0] for t in times]
    pipes["ideal_s"] = [t[1] for t in times]
    pipes["measured_bubble"] = 1 - pipes.ideal_s / pipes.measured_s
    pipes["predicted_bubble"] = 1 - pipes.ideal_s / pipes.predicted_s
    pipes["error"] = signed_error(pipes.predicted_s, pipes.measured_s)
    pipes["name"] = pipes.schedule.map(NAMES)
    return pipes.dropna(subset=["predicted_s"])


def model_line(cfg: Config) -> str:
    """The trained model in a few words: layers, hidden size, sequence and microbatch."""
    return f"{cfg.model.layers} layers, h = {cfg.model.hidden}, s = {cfg.model.seq}, b = {cfg.layout.micro_batch}"


def flush_actions(kind: str, d: int, m: int) -> list[list[tb.Action]]:
    """One batch of GPipe (all forwards, then all backwards) or 1F1B (a warm-up of min(d − r − 1, m) forwards,
    then one forward and one backward in turn) on each of ``d`` stages, as :mod:`distperf.parallel.twobw_schedule`
    actions."""
    out = []
    for r in range(d):
        if kind == "gpipe":
            out.append([tb.Action("F", k, 0) for k in range(m)] + [tb.Action("B", k, 0) for k in range(m)])
            continue
        w = min(d - r - 1, m)
        acts = [tb.Action("F", k, 0) for k in range(w)]
        for k in range(w, m):
            acts += [tb.Action("F", k, 0), tb.Action("B", k - w, 0)]
        acts += [tb.Action("B", k, 0) for k in range(m - w, m)]
        out.append(acts)
    return out


def simulated_bubble(kind: str, d: int, m: int) -> float:
    """The idle fraction of a simulated flushing schedule (forward 1, backward 2): 1 − 3m / makespan."""
    lanes = tb.timeline(flush_actions(kind, d, m), forward=1.0, backward=2.0)
    end = max(e for lane in lanes for _, _, e in lane)
    return 1 - 3.0 * m / end


def bubble_check(depths=(2, 4, 8), microbatches=(1, 2, 4, 8, 16, 32)):
    """The simulated bubble of GPipe and 1F1B beside the closed form (p − 1)/(m + p − 1) at each depth and m:
    columns ``kind``, ``d``, ``m``, ``simulated``, ``closed_form``."""
    return pd.DataFrame([(kind, d, m, simulated_bubble(kind, d, m), schedules.bubble_fraction(d, m))
                         for kind in FLUSHING for d in depths for m in microbatches],
                        columns=["kind", "d", "m", "simulated", "closed_form"])


def simulation_max_difference(sim) -> float:
    """The largest absolute difference between the simulated and the closed-form bubble of :func:`bubble_check`."""
    return (sim.simulated - sim.closed_form).abs().max()


def gantt_timelines(d: int, m: int) -> dict:
    """The timelines drawn in the Gantt figure, by title: GPipe, 1F1B and two batches of 2BW on d stages."""
    return {"GPipe": tb.timeline(flush_actions("gpipe", d, m)),
            "1F1B (Flush)": tb.timeline(flush_actions("1f1b", d, m)),
            "PipeDream-2BW (2 batches, no flush)": tb.timeline(tb.schedule(d, m, 2))}


def time_table(pipes):
    """Time and bubble per machine, schedule and m, measured and predicted (ms), as the chapter shows them."""
    table = pipes[["machine", "name", "m", "measured_s", "predicted_s", "error", "measured_bubble",
                   "predicted_bubble", "tokens_per_s"]].sort_values(["machine", "name", "m"])
    table = table.rename(columns={"name": "schedule", "measured_s": "measured (ms)", "predicted_s": "predicted (ms)",
                                  "error": "signed error", "measured_bubble": "measured bubble",
                                  "predicted_bubble": "predicted bubble", "tokens_per_s": "tokens/s"})
    table["measured (ms)"] *= 1e3
    table["predicted (ms)"] *= 1e3
    return table


def stage_memory_rows(row) -> tuple[list[dict], str]:
    """One row per stage and category of a pipeline row: measured bytes (:func:`.rows.measured_memory`) beside
    the cost model's, with the stage's microbatches in flight and weight versions; and the kind of the measured
    numbers (:data:`.rows.PEAK` or :data:`.rows.AT_REST`)."""
    from ..cost.predict import predict

    cfg = rows.config_of_row(row)
    predicted = predict(cfg, check=False)["memory_bytes_by_stage"]
    measured, kind = rows.measured_memory(row)
    out = []
    for r, (meas, p_stage) in enumerate(zip(measured, predicted)):
        in_flight = sum(schedules.in_flight(row.schedule, cfg.layout.pp, row.m, cfg.layout.chunks, r))
        versions = schedules.weight_versions(row.schedule, cfg.layout.pp, r)
        out += [dict(machine=row.machine, source=row.source, schedule=row.schedule, name=row["name"], m=row.m,
                     stage=r, category=c.replace("_", " "), measured=meas[c], predicted=p_stage[c],
                     in_flight=in_flight, versions=versions) for c in MEMORY_CATEGORIES]
    return out, kind


def memory_by_stage(pipes) -> tuple[pd.DataFrame, str]:
    """Measured and predicted bytes per pipeline row, stage and category (:func:`stage_memory_rows`) with the
    signed ``error`` (none where nothing was measured), and the kind of the measured numbers (that of the last
    row; :data:`.rows.AT_REST` when there is none)."""
    table, kind = [], rows.AT_REST
    for _, row in pipes.iterrows():
        per_stage, kind = stage_memory_rows(row)
        table += per_stage
    mem = pd.DataFrame(table)
    mem["error"] = signed_error(mem.predicted, mem.measured.where(mem.measured > 0))
    return mem, kind


def largest_m_fresh(mem) -> tuple[int, pd.DataFrame]:
    """The largest m measured and this build's rows of :func:`memory_by_stage` at it."""
    m_show = mem.m.max()
    return m_show, mem[(mem.source == "fresh") & (mem.m == m_show)]


def weight_ratio(shown) -> float:
    """2BW's parameter bytes over 1F1B's, summed over stages (NaN where either was not measured)."""
    w = shown[shown.category == "parameters"].groupby("schedule").measured.sum()
    return w.get("2bw", np.nan) / w.get("1f1b", np.nan)


def inflight_table(shown):
    """Activations per stage with the schedule's microbatches in flight and weight versions, in MiB."""
    act = shown[shown.category == "activations"]
    table = act[["name", "stage", "in_flight", "versions", "measured", "predicted", "error"]].rename(columns={
        "name": "schedule", "in_flight": "microbatches in flight", "versions": "weight versions",
        "measured": "measured activations (MiB)", "predicted": "predicted activations (MiB)",
        "error": "signed error"})
    return table.assign(**{"measured activations (MiB)": table["measured activations (MiB)"] / MIB,
                           "predicted activations (MiB)": table["predicted activations (MiB)"] / MIB})


def inflight_correlation(mem) -> float:
    """Spearman correlation of this build's measured activation bytes with the microbatches in flight, over all
    runs and stages; NaN with fewer than three measurements."""
    a_all = mem[(mem.source == "fresh") & (mem.category == "activations")].dropna(subset=["measured"])
    return a_all.in_flight.rank().corr(a_all.measured.rank()) if len(a_all) > 2 else np.nan


def memory_error_table(mem):
    """This build's bytes per schedule and category summed over stages and m, measured and predicted (MiB), with
    the signed error (none where nothing was measured)."""
    etab = mem[mem.source == "fresh"].groupby(["name", "category"]).agg(
        measured=("measured", "sum"), predicted=("predicted", "sum")).reset_index()
    etab["signed error"] = signed_error(etab.predicted, etab.measured.where(etab.measured > 0))
    etab["measured"] /= MIB
    etab["predicted"] /= MIB
    return etab


def memory_table_shown(etab):
    """:func:`memory_error_table` with the column names the chapter shows."""
    return etab.rename(columns={"name": "schedule", "measured": "measured (MiB)", "predicted": "predicted (MiB)"})


def memory_errors(etab) -> tuple[pd.Series, pd.Series]:
    """The signed errors of :func:`memory_error_table` for the model states and for the activations."""
    states = etab[etab.category != "activations"]["signed error"].dropna()
    acts = etab[etab.category == "activations"]["signed error"].dropna()
    return states, acts


def states_error_text(states) -> str:
    """The largest absolute model-state error, or "not measured"."""
    return f"{states.abs().max():.1%}" if len(states) else "not measured"


def activations_error_text(acts) -> str:
    """The range of the activations' signed errors, or "not measured"."""
    return span(acts, "+.0%") if len(acts) else "not measured"


def median_abs_error(fresh) -> float:
    """The median absolute signed error of the calibrated iteration time."""
    return fresh.error.abs().median()


def per_microbatch_trend(fresh) -> float:
    """Spearman correlation of the flushing schedules' mean measured time per microbatch T/m with m (negative:
    falls as m grows, as the shrinking bubble predicts); NaN when only one m was measured."""
    flush = fresh[fresh.schedule.isin(FLUSHING)]
    if flush.m.nunique() <= 1:
        return np.nan
    per_mb = flush.assign(per_mb=flush.measured_s / flush.m).groupby("m").per_mb.mean()
    return per_mb.rank().corr(pd.Series(per_mb.index, index=per_mb.index).rank())


def trend_sentence(trend: float) -> str:
    """What :func:`per_microbatch_trend` says, as the end of a sentence."""
    if math.isnan(trend):
        return "was measured at one m only"
    return "falls as m grows, as the shrinking bubble predicts" if trend <= FALLING_TREND else \
        "does not fall steadily with m"


def speedup_over_1f1b(fresh):
    """2BW's measured speed-up over 1F1B, T_1F1B / T_2BW, at each m where both ran."""
    two = fresh[fresh.schedule == "2bw"].set_index("m").measured_s
    one = fresh[fresh.schedule == "1f1b"].set_index("m").measured_s
    return (one / two).dropna()


def speedup_sentence(speedup) -> str:
    """The speed-ups of :func:`speedup_over_1f1b`, or "not measured"."""
    return ", ".join(f"{v:.2f}× at m = {m}" for m, v in speedup.items()) or "not measured"


def bubble_gap(fresh) -> float:
    """The median of measured minus predicted bubble: what the schedule arithmetic leaves out."""
    return (fresh.measured_bubble - fresh.predicted_bubble).median()


def statistics(median_abs: float, speedup, trend: float) -> dict:
    """The rule's statistics (:mod:`distperf.analysis.verdicts`): the median |signed error| of the iteration time,
    the trend of time per microbatch with m (:func:`per_microbatch_trend`) and 2BW's smallest speed-up over 1F1B
    (:func:`speedup_over_1f1b`; NaN where not measured)."""
    return {"median_error": float(median_abs), "trend": float(trend),
            "speedup_2bw": float(speedup.min()) if len(speedup) else math.nan}

def finding(median_abs: float, rho: float, states_max: float, ratio_2bw: float) -> str:
    """The chapter's finding in one sentence."""
    return (f"On two stages the calibrated schedule model predicts iteration time with a median absolute "
            f"error of {median_abs:.0%}; measured activations follow the microbatches in flight (Spearman "
            f"{rho:+.2f}), model states match the prediction to {states_max:.1%} and 2BW holds "
            f"{ratio_2bw:.2f}× the parameter bytes of 1F1B.")


def draw_gantt(timelines: dict, d: int):
    """One panel per timeline of :func:`gantt_timelines`: forwards and backwards as bars labelled by microbatch,
    the shade alternating with the weight version, weight updates as black ticks."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    from ..plots import PALETTE

    fig, axes = plt.subplots(len(timelines), 1, figsize=(7.2, 5.6), sharex=False)
    colours = sns.color_palette(PALETTE, 4)
    for ax, (title, lanes) in zip(axes, timelines.items()):
        for r, lane in enumerate(lanes):
            for action, start, end in lane:
                if action.kind == "U":
                    ax.plot([start, start], [r - 0.45, r + 0.45], color="black", lw=1.5)
                    continue
                colour = colours[0] if action.kind == "F" else colours[1]
                shade = 1.0 if action.version % 2 == 0 else 0.55
                ax.barh(r, end - start, left=start, color=colour, alpha=shade, edgecolor="white", height=0.9)
                ax.text((start + end) / 2, r, str(action.index), ha="center", va="center", fontsize=6)
        ax.set_yticks(range(d), [f"stage {r}" for r in range(d)], fontsize="small")
        ax.invert_yaxis()
        ax.set_title(title, fontsize="small")
    axes[-1].set_xlabel("time (forward = 1, backward = 2)")
    fig.tight_layout()
    return fig


def draw_bubble(sim, fresh):
    """Bubble fraction against m: the closed form at p = 2, 4, 8 (and interleaved at p = 2), the simulated 1F1B
    of :func:`bubble_check`, and the measured two-stage pipelines of this build."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    from ..plots import PALETTE

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ms = np.arange(1, 33)
    line_colours = sns.color_palette(PALETTE, 6)
    for colour, d in zip(line_colours, (2, 4, 8)):
        ax.plot(ms, [schedules.bubble_fraction(d, m) for m in ms], ls="--", color=colour, lw=1.2,
                label=f"predicted, flush, p = {d}")
        part = sim[(sim.d == d) & (sim.kind == "1f1b")]
        ax.scatter(part.m, part.simulated, facecolors="none", edgecolors=colour, s=40,
                   label=f"simulated 1F1B, p = {d}")
    ax.plot(ms, [schedules.bubble_fraction(2, m, 2) for m in ms], ls=":", color=line_colours[3], lw=1.2,
            label="predicted, interleaved v = 2, p = 2")
    markers = {"gpipe": "o", "1f1b": "s", "interleaved": "^", "2bw": "D"}
    for colour, sched in zip(sns.color_palette("dark", len(SCHEDULES)), SCHEDULES):
        part = fresh[fresh.schedule == sched]
        if len(part):
            ax.scatter(part.m, part.measured_bubble, marker=markers[sched], s=55, zorder=3, color=colour,
                       label=f"measured, {NAMES[sched]}, p = 2")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("microbatches per iteration m")
    ax.set_ylabel("bubble fraction of the iteration")
    ax.legend(fontsize="x-small", bbox_to_anchor=(1.02, 1), loc="upper left")
    fig.set_size_inches(8.4, 4.0)
    fig.tight_layout()
    return fig


def draw_memory(shown):
    """Parameters (all weight versions) and activations per stage and schedule: predicted as bars, measured as
    points, for the rows of :func:`largest_m_fresh`."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    from ..plots import PALETTE

    colours = sns.color_palette(PALETTE, 4)
    fig, axes = plt.subplots(1, 2, figsize=(7.8, 3.8))
    names = list(dict.fromkeys(shown.sort_values("schedule", key=lambda s: s.map(SCHEDULES.index))["name"]))
    for ax, category in zip(axes, ["parameters", "activations"]):
        part = shown[shown.category == category]
        for k, stage in enumerate((0, 1)):
            cell = part[part.stage == stage].set_index("name").reindex(names)
            x = np.arange(len(names)) + (k - 0.5) * 0.4
            ax.bar(x, cell.predicted / MIB, width=0.38, color=colours[k], alpha=0.45, edgecolor=colours[k],
                   label=f"predicted, stage {stage}")
            ax.scatter(x, cell.measured / MIB, color=colours[k], marker="o", edgecolor="black", zorder=3,
                       label=f"measured, stage {stage}")
        ax.set_xticks(range(len(names)), names, rotation=25, ha="right", fontsize="small")
        ax.set_title(category + (" (all weight versions)" if category == "parameters" else ""), fontsize="small")
        ax.set_ylabel("MiB")
    axes[1].legend(fontsize="x-small")
    fig.tight_layout()
    return fig
