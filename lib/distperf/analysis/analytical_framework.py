"""What the chapter "The analytical framework" computes: the cost model's counts beside the published ones
(parameters, FLOPs, ZeRO's model states, Korthikanti et al.'s activation forms), the bubble fractions of
flushing schedules, a GPT-3-class model's predicted memory by category along one layout parameter at a time,
and how many configurations per CPU-second the cost model predicts.

Every published number is read from :mod:`distperf.published`; what the chapters of the book share —
:func:`preset_parameters`, :func:`rounded_as_published`, :func:`count_of`, :func:`item_settings` and
:func:`styled` — is here too (the papers' chapter, :mod:`.papers_scale`, uses them).
"""
from __future__ import annotations

import random
from dataclasses import replace

import pandas as pd

from .. import presets, published
from ..config import MEMORY_CATEGORIES, Config, Layout, ModelSpec, Training
from ..cost import activations, flops, parameters, predict, schedules
from ..cost.model_states import bytes_per_parameter, zero_model_state_bytes

BILLION = 1e9
MIB, GIB = 2**20, 2**30

# How the parameter table names each source of published parameter counts.
PARAMETER_SOURCES = {
    "radford2019language": "released checkpoint (Hugging Face)",
    "narayanan2021efficient": "Narayanan et al. 2021, Table 1 (billions)",
    "narayanan2021memory": "Narayanan et al. 2021 (2BW), model name",
}
# The PipeDream-2BW models the chapters list (the 2,240-layer 28.3B model is checked by the tests alone).
TWO_BW_MODELS = ("2bw-gpt-1.3b", "2bw-gpt-2.2b", "2bw-gpt-3.8b")

FLOPS_FORMATS = ({c: "{:.4e}" for c in ["ours", "72-form", "ours, full recompute", "96-form"]}
                 | {"ours / 72-form": "{:.12f}", "ours / 96-form": "{:.12f}"})
ZERO_FORMATS = {"ZeRO paper, Fig. 1 (GB)": "{:.1f}", "ours (GB)": "{:.3f}"}
KORTHIKANTI = "Korthikanti et al., Table 2 (MiB)"
ACTIVATION_FORMATS = {"ours (MiB)": "{:.2f}", KORTHIKANTI: "{:.2f}"}

# One layer's activations: (row label, Korthikanti et al.'s Table 2 setting, the cost model's arguments).
ACTIVATION_CASES = (
    ("no parallelism", "no parallelism", {}),
    ("tensor parallel, t = 8", "tensor parallel", {"t": 8}),
    ("tensor + sequence parallel", "tensor + sequence parallel", {"t": 8, "sp": True}),
    ("t = 8, selective recompute", "tensor parallel + selective recompute", {"t": 8, "recompute": "selective"}),
    ("t = 8, sequence parallel, selective", "tensor + sequence parallel + selective recompute",
     {"t": 8, "sp": True, "recompute": "selective"}),
    ("full recompute", "full recompute", {"recompute": "full"}),
)
BUBBLE_COLUMNS = {1: "GPipe, 1F1B", 2: "interleaved, v = 2", 4: "interleaved, v = 4"}  # chunks per rank v
BUBBLE_FORMATS = {c: "{:.3f}" for c in BUBBLE_COLUMNS.values()}

PANEL_DP, PANEL_TP = "data parallel d (ZeRO-1)", "tensor parallel t (pp = 8)"
PANEL_PP, PANEL_ZERO = "pipeline stages p (t = 8)", "ZeRO stage (d = 8)"


# Shared by the chapters that set published numbers beside the cost model -------------------------------

def preset_parameters(name: str) -> int:
    """The cost model's parameter count Ψ of a preset model (:func:`distperf.cost.parameters.model_parameters`:
    L(12h² + 13h) + (V + s)h + 2h for f = 4h and a tied head; the chapter's "Parameters" section)."""
    m = presets.model(name)
    return parameters.model_parameters(m.layers, m.hidden, m.ffn, m.vocab, m.seq, m.tied)


def rounded_as_published(value: float, unit: str) -> str:
    """``value`` (in units of one) printed as a source of ``unit`` prints it: a ``count`` exactly, with
    thousands separators; a size in ``billion`` to one decimal, 'x.y B'."""
    if unit == "count":
        return f"{value:,.0f}"
    if unit == "billion":
        return f"{value / BILLION:.1f} B"
    raise ValueError(f"unit: 'count' or 'billion', got {unit!r}")


def count_of(flags) -> str:
    """'k of n': how many of ``flags`` are true."""
    flags = list(flags)
    return f"{sum(flags)} of {len(flags)}"


def item_settings(item: str) -> dict:
    """The settings a published row's ``item`` names, e.g. 'psi=7.5e9 N=64 zero=1' → {'psi': 7.5e9, 'N': 64,
    'zero': 1}: integers as int, other numbers as float."""
    settings = {}
    for part in item.split():
        key, _, text = part.partition("=")
        if not text:
            raise ValueError(f"item {item!r}: expected key=value settings, got {part!r}")
        try:
            settings[key] = int(text)
        except ValueError:
            settings[key] = float(text)
    return settings


def styled(frame: pd.DataFrame, formats: dict, na_rep: str | None = None):
    """``frame`` as the book shows a table: columns formatted by ``formats``, missing values as ``na_rep``,
    no index."""
    return frame.style.format(formats, na_rep=na_rep).hide(axis="index")


# Parameters -------------------------------------------------------------------------------------------

def parameter_models() -> list[str]:
    """The preset models whose published parameter counts the chapter lists: GPT-2's released checkpoints,
    Megatron-LM's Table 1 (Narayanan et al. 2021) and :data:`TWO_BW_MODELS`, in the published table's order."""
    checkpoints = [r["item"] for r in published.select(source="radford2019language", quantity="parameters")]
    table_1 = list(published.frame(source="narayanan2021efficient", where="Table 1", quantity="parameters").item)
    return checkpoints + table_1 + list(TWO_BW_MODELS)


def parameter_table(models) -> pd.DataFrame:
    """Each model's published parameter count beside ours, both printed as the source prints its count
    (:func:`rounded_as_published`); ``agrees`` where the printed values are equal. Columns: model,
    published as, published, ours, same rounding, agrees."""
    rows = []
    for name in models:
        value, row = published.parameter_count(name)
        ours = preset_parameters(name)
        rows.append({"model": name, "published as": PARAMETER_SOURCES[row["source"]],
                     "published": rounded_as_published(value, row["unit"]),
                     "ours, same rounding": rounded_as_published(ours, row["unit"])})
    table = pd.DataFrame(rows, columns=["model", "published as", "published", "ours, same rounding"])
    table["agrees"] = table["published"] == table["ours, same rounding"]
    return table


# FLOPs ------------------------------------------------------------------------------------------------

def flops_table(models, batch: int) -> pd.DataFrame:
    """FLOPs of one iteration on a global batch of ``batch`` sequences, counted term by term
    (:func:`~distperf.cost.flops.model_flops`, and :func:`~distperf.cost.flops.hardware_flops` with full
    recomputation) against Narayanan et al.'s closed forms 72·BsLh²(1 + s/6h + V/12Lh) and
    96·BsLh²(1 + s/6h + V/16Lh), with the ratios (the chapter's "FLOPs" section)."""
    rows = []
    for name in models:
        m = presets.model(name)
        args = (batch, m.layers, m.seq, m.hidden, m.ffn, m.vocab)
        rows.append((name, batch, flops.model_flops(*args),
                     flops.narayanan_flops(batch, m.layers, m.seq, m.hidden, m.vocab, False),
                     flops.hardware_flops(*args, "full"),
                     flops.narayanan_flops(batch, m.layers, m.seq, m.hidden, m.vocab, True)))
    table = pd.DataFrame(rows, columns=["model", "B", "ours", "72-form", "ours, full recompute", "96-form"])
    table["ours / 72-form"] = table["ours"] / table["72-form"]
    table["ours / 96-form"] = table["ours, full recompute"] / table["96-form"]
    return table


# ZeRO -------------------------------------------------------------------------------------------------

def zero_table() -> pd.DataFrame:
    """Model states per device by ZeRO stage against Fig. 1 of the ZeRO paper (Ψ and N_d as the figure sets
    them): ours is 16Ψ, 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N, 16Ψ/N bytes (:func:`zero_model_state_bytes`), in GB."""
    rows = []
    for r in published.select(source="rajbhandari2020zero", where="Fig. 1"):
        setting = item_settings(r["item"])
        stage = setting["zero"]
        rows.append((f"ZeRO-{stage}" if stage else "data parallel", r["value"],
                     sum(zero_model_state_bytes(setting["psi"], setting["N"], stage)) / BILLION))
    return pd.DataFrame(rows, columns=["stage", "ZeRO paper, Fig. 1 (GB)", "ours (GB)"])


# Activations ------------------------------------------------------------------------------------------

def activation_table(model: ModelSpec, micro_batch: int) -> pd.DataFrame:
    """One layer's activation bytes per microbatch, in MiB, for each of :data:`ACTIVATION_CASES`: the cost
    model's count (:func:`~distperf.cost.activations.layer_activation_bytes`) against Korthikanti et al.'s
    closed form sbh(34 + 5as/h) and its variants (Table 2)."""
    s, b, h, a = model.seq, micro_batch, model.hidden, model.heads
    rows = [(label, activations.layer_activation_bytes(s, b, h, a, **kwargs) / MIB,
             published.korthikanti_layer_bytes(setting, s, b, h, a, kwargs.get("t", 1)) / MIB)
            for label, setting, kwargs in ACTIVATION_CASES]
    return pd.DataFrame(rows, columns=["setting", "ours (MiB)", KORTHIKANTI])


# Pipeline bubble --------------------------------------------------------------------------------------

def bubble_table(depths=(4, 8, 16), microbatches_per_stage=(1, 4, 16)) -> pd.DataFrame:
    """The bubble fraction (p − 1)/(v·m + p − 1) of a flushing schedule with equal stages, for each depth p and
    m = p × each of ``microbatches_per_stage``, with v = 1, 2 and 4 chunks per rank (:data:`BUBBLE_COLUMNS`)."""
    rows = [(p, m, *(schedules.bubble_fraction(p, m, v) for v in BUBBLE_COLUMNS))
            for p in depths for m in (k * p for k in microbatches_per_stage)]
    return pd.DataFrame(rows, columns=["p", "m", *BUBBLE_COLUMNS.values()])


# Memory of a GPT-3-class model ------------------------------------------------------------------------

def layout_sweeps(base: Layout) -> dict[str, list[tuple[str, int, Layout]]]:
    """One layout parameter varied at a time around ``base`` (the chapter's d = t = p = 8): panel title →
    (axis, value, layout) points. Data parallelism keeps the global batch (m = 512/d), tensor parallelism
    keeps sequence parallelism where t > 1, one pipeline stage runs no schedule."""
    return {
        PANEL_DP: [("d", d, replace(base, dp=d, microbatches=512 // d)) for d in (1, 2, 4, 8, 16, 32, 64)],
        PANEL_TP: [("t", t, replace(base, tp=t, sequence_parallel=t > 1)) for t in (1, 2, 4, 8)],
        PANEL_PP: [("p", p, replace(base, pp=p, schedule="1f1b" if p > 1 else "none", microbatches=64))
                   for p in (1, 2, 4, 8, 16, 32)],
        PANEL_ZERO: [("ZeRO", z, replace(base, zero=z)) for z in range(4)],
    }


def predicted_memory(model: ModelSpec, sweeps: dict, training: Training) -> pd.DataFrame:
    """The cost model's memory of the most loaded device, in GiB by category and total, at every point of
    ``sweeps`` (:func:`layout_sweeps`): one row per point, columns panel, value (as text), the categories of
    :data:`~distperf.config.MEMORY_CATEGORIES` and total."""
    rows = []
    for panel, points in sweeps.items():
        for _axis, value, layout in points:
            out = predict(Config(model=model, layout=layout, training=training), None)
            rows.append({"panel": panel, "value": str(value),
                         **{c: out["memory_bytes"][c] / GIB for c in MEMORY_CATEGORIES},
                         "total": out["memory_bytes"]["total"] / GIB})
    return pd.DataFrame(rows)


def base_total(memory: pd.DataFrame) -> float:
    """GiB of the base layout (the ZeRO panel's stage-1 point, which is the base layout)."""
    return memory[(memory.panel == PANEL_ZERO) & (memory.value == "1")].total.iloc[0]


def zero1_floor(memory: pd.DataFrame) -> float:
    """GiB of optimizer states at the largest data-parallel degree of the ZeRO-1 panel: where ZeRO-1's
    whole-tensor sharding stops shrinking them."""
    return memory[memory.panel == PANEL_DP].optimizer_states.iloc[-1]


def zero1_share(memory: pd.DataFrame) -> float:
    """The fraction of ZeRO-3's saving of model states that ZeRO-1 already saves,
    (M₀ − M₁)/(M₀ − M₃), M_k the parameters, gradients and optimizer states at stage k."""
    stages = memory[memory.panel == PANEL_ZERO].set_index("value")
    states = stages.parameters + stages.gradients + stages.optimizer_states
    return (states["0"] - states["1"]) / (states["0"] - states["3"])


def embedding_optimizer_states(model: ModelSpec) -> tuple[int, float]:
    """The token embedding V·h (parameters) and its mixed-precision Adam optimizer states in GiB (12 bytes a
    parameter, :func:`bytes_per_parameter`): one tensor, which ZeRO-1's whole-tensor sharding cannot split."""
    embedding = model.vocab * model.hidden
    return embedding, embedding * bytes_per_parameter("mixed", "adam")[2] / GIB


def draw_memory_by_category(memory: pd.DataFrame, capacity_gib: float = 80):
    """One panel per sweep of :func:`predicted_memory`: stacked bars by category, a dotted line at
    ``capacity_gib``. Returns the figure."""
    import matplotlib.pyplot as plt

    panels = memory.groupby("panel", sort=False)
    fig, axes = plt.subplots(1, len(panels), figsize=(13, 3.8), sharey=True)
    colours = dict(zip(MEMORY_CATEGORIES, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for ax, (panel, part) in zip(axes, panels):
        bottom = 0
        for c in MEMORY_CATEGORIES:
            ax.bar(part["value"], part[c], bottom=bottom, color=colours[c], label=c.replace("_", " "))
            bottom = bottom + part[c].to_numpy()
        ax.axhline(capacity_gib, color="black", ls=":", lw=1)
        ax.set_title(panel, fontsize="medium")
    axes[0].set_ylabel("GiB on the most loaded device")
    axes[0].legend(fontsize="small", loc="upper right")
    fig.tight_layout()
    return fig


# Speed ------------------------------------------------------------------------------------------------

def prediction_rates(configs: list[Config], seed: int = 0, repeats: int = 5) -> dict[str, list[float]]:
    """Configurations predicted per CPU-second in ``repeats`` rounds, each timing three passes in turn (so that the
    machine's drift falls on all three alike): from cold caches in the given (sweep) order, from cold caches
    shuffled with ``random.Random(seed)``, then the sweep order again with every cache warm (what is left is
    validating each configuration and building its result, a dictionary per category and two per pipeline rank).
    Returns {'sweep': [rate per round], 'shuffled': […], 'warm': […]}."""
    from ..cost.benchmark import rates_per_cpu_second

    shuffled = list(configs)
    random.Random(seed).shuffle(shuffled)
    rates = {"sweep": [], "shuffled": [], "warm": []}
    for _ in range(repeats):
        rates["sweep"] += rates_per_cpu_second(configs)
        rates["shuffled"] += rates_per_cpu_second(shuffled)
        rates["warm"] += rates_per_cpu_second(configs, cold=False)
    return rates
