"""What the planner chapter (``chapters/planner.md``) computes: :func:`distperf.planner.plan` at the
PipeDream-2BW paper's scale against the depths the paper's planner chose, and the planner's ranking of two
ranks' configurations against their measured throughput.

- :func:`paper_depths`, :func:`compute_rates`, :data:`PAPER_CASES`, :data:`PAPER_NODE_BANDWIDTH`: the paper's
  setting (§5.2), its published depths and rate from :mod:`distperf.published`;
- :func:`time_plan`, :func:`choice_text`: how long planning takes, and what it picks;
- :func:`paper_scale_plans` and the functions after it: the first choices at the paper's scale, how many equal
  the paper's depth, and why the others do not (:func:`depth_gap`, :func:`memory_flip`);
- :func:`with_layout` … :func:`ranking_table`: the planner's two rankings (compute from FLOPs, and from
  profiled layer times) beside the measured runs, :func:`spearman`'s ρ and each first choice;
- :func:`verdict`, :func:`finding`: the chapter's verdict and its one-line finding.
"""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pandas as pd

from .. import presets, published, results
from ..cost import clear_caches
from ..hardware import GIB, Hardware
from ..planner import candidates, plan
from .rows import global_batch as global_batches
from .verdicts import share

PAPER_MODELS = ("2bw-gpt-2.2b", "2bw-gpt-3.8b")
PAPER_GPUS = 64
# Devices and global batch of the paper's GPT runs on V100s (§5.2, Fig. 6).
PAPER_CASES = ((8, 64), (8, 256), (64, 512), (64, 2048))
PAPER_GPUS_PER_NODE = 8
PAPER_NODE_BANDWIDTH = 25e9 / 8  # the paper's p3.16xlarge servers: 25 Gbit/s per node, in bytes/s
PAPER_ACHIEVED = "achieved 16-bit throughput"
# The planner's choice and the runs' configurations share these fields.
KEY = ["strategy", "schedule", "w", "d", "tp", "micro_batch", "recompute"]
PROFILED_TIMES = "prediction.profiled.layer_times"
LAYER_PARTS = ("layer", "embedding", "head")


def paper_depths(models=PAPER_MODELS, gpus: int = PAPER_GPUS) -> dict[str, int]:
    """The pipeline depth the paper's planner chose for each model on ``gpus`` V100s (§5.2), published."""
    return {name: int(published.value(f"{name} on {gpus} V100", "planner's pipeline depth")) for name in models}


def achieved_tflops() -> float:
    """The 16-bit rate one V100 achieved on the paper's GPT (TFLOP/s, §5), published."""
    return published.value("GPT 355M on one V100", PAPER_ACHIEVED)


def compute_rates(hw: Hardware, achieved: float) -> dict[str, Hardware]:
    """The hardware at its 16-bit peak and at ``achieved`` TFLOP/s (efficiency achieved / peak), by label."""
    peak = hw.flops_16bit / 1e12
    return {f"peak ({peak:g} TFLOP/s)": hw,
            f"achieved ({achieved:g} TFLOP/s)": replace(hw, flops_efficiency=achieved * 1e12 / hw.flops_16bit)}


def short_name(model: str) -> str:
    """A 2BW preset's size as the table shows it: ``2bw-gpt-2.2b`` → ``2.2B``."""
    return model.removeprefix("2bw-gpt-").upper()


def time_plan(model, gpus: int, hw: Hardware, global_batch: int, repeats: int = 3, **options) -> tuple[float, dict]:
    """The shortest of ``repeats`` CPU times of :func:`~distperf.planner.plan` from cold caches (s: what the
    planner costs, whatever else the machine runs — the book's pages execute side by side), and the plan."""
    timings = []
    for _ in range(repeats):
        clear_caches()
        start = time.process_time()
        result = plan(model, gpus, hw, global_batch, **options)
        timings.append(time.process_time() - start)
    return min(timings), result


def candidate_count(model, gpus: int) -> int:
    """How many configurations the planner evaluates for ``model`` on ``gpus`` devices."""
    return len(candidates(model, gpus))


def choice_text(plans: list[dict]) -> str:
    """The first plan in words (schedule, w, d, b, recomputation), or that nothing fits."""
    if not plans:
        return "nothing fits"
    top = plans[0]
    return (f"{top['schedule']} with w = {top['w']}, d = {top['d']}, b = {top['micro_batch']}, recomputation "
            f"{top['recompute']}")


def first_choice_row(model: str, rate: str, gpus: int, batch: int, first: dict, paper_depth) -> dict:
    """One row of the paper-scale table: the planner's first choice for ``model`` at ``rate``."""
    return {"model": short_name(model), "compute rate": rate, "GPUs": gpus, "global batch": batch,
            "schedule": first["schedule"] if first["strategy"] == "pipeline" else first["strategy"],
            "w": first["w"], "d": first["d"], "t": first["tp"], "b": first["micro_batch"],
            "recompute": first["recompute"], "m": first["accumulation"], "samples/s": first["throughput"],
            "memory (GiB)": first["memory_bytes"] / GIB, "paper's d": paper_depth}


def paper_scale_plans(depths: dict[str, int], rates: dict[str, Hardware], cases=PAPER_CASES,
                      paper_gpus: int = PAPER_GPUS, **options) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Plan each model of ``depths`` (its paper's depth on ``paper_gpus`` devices) at each rate and (devices,
    global batch) case: the first choices, one row each (``paper's d`` where the paper planned that many
    devices), and every plan that fits, tagged with model, rate, GPUs and batch."""
    rows, every = [], []
    for name, depth in depths.items():
        model = presets.model(name)
        for rate, hw in rates.items():
            for gpus, batch in cases:
                result = plan(model, gpus, hw, batch, **options)
                rows.append(first_choice_row(name, rate, gpus, batch, result["plans"][0],
                                             depth if gpus == paper_gpus else None))
                every += [{"model": name, "rate": rate, "GPUs": gpus, "batch": batch, **e} for e in result["plans"]]
    return pd.DataFrame(rows), pd.DataFrame(every)


def paper_table_format() -> dict:
    """How the paper-scale table shows its numbers (an empty cell where the paper gave no depth)."""
    return {"samples/s": "{:,.0f}", "memory (GiB)": "{:.1f}", "paper's d": lambda v: "" if pd.isna(v) else f"{v:.0f}"}


def at_paper_gpus(paper: pd.DataFrame, gpus: int = PAPER_GPUS) -> pd.DataFrame:
    """The first choices on the paper's device count."""
    return paper[paper.GPUs == gpus]


def chosen_depths(at_paper: pd.DataFrame, model: str) -> list[int]:
    """The depths the planner chose for ``model`` across rates and batches, ascending."""
    return sorted(set(at_paper[at_paper.model == short_name(model)].d))


def paper_hits(at_paper: pd.DataFrame) -> list[tuple]:
    """The (model, rate, batch) cases whose chosen depth equals the paper's."""
    return [(r.model, r["compute rate"], r["global batch"]) for _, r in at_paper.iterrows() if r.d == r["paper's d"]]


def decisions(at_paper: pd.DataFrame) -> pd.DataFrame:
    """The planner's decision beside the paper's for each case the paper planned: model, rate, batch, the chosen
    schedule, width and depth, the paper's depth and whether the two depths agree."""
    out = at_paper[["model", "compute rate", "global batch", "schedule", "w", "d", "paper's d"]].copy()
    out["paper's d"] = out["paper's d"].astype(int)
    out["same depth"] = (out.d == out["paper's d"]).map({True: "yes", False: "no"})
    return out.reset_index(drop=True)


def rate_choices(at_paper: pd.DataFrame, model: str, batch: int) -> str:
    """The depth chosen for ``model`` at ``batch`` under each compute rate, in words."""
    depth = at_paper[(at_paper.model == short_name(model)) & (at_paper["global batch"] == batch)]
    depth = depth.set_index("compute rate").d
    return ", ".join(f"d = {d} at the {rate.split(' ')[0]} rate" for rate, d in depth.items())


def recompute_first(paper: pd.DataFrame) -> str:
    """How many first choices recompute activations, of all."""
    return f"{(paper.recompute != 'none').sum()} of the {len(paper)}"


def gpipe_fit(every: pd.DataFrame) -> str:
    """How many GPipe pipelines fit in memory, without and with recomputation."""
    gpipe = every[(every.schedule == "gpipe") & (every.strategy == "pipeline")]
    return (f"{(gpipe.recompute == 'none').sum()} GPipe configurations without recomputation and "
            f"{(gpipe.recompute != 'none').sum()} with it")


def best_at_depth(plans: list[dict], depth: int) -> dict | None:
    """The fastest pipeline of ``depth`` stages among ``plans``, or None when none fits."""
    return max((e for e in plans if e["d"] == depth and e["strategy"] == "pipeline"),
               key=lambda e: e["throughput"], default=None)


def depth_gap(plans: list[dict], shallow: int, deep: int) -> tuple[str, str]:
    """How much faster the best ``shallow`` pipeline is predicted than the best ``deep`` one (T_shallow/T_deep − 1,
    in throughput), and the shallow one's memory; 'n/a' when either depth does not fit."""
    fast, slow = best_at_depth(plans, shallow), best_at_depth(plans, deep)
    if fast is None or slow is None:
        return "n/a (one depth does not fit)", "n/a"
    return f"{fast['throughput'] / slow['throughput'] - 1:+.0%}", f"{fast['memory_bytes'] / GIB:.1f} GiB"


def memory_flip(model, gpus: int, hw: Hardware, batch: int, depth: int, high_gib: float, low_gib: float,
                step_gib: float, **options) -> float | None:
    """The largest memory limit from ``high_gib`` down to (not including) ``low_gib`` in steps of ``step_gib``
    under which the planner's first choice has ``depth`` stages, or None."""
    for limit_gib in np.arange(high_gib, low_gib, -step_gib):
        choice = plan(model, gpus, hw, batch, memory_limit=limit_gib * GIB, **options)["plans"]
        if choice and choice[0]["d"] == depth:
            return limit_gib
    return None


def flip_text(flip: float | None, high_gib: float, low_gib: float) -> str:
    """:func:`memory_flip`'s answer in words."""
    return f"no limit between {low_gib:g} and {high_gib:g} GiB" if flip is None else f"{flip:.2f} GiB"


def plans_of_case(every: pd.DataFrame, gpus: int, batch: int, rate: str) -> pd.DataFrame:
    """The plans that fit for one case of :func:`paper_scale_plans`: ``gpus`` devices, global ``batch``, ``rate``."""
    return every[(every.GPUs == gpus) & (every.batch == batch) & (every.rate == rate)]


def draw_depth_throughput(every: pd.DataFrame, depths: dict[str, int], gpus: int):
    """Predicted throughput of the best configuration at each depth, per schedule, one panel per model of
    ``depths`` (the paper's depth as a vertical line), with the best data- and tensor-parallel baselines."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.8), sharey=False)
    for ax, name in zip(axes, depths):
        part = every[every.model == name]
        for schedule, marker in (("2bw", "o"), ("1f1b", "s"), ("gpipe", "^")):
            s = part[(part.strategy == "pipeline") & (part.schedule == schedule)].groupby("d").throughput.max()
            ax.plot(s.index, s.values, marker=marker, label=schedule)
        for strategy, style in (("data-parallel", ":"), ("tensor-parallel", "--")):
            s = part[part.strategy == strategy].throughput
            if len(s):
                ax.axhline(s.max(), ls=style, color="grey", label=f"best {strategy}")
        ax.axvline(depths[name], color="black", lw=0.8, label="paper's depth")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(plt.FormatStrFormatter("%d"))
        ax.set_xlabel(f"pipeline depth d (w = {gpus}/d)")
        ax.set_title(name.removeprefix("2bw-"), fontsize="medium")
    axes[0].set_ylabel("predicted samples/s (best b, recomputation)")
    axes[1].legend(fontsize="x-small")
    fig.tight_layout()
    return fig


# --- On this machine: the planner's ranking against measurement --------------------------------------------

def global_batch(runs: pd.DataFrame) -> int:
    """The global batch B = b · m · w of the runs (the first row's; the experiment keeps it fixed)."""
    return int(global_batches(runs).iloc[0])


def with_layout(runs: pd.DataFrame, batch: int) -> pd.DataFrame:
    """The runs with the planner's configuration fields (:data:`KEY`; strategy: pipeline when pp > 1, else
    tensor-parallel when tp > 1, else data-parallel), ``measured`` throughput B / median iteration time and
    ``measured_memory`` (NaN where not measured)."""
    runs = runs.copy()
    lay = {c: runs[f"config.layout.{c}"] for c in ("dp", "tp", "pp", "schedule", "micro_batch", "recompute")}
    runs["strategy"] = np.where(lay["pp"] > 1, "pipeline", np.where(lay["tp"] > 1, "tensor-parallel", "data-parallel"))
    runs["schedule"] = lay["schedule"]
    runs["w"], runs["d"], runs["tp"] = lay["dp"], lay["pp"], lay["tp"]
    runs["micro_batch"], runs["recompute"] = lay["micro_batch"], lay["recompute"]
    runs["measured"] = batch / runs["iteration_time_s.median"]
    runs["measured_memory"] = runs["memory_bytes.total"] if "memory_bytes.total" in runs else np.nan
    return runs


def planner_options(runs: pd.DataFrame, gpus_per_node: int = 2) -> dict:
    """The planner's search restricted to what the runs tried: fp32, their microbatch sizes and recomputation."""
    sizes = sorted(set(runs.micro_batch))
    return dict(precision="fp32", max_micro_batch=max(sizes), recompute=tuple(sorted(set(runs.recompute))),
                gpus_per_node=gpus_per_node)


def profiled_layer_times(runs: pd.DataFrame) -> dict[int, dict]:
    """{micro_batch: {part: (forward_s, backward_s)}} for the layer, embedding and head, as the runs profiled
    them (the first run of each microbatch size that carries all six times)."""
    layer_times = {}
    for b, part in runs.groupby("micro_batch"):
        cols = [f"{PROFILED_TIMES}.{p}.{k}_s" for p in LAYER_PARTS for k in ("forward", "backward")]
        if all(c in part for c in cols) and part[cols].notna().all(axis=None):
            row = part[cols].iloc[0]
            layer_times[int(b)] = {p: (row[f"{PROFILED_TIMES}.{p}.forward_s"], row[f"{PROFILED_TIMES}.{p}.backward_s"])
                                   for p in LAYER_PARTS}
    return layer_times


def rankings(model, hw: Hardware, runs: pd.DataFrame, batch: int, gpus: int = 2) -> dict[str, dict]:
    """The planner's plans on ``gpus`` devices with compute from FLOPs (``FLOPs``) and, where every microbatch
    size of the runs has profiled layer times, from those times (``profiled``)."""
    options = planner_options(runs)
    layer_times = profiled_layer_times(runs)
    plans = {"FLOPs": plan(model, gpus, hw, batch, **options)}
    if set(runs.micro_batch) <= set(layer_times):
        plans["profiled"] = plan(model, gpus, hw, batch, layer_times=layer_times, **options)
    return plans


def with_predictions(runs: pd.DataFrame, plans: dict[str, dict]) -> pd.DataFrame:
    """The runs with, for each ranking ``how``, ``predicted_<how>`` throughput, ``memory_<how>`` and the signed
    error ``error_<how>`` (predicted − measured)/measured (NaN where the planner has no such plan)."""
    for how, result in plans.items():
        frame = pd.DataFrame(result["plans"])[KEY + ["throughput", "memory_bytes"]]
        frame = frame.rename(columns={"throughput": f"predicted_{how}", "memory_bytes": f"memory_{how}"})
        runs = runs.merge(frame, on=KEY, how="left")
        runs[f"error_{how}"] = results.signed_error(runs[f"predicted_{how}"], runs.measured)
    return runs


def spearman(a: pd.Series, b: pd.Series) -> float:
    """Spearman's rank correlation: Pearson's on the ranks (ties get their mean rank), over the rows where both
    have a value; NaN with fewer than three."""
    ok = a.notna() & b.notna()
    return float(np.corrcoef(a[ok].rank(), b[ok].rank())[0, 1]) if ok.sum() > 2 else float("nan")


def configuration_label(row) -> str:
    """A two-rank configuration in words: ``2bw d=2, b=4, recompute``, ``DP w=2, b=1``, ``TP t=2, b=2``."""
    what = {"pipeline": f"{row.schedule} d=2", "data-parallel": "DP w=2", "tensor-parallel": "TP t=2"}[row.strategy]
    return f"{what}, b={row.micro_batch}" + (", recompute" if row.recompute != "none" else "")


def with_labels(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs with their ``configuration`` in words (:func:`configuration_label`)."""
    runs = runs.copy()
    runs["configuration"] = [configuration_label(r) for r in runs.itertuples()]
    return runs


def best_measured(runs: pd.DataFrame) -> pd.Series:
    """The run of the highest measured throughput."""
    return runs.loc[runs.measured.idxmax()]


def ranking_summary(runs: pd.DataFrame, hows) -> dict[str, dict]:
    """For each ranking: Spearman's ``rho`` with the measured order, its ``first`` choice (a run), that run's
    ``share`` of the best measured throughput, and ``n``, the runs it ranked."""
    best = best_measured(runs)
    summary = {}
    for how in hows:
        ranked = runs.dropna(subset=[f"predicted_{how}"])
        first = ranked.loc[ranked[f"predicted_{how}"].idxmax()]
        summary[how] = {"rho": spearman(runs[f"predicted_{how}"], runs.measured), "first": first,
                        "share": first.measured / best.measured, "n": len(ranked)}
    return summary


def model_text(model) -> str:
    """The trained model in words: name, layers, hidden size and sequence length."""
    return f"{model.name} ({model.layers} layers, h = {model.hidden}, s = {model.seq})"


def best_text(best: pd.Series) -> str:
    """The fastest measured configuration and its throughput."""
    return f"{best.configuration} ({best.measured:,.1f} samples/s)"


def first_choice_text(s: dict) -> str:
    """A ranking's first choice, its measured throughput and its share of the measured best."""
    return (f"{s['first'].configuration}, measured {s['first'].measured:,.1f} samples/s, "
            f"{s['share']:.0%} of the measured best")


def modes_sentence(summary: dict[str, dict]) -> str:
    """Which ranking's first choice runs closer to the measured best (empty without a profiled ranking)."""
    if "profiled" not in summary:
        return ""
    f, p = summary["FLOPs"], summary["profiled"]
    better = "profiled layer times" if p["share"] > f["share"] else "FLOPs" if f["share"] > p["share"] else None
    return ((f"Here the first choice from {better} runs closer to the measured best "
             f"({max(p['share'], f['share']):.0%} against {min(p['share'], f['share']):.0%}). "
             if better else "Both modes' first choices run equally close to the measured best. ")
            + "FLOPs over a fixed rate cannot see that a small microbatch runs the layer's matrix products below the "
              "rate that larger ones reach; profiled times can, which is why the paper's planner profiles its blocks.")


def memory_error_text(runs: pd.DataFrame) -> str:
    """The median signed error of the predicted peak memory (FLOPs ranking) and its range, or 'not measured'."""
    err = results.signed_error(runs["memory_FLOPs"], runs.measured_memory)
    return f"{err.median():+.0%} (from {err.min():+.0%} to {err.max():+.0%})" if err.notna().any() else "not measured"


def ranking_table(runs: pd.DataFrame, hows) -> tuple[pd.DataFrame, dict]:
    """Every run, fastest measured first: measured rank and throughput, each ranking's rank, predicted throughput
    and signed error; and the table's number formats."""
    table = runs.sort_values("measured", ascending=False)[["configuration", "measured"]
                                                          + [f"predicted_{h}" for h in hows]
                                                          + [f"error_{h}" for h in hows]]
    table.insert(1, "measured rank", range(1, len(table) + 1))
    for how in hows:
        table.insert(2, f"rank ({how})", table[f"predicted_{how}"].rank(ascending=False, method="min").astype("Int64"))
    table = table.rename(columns={"measured": "measured samples/s",
                                  **{f"predicted_{h}": f"predicted ({h})" for h in hows},
                                  **{f"error_{h}": f"signed error ({h})" for h in hows}})
    fmt = {"measured samples/s": "{:,.1f}", **{f"predicted ({h})": "{:,.1f}" for h in hows},
           **{f"signed error ({h})": "{:+.0%}" for h in hows}}
    return table, fmt


def draw_ranking(runs: pd.DataFrame):
    """Predicted against measured throughput on log axes, one colour per schedule or strategy: circles from
    FLOPs, crosses from profiled layer times; the dashed diagonal is perfect prediction."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    groups = runs.assign(group=np.where(runs.strategy == "pipeline", runs.schedule, runs.strategy))
    for (group, part), colour in zip(groups.groupby("group"), plt.rcParams["axes.prop_cycle"].by_key()["color"]):
        ax.scatter(part.measured, part.predicted_FLOPs, color=colour, marker="o", label=f"{group}, FLOPs")
        if "predicted_profiled" in part:
            ax.scatter(part.measured, part.predicted_profiled, color=colour, marker="x", label=f"{group}, profiled")
    values = runs[[c for c in runs if c.startswith("predicted_")] + ["measured"]].to_numpy()
    lo, hi = np.nanmin(values) * 0.8, np.nanmax(values) * 1.25
    ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(plt.FormatStrFormatter("%g"))
        axis.set_minor_formatter(plt.NullFormatter())
    ax.set_xlabel("measured samples/s")
    ax.set_ylabel("predicted samples/s")
    ax.legend(fontsize="x-small", ncol=2)
    fig.tight_layout()
    return fig


# --- Verdict ------------------------------------------------------------------------------------------------

def statistics(summary: dict[str, dict], hits: int, cases: int) -> tuple[dict, str]:
    """The rule's statistics (:mod:`distperf.analysis.verdicts`) and the ranking they rest on (profiled where
    available, else FLOPs): that ranking's Spearman ρ with the measured one, its first choice's share of the
    measured best, and the share of the paper's ``cases`` in which the planner picks the paper's depth."""
    use = "profiled" if "profiled" in summary else "FLOPs"
    s = summary[use]
    return {"rho": float(s["rho"]), "share": float(s["share"]), "depth_hits": share(hits, cases)}, use

def finding(use: str, s: dict, chosen: dict[str, list[int]], depths: dict[str, int], gpus: int = PAPER_GPUS) -> str:
    """The chapter's finding in one line: the first choice's share of the measured best, ρ, and the depths chosen
    on ``gpus`` devices against the paper's (``chosen`` and ``depths`` by model)."""
    models = [("GPT " if i == 0 else "") + short_name(m) for i, m in enumerate(chosen)]
    picks = " and ".join(f"d = {', '.join(map(str, d))} for {m}" for m, d in zip(models, chosen.values()))
    return (f"first choice ({use}) ran at {s['share']:.0%} of the measured best, Spearman ρ = {s['rho']:+.2f} over "
            f"{s['n']} configurations; on {gpus} V100s it picks {picks} "
            f"(paper: {' and '.join(str(d) for d in depths.values())})")
