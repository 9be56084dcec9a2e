"""The book's seaborn theme and its standard theory-versus-measurement figures."""
from __future__ import annotations

import matplotlib.pyplot as plt
import seaborn as sns

PALETTE = "colorblind"


def theme() -> None:
    sns.set_theme(context="notebook", style="whitegrid", palette=PALETTE)
    plt.rcParams.update({"figure.dpi": 110, "savefig.bbox": "tight", "axes.titleweight": "bold"})


def measured_vs_predicted(frame, x: str, measured: str, predicted: str, hue: str | None = None,
                          xlabel: str = "", ylabel: str = "", logx: bool = True, logy: bool = True):
    """Measured values as points, predictions as dashed lines, one colour per ``hue`` level."""
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    sns.scatterplot(data=frame, x=x, y=measured, hue=hue, style=hue, s=60, ax=ax, zorder=3)
    hues = [None] if hue is None else list(dict.fromkeys(frame[hue]))
    colours = sns.color_palette(PALETTE, len(hues))
    for colour, level in zip(colours, hues):
        part = frame if level is None else frame[frame[hue] == level]
        part = part.sort_values(x)
        ax.plot(part[x], part[predicted], ls="--", color=colour, lw=1.5)
    ax.plot([], [], ls="--", color="grey", label="predicted")
    ax.legend(fontsize="small")
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel or x)
    ax.set_ylabel(ylabel or measured)
    fig.tight_layout()
    return fig



def category_bars(frame, label: str, category: str, measured: str, predicted: str, ylabel: str = "",
                  scale: float = 1.0, fig=None):
    """One panel per ``category``: measured values as bars over the ``label`` levels, predictions as black marks;
    drawn into ``fig`` (a figure or sub-figure, see :func:`per_machine`) when given."""
    import numpy as np

    cats = list(dict.fromkeys(frame[category]))
    own = fig is None
    fig = plt.figure(figsize=(3.1 * len(cats), 3.6)) if own else fig
    axes = fig.subplots(1, len(cats), squeeze=False)
    for ax, cat in zip(axes[0], cats):
        part = frame[frame[category] == cat]
        x = np.arange(len(part))
        ax.bar(x, part[measured] / scale, color=sns.color_palette(PALETTE)[0], label="measured")
        ax.scatter(x, part[predicted] / scale, marker="_", s=600, color="black", zorder=3, label="predicted")
        ax.set_xticks(x, part[label], rotation=45, ha="right", fontsize="small")
        ax.set_title(str(cat), fontsize="medium")
    axes[0][0].set_ylabel(ylabel or measured)
    if own:
        fig.tight_layout()
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2,
               fontsize="small", frameon=False)
    return fig


def machine_panels(frame, size=(11.0, 3.8)):
    """The figure, and one (sub-figure, rows) per machine in ``frame`` (this build's first, then reference
    machines), each titled with its device, to draw one machine's rows into. With one machine the sub-figure is
    the plain figure of ``size``; results of a second machine (a GPU's reference data) appear below it::

        fig, panels = plots.machine_panels(frame)
        for sub, rows in panels:
            ax = sub.subplots()
            ...
    """
    from .book import machines

    names = machines(frame)
    fig = plt.figure(figsize=(size[0], size[1] * len(names)), layout="constrained")
    subs = fig.subfigures(len(names), 1, squeeze=False)[:, 0] if len(names) > 1 else [fig]
    panels = []
    for sub, name in zip(subs, names):
        rows = frame[frame["machine"] == name]
        if len(names) > 1:
            sub.suptitle(f"{rows['device_name'].iloc[0]} ({name})", fontsize="medium", fontweight="bold")
        panels.append((sub, rows))
    return fig, panels


def per_machine(frame, draw, size=(11.0, 3.8)):
    """:func:`machine_panels` with ``draw(subfigure, rows)`` called for each machine; returns the figure."""
    fig, panels = machine_panels(frame, size)
    for sub, rows in panels:
        draw(sub, rows)
    return fig
