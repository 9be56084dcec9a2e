"""What every chapter does to present its results the same way: one provenance line per machine, the
hardware profile the predictions used, and each figure glued into the page *and* written as SVG and PNG
(tables as CSV) under its numref label, the stable name the caption links to.

Files go to ``$DISTPERF_FIGURES`` (the Makefile sets it beside the book's HTML output and copies the folder
into the HTML as ``figures/``); without it, to ``_build/figures`` (``_build/smoke/_build/figures`` at scale
smoke), where the Makefile looks for them.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from . import results

FIGURES_ENV = "DISTPERF_FIGURES"
FIGURE_FORMATS = ("svg", "png")


def figures_dir() -> Path:
    env = os.environ.get(FIGURES_ENV)
    if env:
        return Path(env)
    out = results.ROOT / "_build"
    return (out / "smoke" / "_build" if results.book_scale() == "smoke" else out) / "figures"


def _origins(frame):
    """Per row, 'this build' or 'reference data': a row is the reference's when it came from a committed table
    (``source`` reference), from the archive a reader's build reads, or from a long study this build read from the
    archive (:func:`distperf.results.study_archived`)."""
    import pandas as pd

    if results.book_from() == "reference":
        return pd.Series("reference data", index=frame.index)
    fresh = frame["source"] == "fresh" if "source" in frame else pd.Series(True, index=frame.index)
    if "experiment" in frame:
        archived = frame["experiment"].map(lambda e: isinstance(e, str) and results.study_archived(results.study_of(e)))
        fresh = fresh & ~archived.astype(bool)
    return fresh.map({True: "this build", False: "reference data"})


def _machine_line(rows, origin: str, scale: str) -> str:
    first = rows.iloc[0]
    dates = sorted(str(d)[:10] for d in rows["date"].dropna().unique())
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    commits = ", ".join(dict.fromkeys(str(c) for c in rows["commit"].dropna()))
    if "scale" in rows:
        scale = ", ".join(dict.fromkeys(str(s) for s in rows["scale"].dropna())) or scale
    return f"{first.device_name} ({first.machine}, {origin}), {when}, commit {commits}, scale {scale}"


def provenance_caption(frame, scale: str | None = None) -> str:
    """Where a table's rows came from, one entry per machine (fresh rows first):
    'device (machine, this build | reference data), date or date range, commit(s), scale', joined by '; ', then,
    for the book's own rows of a sweep table (an ``experiment`` column), the table and the start of its content's
    sha256 (:func:`distperf.results.table_digest`): what a citation of the figure names."""
    scale = scale or results.book_scale()
    order = frame.assign(_origin=_origins(frame)).sort_values("_origin", kind="stable", ascending=False)
    text = "; ".join(_machine_line(rows, origin, scale)
                     for (_, origin), rows in order.groupby(["machine", "_origin"], sort=False))
    own = frame[frame["source"] == "fresh"] if "source" in frame else frame
    names = dict.fromkeys(own["experiment"].dropna().astype(str)) if "experiment" in own else {}
    digests = {t: results.table_digest(t, scale) for t in names}
    return text + "".join(f"; table {t} sha256 {d}" for t, d in digests.items() if d)


def machines(frame) -> list[str]:
    """The machines a table holds, this build's first: a chapter shows one panel (or colour) per machine."""
    fresh = frame[frame["source"] == "fresh"] if "source" in frame else frame
    return list(dict.fromkeys([*fresh["machine"], *frame["machine"]]))


def _shown(path: Path) -> str:
    return str(path.relative_to(results.ROOT)) if path.is_relative_to(results.ROOT) else str(path)


def _profile_line(path: Path) -> str:
    p = json.loads(path.read_text())
    return (f"{p['name']}: {p['flops_fp32'] / 1e9:,.0f} GFLOP/s fp32, {p['flops_16bit'] / 1e9:,.0f} GFLOP/s 16-bit, "
            f"memory {p['memory_bandwidth'] / 1e9:,.1f} GB/s and {p['memory_capacity'] / 2**30:,.1f} GiB, links "
            f"α = {p['intra_latency'] * 1e6:,.1f} µs and β = {p['intra_bandwidth'] / 1e9:,.2f} GB/s, "
            f"{p['devices_per_node']} device(s) per node ({_shown(path)})")


def hardware_profiles(scale: str | None = None) -> str:
    """The measured hardware profiles behind a chapter's numbers: the book's own ``hardware.json`` (this build's
    ``data/fresh/<scale>/``, written by the calibration notebook, or the archive's in a reader's build), then any
    other committed ``data/reference/<machine>/hardware.json``."""
    own = results.book_dir(scale) / "hardware.json"
    if not own.exists():
        raise FileNotFoundError(f"{own} is missing: the calibration notebook writes it (`make data`)")
    refs = sorted(p for p in (results.DATA / "reference").glob("*/hardware.json") if p.parent != own.parent)
    label = "reference build" if results.book_from() == "reference" else "this build"
    return "; ".join([f"{label}: " + _profile_line(own)] + [f"reference: {_profile_line(r)}" for r in refs])


def _stable(name: str) -> str:
    if not name or not all(c.isalnum() or c == "-" for c in name):
        raise ValueError(f"name: a figure's stable name is its numref label (letters, digits, '-'), got {name!r}")
    return name


def glue_figure(name: str, fig, provenance: str) -> None:
    """Glue ``fig`` under ``name`` for a ``{glue:figure}``, its provenance under ``<name>-provenance`` for the
    caption, and write ``<name>.svg`` and ``<name>.png``, whose metadata carry the provenance; the figure is
    closed. The same figure gives the same bytes on every build: no date in the SVG, and its element ids salted with
    the figure's name rather than at random."""
    import matplotlib.pyplot as plt
    from IPython.display import Image
    from myst_nb import glue

    _stable(name)
    out = figures_dir()
    out.mkdir(parents=True, exist_ok=True)
    meta = {"Title": name, "Description": f"distperf figure {name}. Data: {provenance}"}
    with plt.rc_context({"svg.hashsalt": name}):
        fig.savefig(out / f"{name}.svg", metadata={**meta, "Date": None})
    fig.savefig(out / f"{name}.png", metadata={**meta, "Source": "distperf"})
    # the page shows the PNG just written rather than rendering the figure a third time
    glue(name, Image(filename=str(out / f"{name}.png")), display=False)
    glue(f"{name}-provenance", provenance, display=False)
    plt.close(fig)


def glue_table(name: str, table, provenance: str) -> None:
    """Glue a (styled) table under ``name``, its provenance under ``<name>-provenance``, and write the table's
    data as ``<name>.csv``."""
    from myst_nb import glue

    _stable(name)
    frame = getattr(table, "data", table)  # a pandas Styler keeps its frame in .data
    out = figures_dir()
    results.write_csv_atomic(frame, out / f"{name}.csv")
    glue(name, table, display=False)
    glue(f"{name}-provenance", provenance, display=False)


def glue_verdict(chapter: str, stats: dict, provenance: str) -> str:
    """Glue a chapter's verdict from its rule (:mod:`distperf.analysis.verdicts`) and ``stats``: ``verdict``,
    ``rule`` (the rule in words, printed before the result), ``rule-result`` (each criterion's value and meaning),
    ``rule-robustness`` (whether other thresholds change the verdict) and the table ``tbl-<chapter>-rule``
    (underscores as hyphens), and write the verdict's record for the landing page
    (:func:`distperf.analysis.findings.record`) beside the figures. Returns the verdict."""
    from myst_nb import glue

    from .analysis import findings, verdicts

    findings.write_record(figures_dir(), findings.record(chapter, stats, provenance, results.book_scale()))
    rule = verdicts.rule(chapter)
    verdict = rule.verdict(stats)
    glue("verdict", verdict, display=False)
    glue("rule", rule.statement(), display=False)
    glue("rule-result", rule.explanation(stats), display=False)
    glue("rule-robustness", rule.robustness(stats), display=False)
    glue_table(f"tbl-{chapter.replace('_', '-')}-rule", rule.sensitivity(stats).style.hide(axis="index"), provenance)
    return verdict


def model_provenance() -> str:
    """The provenance of a figure drawn from the cost model and published numbers alone: no device measured;
    the commit and the date of the build."""
    import datetime as dt

    return (f"the cost model alone, no measurement; commit {results.git_commit()}, "
            f"built {dt.datetime.now(dt.timezone.utc):%Y-%m-%d}")
