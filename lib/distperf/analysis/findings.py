"""The book's findings at a glance, for the landing page (``chapters/intro.md``).

Each chapter's verdict cell (:func:`distperf.book.glue_verdict`) writes a *record* of its verdict beside its
figures: the rule's question and statement, every criterion's value against its threshold, the verdict and the
provenance of the data it rests on (machine, commit, scale). The landing page is read and executed after every
other page of the build (``_ext/distperf_offline.py`` puts it last), so it gathers this build's records into a
table and a summary figure. A chapter without a record (not built, or failed) shows as "not built".
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from .. import atomic, results
from ..reference import VERDICTS, read_manifest
from .verdicts import rule

RECORD = "verdict-{chapter}.json"
NOT_BUILT = "not built"
VERDICT_COLOURS = {True: "C2", False: "C3", None: "0.6"}


def _finite(value):
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def record(chapter: str, stats: dict, provenance: str, scale: str) -> dict:
    """A chapter's verdict as plain JSON data: the rule's question, statement and verdict on ``stats``, and per
    criterion its statistic, value (None where missing or not finite), value as printed, rule, whether it is met,
    and its normalised :func:`margin`."""
    r = rule(chapter)
    criteria = []
    for c in r.criteria:
        value = stats.get(c.key)
        met = c.met(value)
        criteria.append({"key": c.key, "statistic": c.statistic, "value": _finite(value),
                         "shown": "–" if met is None else c.show(value), "rule": c.rule(), "met": met,
                         "margin": margin(c.op, c.threshold, value) if met is not None else None})
    return {"chapter": chapter, "question": r.question, "verdict": r.verdict(stats), "rule": r.statement(),
            "criteria": criteria, "provenance": provenance, "scale": scale}


def margin(op: str, threshold: float, value, cap: float = 1.0) -> float:
    """How far ``value`` lies on the right side of ``threshold`` (positive: the criterion holds), relative to the
    threshold: (value − threshold)/|threshold| for "≥", (threshold − value)/|threshold| for "≤", capped at
    ±``cap``; with a zero threshold only the side counts (±cap). An infinite value is capped too."""
    value = float(value)
    gap = value - threshold if op == ">=" else threshold - value
    if gap == 0:
        return 0.0
    relative = gap / abs(threshold) if threshold else math.copysign(math.inf, gap)
    return max(-cap, min(cap, relative))


def write_record(directory: Path, data: dict) -> Path:
    """Write a record as ``verdict-<chapter>.json`` in ``directory``, atomically (strict JSON)."""
    return atomic.write_text(Path(directory) / RECORD.format(chapter=data["chapter"]),
                             json.dumps(data, indent=1, allow_nan=False) + "\n")


def read_records(directory: Path, chapters) -> dict:
    """{chapter: its record, or None where the build wrote none} for ``chapters``, in their order."""
    out = {}
    for chapter in chapters:
        path = Path(directory) / RECORD.format(chapter=chapter)
        out[chapter] = json.loads(path.read_text()) if path.exists() else None
    return out


def summary_table(records: dict, reference: dict | None = None):
    """One row per chapter: its question, verdict, the criteria met out of those measured, the data it rests on
    and its rule; a chapter without a record shows as "not built". With ``reference`` (:func:`reference_records`),
    a column beside the verdict gives the reference build's."""
    rows = []
    for chapter, data in records.items():
        if data is None:
            r = rule(chapter)
            row = {"question": r.question, "verdict": NOT_BUILT, "criteria met": "–", "rests on": "–",
                   "rule": r.statement()}
        else:
            measured = [c for c in data["criteria"] if c["met"] is not None]
            row = {"question": data["question"], "verdict": data["verdict"],
                   "criteria met": f"{sum(c['met'] for c in measured)} of {len(measured)}",
                   "rests on": data["provenance"], "rule": data["rule"]}
        if reference is not None:
            archived = reference.get(chapter)
            row = {**dict(list(row.items())[:2]), REFERENCE_COLUMN: archived["verdict"] if archived else NOT_ARCHIVED,
                   **dict(list(row.items())[2:])}
        rows.append(row)
    return pd.DataFrame(rows)


REFERENCE_COLUMN = "reference build's verdict"
NOT_ARCHIVED = "not archived"


def reference_records(chapters, scale: str) -> tuple[str | None, dict]:
    """(the reference build's name and the commit that computed its verdicts, {chapter: its archived record or
    None}) for the archived build a reader's build at ``scale`` reads (:func:`distperf.results.archive_dir`);
    (None, {}) when there is none at that scale or it archived no verdicts."""
    try:
        directory = results.archive_dir(scale)
    except FileNotFoundError:
        return None, {}
    manifest = read_manifest(directory) or {}
    if not manifest.get(VERDICTS):
        return None, {}
    name = f"{manifest['machine']}, verdicts computed at commit {manifest.get('verdicts_commit', 'unknown')}"
    return name, read_records(directory / VERDICTS, chapters)


def agreement_text(records: dict, reference: dict, name: str | None) -> str:
    """How many of this build's verdicts equal the reference build's, and which differ (this build's against the
    reference's), over the chapters both have; says so when there is no reference to compare with."""
    if name is None:
        return "no reference build with archived verdicts at this scale, so none to compare with"
    both = [(c, records[c]["verdict"], reference[c]["verdict"]) for c in records
            if records.get(c) and reference.get(c)]
    if not both:
        return f"no chapter has a verdict both in this build and in the reference build ({name})"
    differ = [(c, own, ref) for c, own, ref in both if own != ref]
    text = f"{len(both) - len(differ)} of {len(both)} verdicts agree with the reference build's ({name})"
    if differ:
        text += "; they differ on " + "; ".join(f"“{rule(c).question}” (this build: {own}; reference: {ref})"
                                              for c, own, ref in differ)
    return text


def verdict_counts(records: dict) -> dict:
    """How many chapters reached each verdict (and how many were not built)."""
    counts: dict = {}
    for data in records.values():
        verdict = NOT_BUILT if data is None else data["verdict"]
        counts[verdict] = counts.get(verdict, 0) + 1
    return counts


def counts_text(records: dict) -> str:
    """'3 reproduced, 7 depend, …' over the chapters' verdicts."""
    counts = verdict_counts(records)
    return ", ".join(f"{n} {v}" for v, n in counts.items())


def draw_summary(records: dict):
    """Every criterion of every verdict as a point: its normalised :func:`margin` (right of the line: the
    criterion holds; capped at ±100 % of the threshold), green where met, red where not, one group of rows per
    chapter with its verdict on the right; criteria that could not be measured are left out."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import PercentFormatter

    rows = []
    for chapter, data in records.items():
        for c in (data or {}).get("criteria", []):
            if c["met"] is not None:
                rows.append((chapter, data["verdict"], c["key"], c["margin"], c["met"]))
    fig, ax = plt.subplots(figsize=(7.5, 0.22 * max(len(rows), 4) + 1.2))
    labels, previous = [], None
    for y, (chapter, verdict, key, value, met) in enumerate(rows):
        ax.plot(value, y, "o", color=VERDICT_COLOURS[met])
        if chapter != previous:
            ax.text(1.08, y, verdict, va="center", fontsize=8, transform=ax.get_yaxis_transform())
            if previous is not None:
                ax.axhline(y - 0.5, color="0.85", lw=0.6)
            previous = chapter
        labels.append(f"{chapter} · {key}")
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(-1.1, 1.1)
    ax.xaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel("distance from the threshold, relative to it (right of 0: criterion met)")
    fig.tight_layout()
    return fig
