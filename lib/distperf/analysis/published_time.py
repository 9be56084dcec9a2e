"""The cost model against published step times at paper scale ("Against published step times").

Two published sets of measurements on Selene (DGX A100 80 GB, 8 GPUs and 8 × 200 Gbit/s HDR InfiniBand a node),
both in ``data/published/`` (values in ``values.csv``, layouts in ``layouts.csv``):

- :data:`FIT`, Narayanan et al. 2021 (Megatron-LM on GPU clusters), Table 1: the achieved teraFLOP/s per GPU of
  ten GPT models from 1.7 B to 1 T parameters. A rate becomes a time with the paper's own FLOP count (full
  recomputation, 96BsLh²(1 + s/6h + V/16Lh), Eq. (3) of the analytical framework's chapter):
  T = F / (N · rate).
- :data:`VALIDATE`, Korthikanti et al. 2022, Table 5: the iteration times of four models (22 B to 1 T) with full
  recomputation and with sequence parallelism + selective recomputation.

The prediction is :func:`distperf.cost.predict` under the papers' convention (mixed precision, Adam, Megatron-LM's
vocabulary-parallel head and scatter/gather pipeline sends) on the ``A100-80GB`` preset, for the model both papers
trained (Megatron-LM's GPT: dropout 0.1, the unfused attention whose s×s scores Korthikanti et al. count) and with
Megatron-LM's data parallelism of the time: its ``local`` DDP accumulates every gradient into one contiguous
buffer and all-reduces that buffer once the backward is over (``allreduce_gradients`` after the forward-backward
pass in ``train_step``), so nothing of it overlaps: one bucket (:data:`ONE_BUCKET`).

The preset's datasheet rates make it a lower bound; three constants scale it to what such a cluster achieves:
``flops_efficiency`` (the fraction of the 16-bit peak the matrix products reach), ``link_efficiency`` (the
fraction of the datasheet bandwidths, NVLink and InfiniBand alike, that collectives and sends reach) and
``memory_passes`` (the memory-bound operators' traffic in units of the bytes a layer stashes, at the HBM
bandwidth: :func:`distperf.cost.activations.layer_traffic_bytes`). :func:`fit` finds the three that minimise the
mean |signed error| on the FIT rows only (a grid, so the result does not depend on a starting point); the VALIDATE
rows are then predicted with them, never having been seen. A test checks that changing a validation row changes no
fitted constant.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
from dataclasses import dataclass
from functools import lru_cache

import pandas as pd

from .. import published
from ..config import Config
from ..cost import predict
from ..hardware import PRESETS, Hardware
from ..results import DATA

LAYOUTS = DATA / "published" / "layouts.csv"
FIT = ("narayanan2021efficient", "Table 1")
VALIDATE = ("korthikanti2022reducing", "Table 5")
ROLES = {FIT: "fit", VALIDATE: "validation"}
QUANTITIES = ("iteration time", "achieved teraFLOP/s per GPU")  # the published rows that are times or rates
# the grid of the three constants: 0.30 … 1.00 of the datasheet's FLOP/s, 0.10 … 1.00 of its bandwidths, and
# 0 … 4 passes over the stashed bytes
FLOPS_GRID = tuple(round(0.30 + 0.01 * i, 2) for i in range(71))
LINK_GRID = tuple(round(0.10 + 0.05 * i, 2) for i in range(19))
PASSES_GRID = tuple(0.25 * i for i in range(17))
ONE_BUCKET = 1e18  # bytes: the whole gradient in one all-reduce after the backward (Megatron-LM's local DDP)


@dataclass(frozen=True)
class Case:
    """One published measurement and the configuration it was measured on."""

    source: str
    where: str
    item: str
    config: Config
    gpus: int
    hardware: str
    measured_s: float  # iteration time, published or derived from a published rate
    published: str  # the published value as printed, with its unit

    @property
    def role(self) -> str:
        return ROLES.get((self.source, self.where), "other")


def layouts() -> dict[str, dict]:
    """{item: its layout row} of ``layouts.csv``."""
    with open(LAYOUTS, newline="") as f:
        return {row["item"]: row for row in csv.DictReader(f)}


def config_of(layout: dict) -> Config:
    """The :class:`~distperf.config.Config` of a published layout: its model (dropout 0.1 and the unfused attention
    of Megatron-LM's GPT), its parallel layout (data-parallel degree N / (t·p)), batch, schedule, recomputation,
    sequence parallelism, and mixed precision with Adam."""
    from ..flags import add_config_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    gpus, tp, pp = int(layout["gpus"]), int(layout["tp"]), int(layout["pp"])
    args = ["--model", "megatron-1.7b", "--layers", layout["layers"], "--hidden", layout["hidden"],
            "--heads", layout["heads"], "--vocab", layout["vocab"], "--seq", layout["seq"],
            "--tp", str(tp), "--pp", str(pp), "--dp", str(gpus // (tp * pp)),
            "--micro-batch", layout["micro_batch"], "--global-batch", layout["global_batch"],
            "--recompute", layout["recompute"], "--precision", "mixed", "--optimizer", "adam",
            "--dropout", "--attention", "math"]
    if layout["schedule"] != "none":
        args += ["--schedule", layout["schedule"], "--chunks", layout["chunks"]]
    if layout["sequence_parallel"] == "1":
        args.append("--sequence-parallel")
    return config_from_args(parser.parse_args(args))


def paper_flops(cfg: Config) -> float:
    """Megatron-LM's FLOPs of one iteration with full recomputation (the count behind Table 1's rates):
    96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h)) (Narayanan et al. 2021, Eq. (3))."""
    spec, lay = cfg.model, cfg.layout
    B = lay.micro_batch * lay.microbatches * lay.dp
    L, h, s, V = spec.layers, spec.hidden, spec.seq, spec.vocab
    return 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))


@lru_cache(maxsize=1)
def cases() -> tuple[Case, ...]:
    """Every published measurement of FIT and VALIDATE, with its configuration and measured seconds."""
    out = []
    by_item = layouts()
    for source, where in (FIT, VALIDATE):
        for row in (r for q in QUANTITIES for r in published.select(source=source, where=where, quantity=q)):
            layout = by_item[row["item"]]
            cfg = config_of(layout)
            gpus = int(layout["gpus"])
            if row["unit"] == "s":
                seconds = row["value"]
            elif row["unit"] == "TFLOP/s":
                seconds = paper_flops(cfg) / (gpus * row["value"] * 1e12)
            else:
                raise ValueError(f"{row['item']}: a {row['unit']} cannot be compared with a predicted time")
            out.append(Case(source, where, row["item"], cfg, gpus, layout["hardware"], seconds,
                            f"{row['value']:g} {row['unit']}"))
    return tuple(out)


def scaled(hw: Hardware, flops_efficiency: float, link_efficiency: float, memory_passes: float = 0.0) -> Hardware:
    """``hw`` with its matrix rate and link bandwidths scaled and its memory-bound passes set (the fitted
    constants)."""
    return dataclasses.replace(hw, name=f"{hw.name} (fitted)", flops_efficiency=flops_efficiency,
                               intra_bandwidth=hw.intra_bandwidth * link_efficiency,
                               inter_bandwidth=hw.inter_bandwidth * link_efficiency, memory_passes=memory_passes)


def predicted(case: Case, hw: Hardware | None = None) -> dict:
    """The cost model's time terms for ``case`` on ``hw`` (default: its datasheet preset), papers' convention, the
    gradients all-reduced in one bucket after the backward."""
    result = predict(case.config, hw or PRESETS[case.hardware], bucket_bytes=ONE_BUCKET, convention="paper",
                     backend="nccl")
    return result["time_s"]


def signed_error(predicted_s: float, measured_s: float) -> float:
    return predicted_s / measured_s - 1


def mean_abs_error(rows, hw: Hardware) -> float:
    return sum(abs(signed_error(predicted(c, hw)["iteration"], c.measured_s)) for c in rows) / len(rows)


def fit(rows) -> tuple[float, float, float]:
    """(flops_efficiency, link_efficiency, memory_passes) that minimise the mean |signed error| of ``rows`` (all on
    one preset) on :data:`FLOPS_GRID` × :data:`LINK_GRID` × :data:`PASSES_GRID`: every fifth, second and fourth
    point of the grid first, then every point within one coarse step of the best of those (a twentieth of the
    work of the whole grid); ties go to the first."""
    rows = tuple(rows)
    base = PRESETS[rows[0].hardware]
    if any(c.hardware != base.name for c in rows):
        raise ValueError("fit: every row must be on the same hardware")

    def best(flops, links, passes):
        return min(((mean_abs_error(rows, scaled(base, f, k, m)), f, k, m)
                    for f in flops for k in links for m in passes), key=lambda x: x[0])

    _, f0, k0, m0 = best(FLOPS_GRID[::5], LINK_GRID[::2], PASSES_GRID[::4])
    i, j, n = FLOPS_GRID.index(f0), LINK_GRID.index(k0), PASSES_GRID.index(m0)
    _, f, k, m = best(FLOPS_GRID[max(0, i - 5):i + 6], LINK_GRID[max(0, j - 2):j + 3],
                      PASSES_GRID[max(0, n - 4):n + 5])
    return f, k, m


def edge_text(constants: tuple[float, float, float], rows) -> str:
    """Which fitted constants lie on an edge of their grid, and for each the fit ``rows``' mean |signed error| one
    grid step beyond it against at it (whether the data would take the constant further than the grid lets it)."""
    names = ("the matrix products' fraction of the peak", "the links' fraction of the datasheet",
             "the memory-bound passes")
    rows = tuple(rows)
    base = PRESETS[rows[0].hardware]
    at = mean_abs_error(rows, scaled(base, *constants))
    edges = []
    for i, (name, grid) in enumerate(zip(names, (FLOPS_GRID, LINK_GRID, PASSES_GRID))):
        value = constants[i]
        if value not in (grid[0], grid[-1]):
            continue
        upper = value == grid[-1]
        beyond = list(constants)
        beyond[i] = value + (grid[-1] - grid[-2] if upper else grid[0] - grid[1])
        error = mean_abs_error(rows, scaled(base, *beyond))
        edges.append(f"{name} lies at the grid's {'upper' if upper else 'lower'} end ({value:g}); one step beyond "
                     f"({beyond[i]:g}) the fit rows' mean |error| would be {error:.2%} against {at:.2%}")
    return "; ".join(edges) if edges else "no constant lies on an edge of its grid"


def table(constants: tuple[float, float]) -> pd.DataFrame:
    """One row per published measurement: its role (fit or validation), measured seconds, and the prediction with
    the datasheet preset and with the fitted ``constants`` (:func:`fit`), each with its signed error and time
    terms."""
    rows = []
    for c in cases():
        base = PRESETS[c.hardware]
        raw, tuned = predicted(c, base), predicted(c, scaled(base, *constants))
        lay = c.config.layout
        rows.append({"source": c.source, "where": c.where, "item": c.item, "role": c.role, "GPUs": c.gpus,
                     "layout": f"t{lay.tp} p{lay.pp} d{lay.dp}" + (f" v{lay.chunks}" if lay.chunks > 1 else ""),
                     "published": c.published, "measured_s": c.measured_s,
                     "datasheet_s": raw["iteration"], "datasheet_error": signed_error(raw["iteration"], c.measured_s),
                     "fitted_s": tuned["iteration"], "fitted_error": signed_error(tuned["iteration"], c.measured_s),
                     "compute_s": tuned["compute"], "communication_s": tuned["communication_exposed"],
                     "bubble_s": tuned["bubble"]})
    return pd.DataFrame(rows)


def summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Mean and largest |signed error| per role, with the datasheet preset and with the fitted constants."""
    out = []
    for role, part in frame.groupby("role", sort=False):
        out.append({"rows": role, "n": len(part),
                    "datasheet: mean |error|": part.datasheet_error.abs().mean(),
                    "datasheet: max |error|": part.datasheet_error.abs().max(),
                    "fitted: mean |error|": part.fitted_error.abs().mean(),
                    "fitted: max |error|": part.fitted_error.abs().max(),
                    "fitted: mean signed error": part.fitted_error.mean()})
    return pd.DataFrame(out)


def statistics(frame: pd.DataFrame, comparison: pd.DataFrame | None = None) -> dict:
    """The verdict's statistics: the validation rows' mean and largest |signed error| with the fitted constants,
    and the share of PipeDream-2BW's published speed-ups predicted within the tolerance (:func:`ratio_share`)."""
    out = {} if comparison is None or comparison.empty else {"twobw_ratios": ratio_share(comparison)}
    val = frame[frame.role == "validation"]
    if val.empty:
        return out
    return {**out, "validation_mean": float(val.fitted_error.abs().mean()),
            "validation_max": float(val.fitted_error.abs().max())}


def misses_text(frame: pd.DataFrame) -> str:
    """The validation rows the fitted model misses by more than the mean, each with its signed error and the share
    of its predicted time that is bubble and exposed communication, from the data."""
    val = frame[frame.role == "validation"]
    if val.empty:
        return "no validation row"
    limit = val.fitted_error.abs().mean()
    worst = val[val.fitted_error.abs() > limit].sort_values("fitted_error", key=abs, ascending=False)
    parts = [f"{r.item} ({r.fitted_error:+.1%}; bubble {r.bubble_s / r.fitted_s:.0%} and exposed communication "
             f"{r.communication_s / r.fitted_s:.0%} of the predicted time)" for r in worst.itertuples()]
    side = "over" if (worst.fitted_error > 0).all() else "under" if (worst.fitted_error < 0).all() else None
    lead = f"all {side}-predicted" if side else "on both sides"
    return (f"{len(parts)} of {len(val)} validation rows miss by more than the mean |error| of {limit:.1%}, "
            f"{lead}: " + "; ".join(parts)) if parts else f"no validation row misses by more than {limit:.1%}"


def finding(frame: pd.DataFrame) -> str:
    """One sentence for the landing page: the validation rows' mean and largest |signed error| with the fitted
    constants, against the datasheet preset's."""
    val = frame[frame.role == "validation"]
    if val.empty:
        return "no published step time was predicted"
    return (f"fitted on Megatron-LM's Table 1, the framework predicts the {len(val)} iteration times of "
            f"Korthikanti et al.'s Table 5 with a mean |error| of {val.fitted_error.abs().mean():.1%} (largest "
            f"{val.fitted_error.abs().max():.1%}); the datasheet rates alone miss them by "
            f"{val.datasheet_error.mean():+.0%} on average")


def fit_subset_check(rows) -> list[str]:
    """The items of ``rows`` that are not FIT rows (an empty list is the split holding)."""
    return [c.item for c in rows if (c.source, c.where) != FIT]


def draw(frame: pd.DataFrame):
    """Predicted against published iteration time, log-log: the datasheet preset (open markers) and the fitted
    constants (filled), circles for the fit rows and squares for the validation rows, the diagonal and ±10 %."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 5.2))
    for role, marker in (("fit", "o"), ("validation", "s")):
        part = frame[frame.role == role]
        ax.scatter(part.measured_s, part.datasheet_s, marker=marker, facecolors="none", edgecolors="0.5",
                   label=f"{role} rows, datasheet preset")
        ax.scatter(part.measured_s, part.fitted_s, marker=marker, color="C0" if role == "fit" else "C1",
                   label=f"{role} rows, fitted constants")
    low, high = frame.measured_s.min() / 2, frame.measured_s.max() * 2
    for factor, style in ((1.0, "-"), (1.1, ":"), (0.9, ":")):
        ax.plot([low, high], [low * factor, high * factor], style, color="0.3", lw=0.8)
    ax.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high), xlabel="published iteration time (s)",
           ylabel="predicted iteration time (s)")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


# PipeDream-2BW's published speed-ups (§5.2, Fig. 6) and how the framework's are taken from the planner's plans
TWOBW_SOURCE = "narayanan2021memory"
TWOBW_RATIOS = (  # (published item, quantity, against, over which cases the predicted ratio is the largest)
    ("2BW against PipeDream-Flush", "speed-up, at most", "1f1b", "every case"),
    ("2BW against GPipe", "speed-up, at most", "gpipe", "every case GPipe fits"),
    ("2BW against PipeDream-Flush, batch 2048", "speed-up", "1f1b", "batch 2048"),
)
RATIO_TOLERANCE = 0.15  # a speed-up within 15 % of the paper's counts as reproduced (the rule's third criterion)


def schedule_throughputs(rates: dict, cases, models, gpus_per_node: int, node_bandwidth: float) -> pd.DataFrame:
    """For each model, rate and (GPUs, global batch) case: the planner's best throughput of each pipeline schedule
    (2BW, PipeDream-Flush, GPipe), each with its own best width, depth, microbatch and recomputation that fit in
    memory (NaN where none fits), and the ratios 2BW/Flush and 2BW/GPipe."""
    from .. import presets
    from ..planner import plan

    rows = []
    for name in models:
        model = presets.model(name)
        for label, hw in rates.items():
            for gpus, batch in cases:
                best, bubble = {}, float("nan")
                for schedule in ("2bw", "1f1b", "gpipe"):
                    plans = plan(model, gpus, hw, batch, gpus_per_node=gpus_per_node, node_bandwidth=node_bandwidth,
                                 schedules=(schedule,), baselines=False)["plans"]
                    best[schedule] = plans[0]["throughput"] if plans else float("nan")
                    if schedule == "1f1b" and plans:
                        bubble = plans[0]["bubble_fraction"]
                rows.append({"model": name, "rate": label, "GPUs": gpus, "batch": batch, **best,
                             "2BW/Flush": best["2bw"] / best["1f1b"], "2BW/GPipe": best["2bw"] / best["gpipe"],
                             "Flush bubble": bubble})
    return pd.DataFrame(rows)


def twobw_comparison(throughputs: pd.DataFrame, rate: str) -> pd.DataFrame:
    """Each published 2BW speed-up beside the framework's at ``rate``: the largest predicted ratio over the cases
    :data:`TWOBW_RATIOS` names, its relative difference from the paper's, and whether it is within
    :data:`RATIO_TOLERANCE`."""
    at = throughputs[throughputs.rate == rate]
    rows = []
    for item, quantity, against, over in TWOBW_RATIOS:
        column = "2BW/Flush" if against == "1f1b" else "2BW/GPipe"
        part = at[at.batch == 2048] if over == "batch 2048" else at
        values = part[column].dropna()
        paper = published.value(item, quantity, source=TWOBW_SOURCE)
        ours = float(values.max()) if len(values) else float("nan")
        rows.append({"published": item, "paper": paper, "framework": ours, "over": over,
                     "difference": ours / paper - 1, "within 15 %": bool(abs(ours / paper - 1) <= RATIO_TOLERANCE)})
    return pd.DataFrame(rows)


def ratio_misses_text(throughputs: pd.DataFrame, comparison: pd.DataFrame, rate: str) -> str:
    """Why the framework's 2BW speed-ups differ from the paper's, from the plans: the bubble of Flush's best plan
    where 2BW/Flush is largest against the bubble the paper's largest speed-up needs (a flush-free schedule gains
    at most 1/(1 − bubble)), and in how many cases GPipe fits at all."""
    at = throughputs[throughputs.rate == rate]
    if at.empty or at["2BW/Flush"].dropna().empty:
        return "no case was planned"
    top = at.loc[at["2BW/Flush"].idxmax()]
    flush = comparison[comparison.published == TWOBW_RATIOS[0][0]].iloc[0]
    needed = 1 - 1 / flush.paper
    fits = int(at["gpipe"].notna().sum())
    return (f"where the framework's 2BW/Flush is largest ({top.model}, {top.GPUs} GPUs, batch {top.batch}), "
            f"Flush's best plan loses {top['Flush bubble']:.0%} of its iteration to the bubble; the paper's "
            f"{flush.paper:g}× would need {needed:.0%}. GPipe fits in memory in {fits} of {len(at)} cases")


def ratio_share(comparison: pd.DataFrame) -> float:
    """The share of the published 2BW speed-ups the framework predicts within the tolerance."""
    return float(comparison["within 15 %"].mean()) if len(comparison) else float("nan")
