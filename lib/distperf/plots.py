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

