"""The published numbers the project checks or shows, read from one committed table.

``data/published/values.csv`` holds every number the book quotes from a paper or a release — parameter counts
(GPT-2's checkpoints, GPT-3, Megatron-LM's Table 1, the PipeDream-2BW models), ZeRO's model-state figures,
Korthikanti et al.'s activation forms (as coefficients), PipeDream-2BW's results — one row each, with the
columns ``source`` (a key of ``references.bib``), ``where`` (table, figure or section), ``item``,
``quantity``, ``value``, ``unit``, ``read`` (``text``, ``figure`` read off a plot, or ``checkpoint``) and
``note``. Tests and chapters read them here; none is typed a second time.
"""
from __future__ import annotations

import csv
from functools import lru_cache

from .results import DATA

PATH = DATA / "published" / "values.csv"
COLUMNS = ("source", "where", "item", "quantity", "value", "unit", "read", "note")


@lru_cache(maxsize=1)
def rows() -> tuple[dict, ...]:
    """Every row, ``value`` as a float."""
    with open(PATH, newline="") as f:
        return tuple({**r, "value": float(r["value"])} for r in csv.DictReader(f))


def select(**match) -> list[dict]:
    """The rows whose columns equal ``match`` (e.g. ``source="rajbhandari2020zero", where="Fig. 1"``)."""
    unknown = set(match) - set(COLUMNS)
    if unknown:
        raise KeyError(f"no column {', '.join(sorted(unknown))}; columns: {', '.join(COLUMNS)}")
    return [r for r in rows() if all(r[k] == v for k, v in match.items())]


def value(item: str, quantity: str, **match) -> float:
    """The one published value of ``quantity`` for ``item``."""
    found = select(item=item, quantity=quantity, **match)
    if len(found) != 1:
        raise KeyError(f"{len(found)} published rows for item {item!r}, quantity {quantity!r} {match or ''}")
    return found[0]["value"]


def frame(**match):
    """:func:`select` as a pandas DataFrame."""
    import pandas as pd

    return pd.DataFrame(select(**match), columns=COLUMNS)


def parameter_count(model: str) -> tuple[float, dict]:
    """(parameters, row) published for a preset model, in units of one (billions scaled up)."""
    found = select(item=model, quantity="parameters")
    if len(found) != 1:
        raise KeyError(f"{len(found)} published parameter counts for {model!r}")
    scale = {"count": 1, "billion": 1e9}[found[0]["unit"]]
    return found[0]["value"] * scale, found[0]


def korthikanti_layer_bytes(setting: str, s: int, b: int, h: int, a: int, t: int = 1) -> float:
    """Activation bytes per layer in Korthikanti et al. 2022, Table 2 (16-bit, with dropout), for ``setting``:
    sbh·(c₁ + c₂/t + c₃·as/h + c₄·as/(ht)) with the table's coefficients."""
    c = {r["quantity"].rsplit("coefficient of ", 1)[1]: r["value"]
         for r in select(source="korthikanti2022reducing", where="Table 2", item=setting)}
    if not c:
        raise KeyError(f"no Korthikanti form for {setting!r}")
    return s * b * h * (c["sbh"] + c["sbh/t"] / t + c["sbh·as/h"] * a * s / h + c["sbh·as/(ht)"] * a * s / (h * t))
