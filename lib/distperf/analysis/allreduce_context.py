"""Does an all-reduce's time depend on what runs before it? The experiment ``scripts/allreduce_context.py`` (archived
as reference data) times DDP's one-bucket all-reduce of the `small` and `medium` presets four ways in the same two
processes (:data:`WAYS`); this module reads it for the chapter "Where the time goes".

The rule, declared with the experiment (6 December 2026, before its first run): the all-reduce's time follows its
size alone at a preset's bucket if the median of its time inside the DDP step, on the rank that ends the step, lies
within :data:`BAND` of the median of the same all-reduce issued as the calibration issues it; outside it, a model
that times the all-reduce by its size alone, from the calibration's fit, misses that preset's exposed communication
by more than the goal's 10 %.
"""
from __future__ import annotations

import pandas as pd

NAME = "allreduce_context"
PRESETS = ("small", "medium")
WAYS = {"step": "inside the DDP step (the rank that ends it)", "bare": "under DDP on a bare parameter",
        "issued": "issued after a burst of matrix products (the calibration's way)",
        "after_copy": "after a 64 MiB copy and a barrier"}
BAND = (1 / 1.1, 1.1)  # the step's median over the issued one: within the exposed-communication goal's 10 %


def per_round(table: pd.DataFrame) -> pd.DataFrame:
    """One row per preset and round: each way's seconds — ``step`` on the rank whose own work (its window less its
    communication) took longest, the one that ends the step, as the book reads its runs; the others the slowest
    rank's, as the calibration reads its probes — and the message's ``bytes``."""
    out = []
    for (preset, round_), ranks in table.groupby(["preset", "round"], sort=False):
        ending = ranks.loc[(ranks["window"] - ranks["step"]).idxmax()]
        out.append({"preset": preset, "round": round_, "time_s": ranks["time_s"].min(),
                    "bytes": int(ranks["bytes"].iloc[0]), "step": ending["step"],
                    **{way: ranks[way].max() for way in WAYS if way != "step"}})
    return pd.DataFrame(out)


def contexts(table: pd.DataFrame) -> pd.DataFrame:
    """Per preset and way: ``median``, ``p10`` and ``p90`` seconds over the rounds (:func:`per_round`), ``rounds``,
    ``bytes``, ``over_issued``, the median over the issued way's median, and ``low`` and ``high``, the least and
    largest of its one-minute medians over its median (:func:`distperf.analysis.tp_implied.drift_range`)."""
    from .tp_implied import drift_range

    rounds = per_round(table)
    out = []
    for preset, runs in rounds.groupby("preset", sort=False):
        issued = runs["issued"].median()
        for way, what in WAYS.items():
            values = runs[way]
            low, high = drift_range(runs, way)
            out.append({"preset": preset, "bytes": int(runs["bytes"].iloc[0]), "way": way, "what": what,
                        "rounds": len(values), "median": values.median(), "p10": values.quantile(0.1),
                        "p90": values.quantile(0.9), "over_issued": values.median() / issued, "low": low,
                        "high": high})
    return pd.DataFrame(out)


def follows_size(found: pd.DataFrame) -> dict:
    """{preset: whether the step's median lies within :data:`BAND` of the issued one} (the module's rule)."""
    steps = found[found["way"] == "step"]
    return {r.preset: bool(BAND[0] <= r.over_issued <= BAND[1]) for r in steps.itertuples()}


def fitted_s(hw, nbytes: float) -> float | None:
    """The all-reduce of ``nbytes`` over two ranks as the cost model times it on the profile ``hw``: its α-β fit of
    the all-reduce as issued (:meth:`distperf.hardware.Hardware.fitted`), else the link's α-β with gloo's algorithm;
    None without a profile."""
    if hw is None:
        return None
    from ..cost.collectives import collective_time

    fit = hw.fitted("all-reduce", 2)
    return collective_time("all-reduce", nbytes, 2, *fit) if fit else collective_time(
        "all-reduce", nbytes, 2, *hw.link(2), "gloo")


def sentence(table: pd.DataFrame | None, hw=None) -> str:
    """:func:`contexts` and the rule, in words; with a hardware profile ``hw``, what its fit gives for each message
    (:func:`fitted_s`)."""
    if table is None or not len(table):
        return "the experiment has not been run on this machine (scripts/allreduce_context.py)"
    from ..units import format_bytes

    found = contexts(table)
    parts = []
    for preset, rows in found.groupby("preset", sort=False):
        ways = "; ".join(f"{r.what} {r.median * 1e3:.2f} ms ({r.p10 * 1e3:.2f} to {r.p90 * 1e3:.2f})"
                         for r in rows.itertuples())
        parts.append(f"`{preset}`'s all-reduce of {format_bytes(rows['bytes'].iloc[0], 1)}: {ways}")
    follows = follows_size(found)
    ratios = ", ".join(f"`{p}` {found[(found.preset == p) & (found.way == 'step')].over_issued.iloc[0]:.2f}"
                       for p in follows)
    outside = [p for p, ok in follows.items() if not ok]
    where = "both buckets" if len(outside) == 2 else f"`{outside[0]}`'s bucket" if outside else ""
    verdict = (f"at {where} the step's "
               f"all-reduce lies outside {BAND[0]:.2f} to {BAND[1]:.2f} times the issued one: its time depends on what "
               f"runs before it, and a model that times it by its size alone misses there by more than the goal's 10 %"
               if outside else
               f"at both buckets the step's all-reduce lies within {BAND[0]:.2f} to {BAND[1]:.2f} times the issued "
               f"one: its time follows its size")
    rounds = int(found["rounds"].max())
    seconds = table["time_s"].max() - table["time_s"].min()
    span = f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"
    issued = found[found.way == "issued"]
    drift = ("; the issued all-reduce's one-minute medians lay between " + " and ".join(
        f"{r.low:.0%} and {r.high:.0%} of its median at `{r.preset}`'s" for r in issued.itertuples()))
    fits = ""
    if hw is not None:
        sizes = found.drop_duplicates("preset")
        fits = ". The profile's fit gives " + " and ".join(
            f"{fitted_s(hw, r.bytes) * 1e3:.2f} ms for `{r.preset}`'s" for r in sizes.itertuples())
    return (f"over {rounds} rounds in {span} (medians, 10th to 90th percentile), " + "; ".join(parts)
            + f". The step's median over the issued one: {ratios}; {verdict}{drift}{fits}")
