"""Claim 1 as a map: the pipeline against data parallelism over link rate × model size × global batch, on two
emulated nodes of one rank (experiment ``network_pp_vs_dp`` of ``notebooks/network.ipynb``), for the chapter
``pp_vs_dp``.

Each cell (model, B, link rate) is measured with repeats; the pipeline *wins* a cell when the 95 % interval of
PP/DP over the repeats lies above 1 (:func:`.pp_vs_dp.winner_table`), data parallelism when it lies below, else
the cell is a tie. The *region* where the pipeline wins is read per (model, B) slice along the rate
(:func:`region_text`); whether the framework predicts the region's *boundary* is judged cell by cell (does it
name the winner of every decisive cell, :func:`boundary_counts`) and, per slice, by the factor between the
measured and the predicted crossover rate (:func:`crossovers`). Predictions use the cost model on the emulated
link's calibrated α-β (:func:`.network.link_hardware`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .network import PREDICTED_RATES, link_hardware, predicted_ratio, rate_text
from .pp_vs_dp import crossover, measured_runs, winner_table

TABLE_FORMAT = {"measured PP/DP": "{:.2f}", "low": "{:.2f}", "high": "{:.2f}", "predicted PP/DP": "{:.2f}",
                "PP/DP memory": "{:.2f}"}
BATCH_COLOURS = ("C0", "C1", "C2", "C3")


def map_runs(rows, hw, fits: dict):
    """The map's runs that succeeded (:func:`.pp_vs_dp.measured_runs` of every repeat's row) with their link
    ``rate`` (bit/s), each predicted on its own emulated link (:func:`.network.link_hardware`, one rank per node)."""
    rows = rows.copy()
    rows["rate"] = rows["network.inter_bit_per_s"].astype(float)
    return measured_runs(rows, lambda r: link_hardware(hw, fits, r["rate"], 1))


def map_cells(runs):
    """One row per (model, B, rate): measured PP/DP with its 95 % interval over the repeats, predicted PP/DP,
    the measured winner ('PP', 'DP' or 'tie'), the predicted winner, whether the framework is right, and the
    most loaded rank's peak memory of PP over DP (:func:`.pp_vs_dp.winner_table` indexed by the rate too)."""
    return winner_table(runs, index=("model", "B", "rate")).sort_index()


def slices(cells):
    """The (model, B) slices of the map, each a frame indexed by ascending rate."""
    return {key: part.droplevel([0, 1]).sort_index() for key, part in cells.groupby(level=[0, 1], sort=False)}


def predicted_curves(runs, hw, fits: dict, rates=PREDICTED_RATES) -> dict:
    """{(model, B): the framework's PP/DP at each of ``rates``} for the configurations of each slice."""
    return {key: predicted_ratio(part, hw, fits, rates) for key, part in runs.groupby(["model", "B"], sort=False)}


def crossovers(cells, curves: dict, rates=PREDICTED_RATES):
    """Per slice: the measured crossover rate (where the measured PP/DP crosses 1 along the swept rates,
    :func:`.pp_vs_dp.crossover`; None where it does not), the predicted one (on the framework's curve) and the
    factor between them (≥ 1; infinite where only one of them exists, NaN where neither does)."""
    out = []
    for (model, batch), part in slices(cells).items():
        measured = crossover(part.index, part["measured PP/DP"])
        predicted = crossover(rates, curves[(model, batch)]) if (model, batch) in curves else None
        if measured is None and predicted is None:
            factor = np.nan
        elif measured is None or predicted is None:
            factor = np.inf
        else:
            factor = max(measured / predicted, predicted / measured)
        out.append({"model": model, "B": batch, "measured": measured, "predicted": predicted, "factor": factor})
    return pd.DataFrame(out)


def boundary_counts(cells) -> dict:
    """How many cells the pipeline wins (``pp_wins``), data parallelism wins (``dp_wins``), are ties, are
    decisive, and whose winner the framework names (``agree``)."""
    winner = cells["measured winner"]
    return {"cells": len(cells), "pp_wins": int((winner == "PP").sum()), "dp_wins": int((winner == "DP").sum()),
            "ties": int((winner == "tie").sum()), "decisive": int((winner != "tie").sum()),
            "agree": int((cells["framework right"] == "yes").sum())}


def _rates(rates) -> str:
    return ", ".join(rate_text(r) for r in rates)


def region_text(cells) -> str:
    """Per slice, at which link rates the pipeline wins, data parallelism wins and neither does (within the
    repeats' interval): 'small, B = 8: PP at 30 Mbit/s–300 Mbit/s, DP at 3 Gbit/s, tie at 1 Gbit/s; …'."""
    parts = []
    for (model, batch), part in slices(cells).items():
        said = []
        for who, label in (("PP", "PP wins at"), ("DP", "DP wins at"), ("tie", "tie at")):
            rates = part.index[part["measured winner"] == who]
            if len(rates):
                said.append(f"{label} {_rates(rates)}")
        parts.append(f"{model}, B = {batch}: {'; '.join(said)}")
    return ". ".join(parts)


def crossover_text(cross) -> str:
    """Per slice, the measured and the predicted crossover rate and the factor between them."""
    def rate(x):
        return "none in the swept range" if x is None or (isinstance(x, float) and np.isnan(x)) else rate_text(x)

    return "; ".join(f"{r.model}, B = {r.B}: measured {rate(r.measured)}, predicted {rate(r.predicted)}"
                     + (f" (factor {r.factor:.2g})" if np.isfinite(r.factor) else "") for r in cross.itertuples())


def table(cells):
    """The map as a flat table: model, B, the link rate as text, measured PP/DP with its interval, predicted
    PP/DP, both winners, whether the framework is right and the PP/DP memory."""
    flat = cells.reset_index()
    flat["link"] = [rate_text(r) for r in flat.rate]
    columns = ["model", "B", "link", "measured PP/DP", "low", "high", "predicted PP/DP", "measured winner",
               "predicted winner", "framework right"]
    return flat[columns + (["PP/DP memory"] if "PP/DP memory" in flat else [])]


def draw_map(cells, curves: dict, order, rates=PREDICTED_RATES):
    """One panel per model: measured PP/DP against the link rate with its 95 % interval (points and bars, one
    colour per global batch) and the framework's curve (dashed); above the grey line the pipeline wins."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(order), figsize=(3.6 * len(order), 3.6), squeeze=False, sharey=True)
    batches = sorted({b for _, b in slices(cells)})
    colour = dict(zip(batches, BATCH_COLOURS))
    for ax, model in zip(axes[0], order):
        for (m, batch), part in slices(cells).items():
            if m != model:
                continue
            ratio = part["measured PP/DP"]
            low = (ratio - part.low).clip(lower=0).fillna(0)
            high = (part.high - ratio).clip(lower=0).fillna(0)
            ax.errorbar(part.index, ratio, yerr=[low, high], fmt="o", color=colour[batch], capsize=3,
                        label=f"B = {batch} measured")
            if (m, batch) in curves:
                ax.plot(rates, curves[(m, batch)], "--", color=colour[batch], label=f"B = {batch} predicted")
        ax.axhline(1, color="grey", lw=0.8)
        ax.set(xscale="log", yscale="log", title=model, xlabel="link rate (bit/s)")
        ax.yaxis.set_major_formatter(plt.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(plt.NullFormatter())
    axes[0][0].set_ylabel("PP/DP throughput")
    shown = {}
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            shown.setdefault(label, handle)
    axes[0][0].legend(shown.values(), shown.keys(), fontsize=7)
    fig.tight_layout()
    return fig


TEXT_KEYS = ("ppdp-map-region", "ppdp-map-cross", "ppdp-map-counts", "ppdp-map-memory")


def section(rows, why: str, hw, fits: dict):
    """The map's section of the chapter from every repeat's row (:func:`.network.measured_rows`): (cells, counts, region
    sentence, figure, table, sentences by glue key, provenance); with no rows (emulation needs root) cells, counts
    and table None, the region empty, and every sentence 'not measured (why)'."""
    from .. import book
    from .network import draw_not_measured, not_measured_texts
    from .pp_vs_dp import model_order

    if rows is None:
        return (None, None, "", draw_not_measured(why), None, not_measured_texts(TEXT_KEYS, why),
                book.model_provenance())
    runs = map_runs(rows, hw, fits)
    cells = map_cells(runs)
    curves = predicted_curves(runs, hw, fits)
    counts = boundary_counts(cells)
    region = region_text(cells)
    memory = cells["PP/DP memory"].dropna() if "PP/DP memory" in cells else cells.iloc[:0, 0]
    texts = {"ppdp-map-region": region, "ppdp-map-cross": crossover_text(crossovers(cells, curves)),
             "ppdp-map-counts": (f"the pipeline wins {counts['pp_wins']} of {counts['cells']} cells, data "
                                 f"parallelism {counts['dp_wins']}, {counts['ties']} are ties; the framework names "
                                 f"the winner of {counts['agree']} of {counts['decisive']} decisive cells"),
             "ppdp-map-memory": f"{memory.min():.2f}× to {memory.max():.2f}×" if len(memory) else "(not measured)"}
    fig = draw_map(cells, curves, model_order(runs))
    return cells, counts, region, fig, table(cells), texts, book.provenance_caption(runs)
