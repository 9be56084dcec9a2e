"""What the chapter *Pipeline partitioning* (``chapters/partitioning.md``) computes from the experiment
``partitioning``: memory per stage and summed over stages for each split of the layers, measured
(:func:`distperf.analysis.rows.measured_memory`) and predicted (:func:`distperf.cost.predict`), the iteration time
of each split predicted from the uniform one, and the verdict on Lu et al.'s claim that a poor partition raises
the *total* memory of the pipeline.

- :func:`partition_tables`: one row per run (totals over stages) and one per stage and category;
- :func:`fitted_times`: T = c·(m max F_r + Σ F_r − max F_r), c fitted on the uniform split;
- :func:`error_table`, :func:`total_rises`, :func:`verdict`, :func:`finding` and the sentences built from data;
- :func:`draw_stages`, :func:`draw_total`: the chapter's figures.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..config import MEMORY_CATEGORIES, stage_layers
from ..cost import schedules
from ..results import signed_error
from . import rows
from .pipeline_schedules import chunk_flops, span
from .verdicts import threshold

POLICIES = {"uniform": "uniform", "params": "by parameters", "time": "by time", "flops": "by FLOPs"}
REALISTIC = tuple(POLICIES.values())  # the partitioners a user would run; explicit splits are lopsided on purpose
DEPTHS = (2, 4, 8, 16)  # depths of the predicted totals (two are measured)
DEEP_LAYERS = 32  # the measured model's layers, made deep enough for 16 stages
RISE_THRESHOLD = threshold("partitioning", "rise")  # the rule's threshold on the rise of the total
MIB = 2**20

ERROR_TABLE_FORMAT = {"measured peak, all tensors (MiB)": "{:.2f}", "measured, modelled categories (MiB)": "{:.2f}",
                      "predicted (MiB)": "{:.2f}", "memory error": "{:+.1%}",
                      "measured (ms)": "{:.1f}", "predicted (ms)": "{:.1f}", "time error": "{:+.0%}"}


def policy_label(partition) -> str:
    """The chapter's name of a run's ``--partition`` policy; "fixed" for an explicit split."""
    return POLICIES.get(str(partition), "fixed")


def stage_rows(row, cfg, split: str, label: str, measured: list[dict], predicted: list[dict]) -> list[dict]:
    """One row per stage and category of a run: measured and predicted bytes."""
    return [dict(machine=row.machine, source=row.source, schedule=cfg.layout.schedule, partition=f"{split} ({label})",
                 split=split, stage=r, category=c, measured=meas[c], predicted=p_stage[c])
            for r, (meas, p_stage) in enumerate(zip(measured, predicted)) for c in MEMORY_CATEGORIES]


def run_row(row, cfg, split: str, label: str, measured: list[dict], pred: dict) -> dict:
    """A run's totals over its stages: each rank's peak of all its tensors (``measured_total``), of the model
    states and of the modelled categories, measured and predicted; the largest stage; and the FLOPs per stage,
    m and measured time the time fit needs."""
    by_stage = pred["memory_bytes_by_stage"]
    return dict(machine=row.machine, source=row.source, schedule=cfg.layout.schedule, split=split, policy=label,
                partition=f"{split} ({label})", first_layers=stage_layers(cfg.model, cfg.layout)[0],
                measured_total=sum(m["total"] for m in measured),
                measured_states=sum(m["parameters"] + m["gradients"] + m["optimizer_states"] for m in measured),
                measured_categories=sum(sum(m[c] for c in MEMORY_CATEGORIES) for m in measured),
                predicted_total=sum(pred["memory_bytes_per_stage"]),
                predicted_states=sum(s["parameters"] + s["gradients"] + s["optimizer_states"] for s in by_stage),
                predicted_peak_stage=max(pred["memory_bytes_per_stage"]),
                measured_peak_stage=max(m["total"] for m in measured),
                flops=chunk_flops(cfg), m=cfg.layout.microbatches, measured_s=row["iteration_time_s.median"])


def partition_tables(runs) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """(one row per run, :func:`run_row`; one row per stage and category, :func:`stage_rows`; the kind of the
    measured numbers, that of the last run, :data:`.rows.AT_REST` when there is none)."""
    from ..cost.predict import predict

    parts, stages, kind = [], [], rows.AT_REST
    for _, row in runs.iterrows():
        cfg = rows.config_of_row(row)
        pred = predict(cfg, check=False)
        measured, kind = rows.measured_memory(row)
        label, split = policy_label(row["arg.partition"]), ",".join(map(str, stage_layers(cfg.model, cfg.layout)))
        stages += stage_rows(row, cfg, split, label, measured, pred["memory_bytes_by_stage"])
        parts.append(run_row(row, cfg, split, label, measured, pred))
    return pd.DataFrame(parts), pd.DataFrame(stages), kind


def model_line(cfg) -> str:
    """The trained model in a few words."""
    return (f"{cfg.model.layers} layers, h = {cfg.model.hidden}, vocabulary {cfg.model.vocab}, s = {cfg.model.seq}, "
            f"b = {cfg.layout.micro_batch}, m = {cfg.layout.microbatches}")


def fitted_times(parts) -> list[float]:
    """Each run's predicted time c·T(F), T the schedule's :func:`distperf.cost.schedules.pipeline_time` over the
    stages' FLOPs F_r and c = measured / T(F) of the uniform split on the same machine, source and schedule
    (NaN without one)."""
    out = []
    for _, p in parts.iterrows():
        ref = parts[(parts.machine == p.machine) & (parts.source == p.source) & (parts.schedule == p.schedule)
                    & (parts.policy == "uniform")]
        if ref.empty:
            out.append(np.nan)
            continue
        ref = ref.iloc[0]
        c = ref.measured_s / schedules.pipeline_time(ref.schedule, ref.flops, ref.m, 1)
        out.append(c * schedules.pipeline_time(p.schedule, p.flops, p.m, 1))
    return out


def compared_columns(kind: str) -> tuple[str, str]:
    """(measured, predicted) columns compared: all modelled categories where the step's peaks were measured,
    else the model states between steps."""
    if kind == rows.PEAK:
        return "measured_categories", "predicted_total"
    return "measured_states", "predicted_states"


def total_column(kind: str) -> str:
    """The measured total over stages: each rank's peak of all its tensors, else its model states at rest."""
    return "measured_total" if kind == rows.PEAK else "measured_states"


def error_table(parts, kind: str):
    """Memory summed over stages (MiB) and time (ms) per run, measured and predicted, with signed errors, sorted
    by machine, schedule and partition, under the names the chapter shows."""
    measured_col, predicted_col = compared_columns(kind)
    table = parts[["machine", "schedule", "partition", "measured_total", measured_col, predicted_col, "measured_s",
                   "predicted_s"]].copy()
    table["measured_total"] /= MIB
    table["memory error"] = signed_error(table[predicted_col], table[measured_col])
    table["time error"] = signed_error(table["predicted_s"], table["measured_s"])
    table[measured_col] /= MIB
    table[predicted_col] /= MIB
    table["measured_s"] *= 1e3
    table["predicted_s"] *= 1e3
    table = table.rename(columns={"measured_total": "measured peak, all tensors (MiB)",
                                  measured_col: "measured, modelled categories (MiB)", predicted_col: "predicted (MiB)",
                                  "measured_s": "measured (ms)", "predicted_s": "predicted (ms)"})
    return table.sort_values(["machine", "schedule", "partition"])


def memory_error(fresh_parts, kind: str):
    """The signed memory error of each run of :func:`error_table`'s comparison."""
    measured_col, predicted_col = compared_columns(kind)
    return signed_error(fresh_parts[predicted_col], fresh_parts[measured_col])


def memory_error_range(fresh_parts, kind: str) -> str:
    """The range of :func:`memory_error` over the runs, e.g. "-1.0% to +2.0%"."""
    return span(memory_error(fresh_parts, kind), "+.1%")


def total_rises(fresh_parts, kind: str, policies=None) -> tuple[dict, list[str]]:
    """Per schedule with a uniform split: (measured rise of the largest total over the uniform one, that
    partition, the largest predicted rise) among the runs whose policy is in ``policies`` (every run when None);
    and the sentence on each."""
    peak_col = total_column(kind)
    findings, rises = [], {}
    if policies is not None:
        fresh_parts = fresh_parts[fresh_parts.policy.isin(policies)]
    for sched, part in fresh_parts.groupby("schedule"):
        uni = part[part.policy == "uniform"]
        if uni.empty:
            continue
        base_meas, base_pred = uni.iloc[0][peak_col], uni.iloc[0]["predicted_total"]
        worst = part.loc[part[peak_col].idxmax()]
        rises[sched] = (worst[peak_col] / base_meas - 1, worst.partition,
                        part["predicted_total"].max() / base_pred - 1)
        findings.append(f"under {sched} the largest measured total ({worst.partition}) is "
                        f"{worst[peak_col] / base_meas - 1:+.1%} against the uniform split's "
                        f"(predicted: the largest is {part['predicted_total'].max() / base_pred - 1:+.1%})")
    return rises, findings


def findings_sentence(findings: list[str]) -> str:
    """The sentences of :func:`total_rises` joined, or why there are none."""
    return "; ".join(findings) or "no uniform reference was measured"


def statistics(kind: str, rises: dict) -> dict:
    """The rule's statistic (:mod:`distperf.analysis.verdicts`): the largest rise of the measured total over the
    uniform split under 1F1B among the realistic partitioners (``rises`` from :func:`total_rises` with
    ``policies=REALISTIC``); NaN where only model states at rest were measured (their total is the same under every
    split, so they cannot decide)."""
    one = rises.get("1f1b")
    return {"rise": float(one[0]) if kind == rows.PEAK and one is not None else math.nan}


def reason(kind: str, rises: dict) -> str:
    """What the measured totals say, in words: why nothing was decided, which split raised the total, or that none
    did by more than the rule's threshold."""
    one = rises.get("1f1b")
    if kind != rows.PEAK:
        return ("only the model states between steps were measured here: they sum to the same total under every "
                "partition, so the claim rests on the predicted activations")
    if one is not None and one[0] >= RISE_THRESHOLD:
        return (f"under 1F1B the {one[1]} split holds {one[0]:.1%} more memory in total than the uniform one; the "
                f"framework predicted {one[2]:+.1%} for the worst split, from the layers a stage keeps for more "
                "microbatches at once")
    return f"no partition raised the measured total by {RISE_THRESHOLD:.0%} or more over the uniform split"

def policy_splits(fresh_parts) -> dict:
    """The splits (layers per stage) each balancing policy chose, or "not measured"."""
    return {pol: " and ".join(sorted(set(fresh_parts[fresh_parts.policy == pol].split))) or "not measured"
            for pol in ("by time", "by parameters")}


def time_split_reason(fresh_parts) -> str:
    """Whether the split balanced by time put more layers on the first stage than on the last, and why it
    matters under 1F1B."""
    tsplit = fresh_parts[fresh_parts.policy == "by time"]
    early = bool(len(tsplit)) and all(int(x.split(",")[0]) > int(x.split(",")[-1]) for x in tsplit.split)
    return ("it put more layers on the first stage, where 1F1B keeps them for more microbatches at once" if early
            else "it did not put more layers on the first stage than on the last")


def finding(rises: dict, kind: str) -> str:
    """The chapter's finding in one sentence."""
    one = rises.get("1f1b")
    if one is None:
        return "No 1F1B partitioning run was measured."
    return (f"Under 1F1B on two stages the {one[1]} partition changes total memory by {one[0]:+.1%} "
            f"({kind}) against the uniform split; the framework predicts {one[2]:+.1%} at most.")


def draw_stages(stages, parts, kind: str):
    """Per schedule and partition, each stage's predicted bytes stacked by category beside the measured sum of
    the categories (this build's runs)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    from ..plots import PALETTE

    fresh = stages[stages.source == "fresh"]
    scheds = list(dict.fromkeys(fresh.schedule))
    order = list(dict.fromkeys(parts[parts.source == "fresh"].sort_values("first_layers").partition))
    fig, axes = plt.subplots(1, len(scheds), figsize=(3.9 * len(scheds), 4.0), sharey=True, squeeze=False)
    colours = dict(zip(MEMORY_CATEGORIES, sns.color_palette(PALETTE, len(MEMORY_CATEGORIES))))
    for ax, sched in zip(axes[0], scheds):
        part = fresh[fresh.schedule == sched]
        labels = [p for p in order if p in set(part.partition)]
        for i, p in enumerate(labels):
            for r, offset in ((0, -0.2), (1, 0.2)):
                cell = part[(part.partition == p) & (part.stage == r)].set_index("category")
                _stacked_bar(ax, i + offset, cell, colours, first=(i, r) == (0, 0))
                total = cell["measured"].sum(skipna=True) / MIB
                ax.scatter(i + offset, total, marker="_" if kind == rows.PEAK else "x", color="black", s=160,
                           zorder=3, label=("measured: sum of categories" if (i, r) == (0, 0) else None))
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize="x-small")
        ax.set_title(sched, fontsize="small")
    axes[0][0].set_ylabel("MiB per stage")
    axes[0][-1].legend(fontsize="x-small", bbox_to_anchor=(1.02, 1), loc="upper left")
    fig.tight_layout()
    return fig


def _stacked_bar(ax, x: float, cell, colours: dict, first: bool) -> None:
    """One stage's predicted bytes (MiB) stacked by category; the first bar labels the categories."""
    bottom = 0.0
    for c in MEMORY_CATEGORIES:
        value = cell.loc[c, "predicted"] / MIB
        ax.bar(x, value, bottom=bottom, width=0.38, color=colours[c], edgecolor="white",
               label=c.replace("_", " ") if first else None)
        bottom += value


def draw_total(parts, kind: str):
    """Memory summed over stages against the layers on the first stage, measured and predicted
    (:func:`distperf.plots.measured_vs_predicted`); where only model states were measured, grey dotted lines add
    the predicted total with activations."""
    from ..plots import measured_vs_predicted

    measured_col, predicted_col = compared_columns(kind)
    plot = parts.copy()
    plot["series"] = plot["schedule"] + ", " + plot["machine"]
    plot["measured_mib"] = plot[measured_col] / MIB
    plot["predicted_mib"] = plot[predicted_col] / MIB
    plot["predicted_total_mib"] = plot["predicted_total"] / MIB
    fig = measured_vs_predicted(plot, x="first_layers", measured="measured_mib", predicted="predicted_mib",
                                hue="series", xlabel="layers on the first stage", logx=False, logy=False,
                                ylabel="total over both stages (MiB)")
    if kind != rows.PEAK:
        for _, part in plot.sort_values("first_layers").groupby("schedule"):
            fig.axes[0].plot(part.first_layers, part.predicted_total_mib, ls=":", color="grey", lw=1)
    return fig



def allocator_totals(runs) -> pd.DataFrame:
    """Per run: the allocator's view beside the tensors' — the sum over the ranks of the rise of the resident set
    over the measured step (``rss_peak_increase``, CPU) or of the caching allocator's peak (``cuda_max_allocated``,
    CUDA), with the machine, schedule and partition (as :func:`partition_tables` names them)."""
    out = []
    for _, row in runs.iterrows():
        cfg = rows.config_of_row(row)
        split = ",".join(map(str, stage_layers(cfg.model, cfg.layout)))
        values = {}
        for key in ("rss_peak_increase", "cuda_max_allocated"):
            cell = rows.json_cell(row.get(f"memory_bytes.per_rank.{key}"))
            if isinstance(cell, list) and cell and all(v is not None for v in cell):
                values[key] = float(sum(cell))
        out.append(dict(machine=row.machine, source=row.source, schedule=cfg.layout.schedule,
                        partition=f"{split} ({policy_label(row['arg.partition'])})",
                        allocator_total=values.get("cuda_max_allocated", values.get("rss_peak_increase", math.nan)),
                        allocator_kind="CUDA allocator peak" if "cuda_max_allocated" in values else
                        "resident-set rise" if values else "not measured"))
    return pd.DataFrame(out)


def predicted_depths(cfg, depths=DEPTHS, layers: int = DEEP_LAYERS, policies=("uniform", "params", "flops")):
    """The cost model's total and largest stage over the stages, for the measured model made ``layers`` deep, at each
    pipeline depth and analytical partitioner (``time`` needs a measurement, so it is left out), under 1F1B with
    max(m, depth) microbatches: one row per depth and policy, with ``rise`` of the total over the uniform split's."""
    from dataclasses import replace

    from ..cost.predict import predict
    from ..parallel.partition import resolve

    out = []
    for depth in depths:
        base = replace(cfg, model=replace(cfg.model, layers=layers),
                       layout=replace(cfg.layout, pp=depth, schedule="1f1b", partition=(),
                                      microbatches=max(cfg.layout.microbatches, depth)))
        for policy in policies:
            c = resolve(base, policy)
            stages = predict(c, check=False)["memory_bytes_per_stage"]
            out.append(dict(depth=depth, policy=POLICIES[policy], split=",".join(map(str, c.layout.partition)),
                            total=float(sum(stages)), largest=float(max(stages))))
    table = pd.DataFrame(out)
    uniform = table[table.policy == "uniform"].set_index("depth").total
    table["rise"] = table.total / table.depth.map(uniform) - 1
    return table


def draw_depths(table):
    """The predicted rise of the total memory over the uniform split against the pipeline depth, per partitioner."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for policy, part in table.groupby("policy", sort=False):
        ax.plot(part.depth, part.rise * 100, "o-", label=policy)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(DEPTHS), [str(d) for d in DEPTHS])
    ax.set_xlabel("pipeline depth (stages)")
    ax.set_ylabel("predicted total over uniform (%)")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig
