"""Measurement beside prediction, as the chapters on memory and parallelism show it (``chapters/dp_zero.md``,
``chapters/tensor_parallel.md``; any chapter whose runs carry the cost model's prediction,
:func:`.rows.with_predictions`):

- :func:`hardware_line`: the calibrated profile the predictions used, in one line;
- :func:`memory_by_category`, :func:`memory_kind`, :func:`model_state_rows`: bytes per category on the most
  loaded rank, measured and predicted, what kind of measurement they are, and the model states among them;
- :func:`memory_rows`, :func:`time_rows`, :func:`error_table`, :func:`styled_error_table`: the table of signed
  errors (predicted − measured)/measured of every quantity a chapter compares;
- :func:`errors_of`, :func:`error_range`: one quantity's errors, and their range as the prose quotes it.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..results import signed_error
from .rows import most_loaded_memory

MiB = 2**20
ERROR_TABLE_FORMAT = {"measured": "{:.3g}", "predicted": "{:.3g}", "signed error": "{:+.0%}"}


def hardware_line(hw) -> str:
    """The link and compute figures of a hardware profile: 'α = … µs, β = … GB/s, … GFLOP/s' (latency α and
    bandwidth β of the intra-node link, the fp32 peak times the profile's efficiency), and, where the profile has
    measured kernels, that compute is priced by them (chapter "Where the time goes")."""
    kernels = ("; compute priced kernel by kernel from the profile's microbenchmarks (the kernel time model)"
               if getattr(hw, "kernels", None) is not None else "")
    return (f"α = {hw.intra_latency * 1e6:.0f} µs, β = {hw.intra_bandwidth / 1e9:.2f} GB/s, "
            f"{hw.flops_fp32 * hw.flops_efficiency / 1e9:.0f} GFLOP/s{kernels}")


def memory_kind(peak: bool) -> str:
    """What the measured memory is: each category's peak in the step (``peak``), else the model states at rest."""
    if peak:
        return "the peak of a training step by category (exact tensor accounting)"
    return "the model states each rank holds between steps (the run's `model_state_bytes_at_rest`)"


def memory_by_category(frame, peak: bool, keep=("label",)):
    """One row per run of ``frame`` (with a ``prediction`` column) and memory category: the run's ``keep``
    columns, ``category`` (words), ``measured`` (the most loaded rank, :func:`.rows.most_loaded_memory`),
    ``predicted`` (the cost model's ``memory_bytes``) and the signed ``error``. Activations only where the run
    measured a step's peaks (``peak``)."""
    table = []
    for _, run in frame.iterrows():
        predicted = run.prediction["memory_bytes"]
        for category, value in most_loaded_memory(run, peak).items():
            table.append({**{k: run[k] for k in keep}, "category": category.replace("_", " "), "measured": value,
                          "predicted": predicted[category]})
    memory = pd.DataFrame(table)
    memory["error"] = signed_error(memory.predicted, memory.measured)
    return memory


def model_state_rows(memory):
    """The rows of a :func:`memory_by_category` table that hold model states (every category but activations)."""
    return memory[memory.category != "activations"]


def memory_rows(memory) -> list[dict]:
    """Rows of the signed-error table for a :func:`memory_by_category` table: 'memory: <category>', in MiB."""
    return [dict(quantity=f"memory: {r.category}", configuration=r.label, measured=r.measured / MiB,
                 predicted=r.predicted / MiB, unit="MiB") for r in memory.itertuples()]


def time_rows(run) -> list[dict]:
    """Rows of the signed-error table for one run's iteration time in ms: the framework's prediction and, where
    the run made one, its prediction from profiled layer times ('iteration time (profiled)')."""
    table = [dict(quantity="iteration time", configuration=run.label, measured=run.measured_s * 1e3,
                  predicted=run.predicted_s * 1e3, unit="ms")]
    if pd.notna(run.profiled_s):
        table.append(dict(quantity="iteration time (profiled)", configuration=run.label,
                          measured=run.measured_s * 1e3, predicted=run.profiled_s * 1e3, unit="ms"))
    return table


def error_table(table_rows: list[dict]):
    """The signed-error table: ``table_rows`` (quantity, configuration, measured, predicted, unit) and their
    ``error`` (predicted − measured)/measured, NaN where the measurement is zero."""
    table = pd.DataFrame(table_rows)
    table["error"] = signed_error(table.predicted, table.measured)
    return table.replace([np.inf, -np.inf], np.nan)


def styled_error_table(table):
    """:func:`error_table` as the book shows it: three significant digits, signed percentages, '–' for none."""
    return table.rename(columns={"error": "signed error"}).style.format(
        ERROR_TABLE_FORMAT, na_rep="–").hide(axis="index")


def errors_of(table, quantity: str):
    """The signed errors of one ``quantity`` of an :func:`error_table`, without the missing ones."""
    return table[table.quantity == quantity].error.dropna()


def error_range(errors) -> str:
    """'−a% to +b%': the smallest and the largest of ``errors``, as signed whole percentages."""
    return f"{errors.min():+.0%} to {errors.max():+.0%}"
