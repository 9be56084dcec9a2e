"""Tensor parallelism (``chapters/tensor_parallel.md``): the runs of ``notebooks/tensor_parallel.ipynb`` — one rank,
and tensor parallelism over two ranks without and with sequence parallelism, at several microbatch sizes — beside
the cost model: memory per rank, iteration time, tensor-parallel bytes per layer, and the verdict.

- :func:`layouts`, :func:`with_predictions`, :func:`model_line`: the runs, their layouts and predictions;
- :func:`state_share`, :func:`activation_sentence`: memory per rank against one rank's;
- :func:`speeds`, :func:`speedups`, :func:`predicted_speedups`, :func:`sequence_parallel_time`,
  :func:`communication_sentence`: time and communication;
- :func:`layout_colours`, :func:`draw_times`, :func:`draw_layer_bytes`: the time and communication figure;
- :func:`error_rows`, :func:`profiled_errors`: the signed errors;
- :func:`statistics`, :func:`finding`: what the verdict's rule decides on, and the finding.
"""
from __future__ import annotations

import math

import pandas as pd

from ..results import signed_error
from . import rows
from .verdicts import share
from .measured_vs_predicted import error_range, errors_of, memory_rows, model_state_rows, time_rows

SENT = "communication.sent_bytes.tensor_parallel"
LAYERS = "config.model.layers"
ONE_RANK, TP2, TP2_SP = "1 rank", "tp 2", "tp 2 + SP"  # the layouts compared


def layouts(tp):
    """The runs that succeeded with ``b`` (microbatch), ``t`` (tensor-parallel ranks), ``sp`` (sequence
    parallelism), ``layout`` ('1 rank', 'tp t', 'tp t + SP') and ``label`` (layout and b), sorted by b, t, sp."""
    tp = rows.ok(tp)
    tp["b"] = tp["config.layout.micro_batch"]
    tp["t"] = tp["config.layout.tp"]
    tp["sp"] = rows.truthy(tp["config.layout.sequence_parallel"])
    tp["layout"] = ["1 rank" if t == 1 else f"tp {t}" + (" + SP" if sp else "") for t, sp in zip(tp.t, tp.sp)]
    tp["label"] = tp["layout"] + ", b = " + tp.b.astype(str)
    return tp.sort_values(["b", "t", "sp"])


def with_predictions(tp, hw):
    """``tp`` with the cost model beside each run (:func:`.rows.with_predictions`) and
    ``predicted_tp_bytes_layer``, the tensor-parallel bytes one rank sends per layer: four all-reduces of b·s·h
    values per layer, or their all-gather and reduce-scatter pairs with sequence parallelism."""
    tp = rows.with_predictions(tp, hw)
    sent = pd.Series([p["communication_bytes"]["tensor_parallel"] for p in tp.prediction], index=tp.index)
    tp["predicted_tp_bytes_layer"] = sent / tp[LAYERS]
    return tp


def model_line(run) -> str:
    """The model trained, in words: name, layers L, hidden size h and sequence length s."""
    return (f"{run['config.model.name']} (L = {run[LAYERS]}, h = {run['config.model.hidden']}, "
            f"s = {run['config.model.seq']})")


def state_share(memory) -> float:
    """The model states a rank keeps at tp 2 over one rank's (measured, most loaded rank), the mean over
    microbatch sizes; from a :func:`.measured_vs_predicted.memory_by_category` table with ``layout`` and ``b``."""
    states = model_state_rows(memory)
    one = states[states.layout == ONE_RANK].groupby("b").measured.sum()
    two = states[states.layout == TP2].groupby("b").measured.sum()
    return (two / one).mean()


def activation_sentence(memory, peak: bool) -> str:
    """The activations per rank of tp 2 and tp 2 + SP over one rank's (mean over microbatch sizes), in words;
    that they were not measured unless the runs measured a step's peaks (``peak``)."""
    if not peak:
        return "Activations were not measured in this build; only the model states are compared."
    per_rank = memory[memory.category == "activations"].pivot_table(index="b", columns="layout", values="measured")
    plain, sequence = (per_rank[TP2] / per_rank[ONE_RANK]).mean(), (per_rank[TP2_SP] / per_rank[ONE_RANK]).mean()
    return (f"Measured activations per rank: tensor parallelism keeps {plain:.0%} of one rank's, sequence "
            f"parallelism {sequence:.0%}.")


def speeds(tp, column: str = "measured_s"):
    """Iteration time ``column`` (measured or ``predicted_s``) by microbatch size (rows) and layout (columns)."""
    return tp.pivot_table(index="b", columns="layout", values=column)


def speedups(speed) -> str:
    """One rank's time over tp 2's at each microbatch size: 'b = 1: 1.20×, b = 2: …'."""
    return ", ".join(f"b = {b}: {speed.loc[b, ONE_RANK] / speed.loc[b, TP2]:.2f}×" for b in speed.index)


def predicted_speedups(predicted) -> str:
    """The framework's one-rank time over tp 2's at each microbatch size: '1.20×, …'."""
    return ", ".join(f"{predicted.loc[b, ONE_RANK] / predicted.loc[b, TP2]:.2f}×" for b in predicted.index)


def sequence_parallel_time(speed) -> str:
    """tp 2 + SP's time over tp 2's at each microbatch size, in a sentence; empty without sequence-parallel runs."""
    if TP2_SP not in speed:
        return ""
    ratios = ", ".join(f"{speed.loc[b, TP2_SP] / speed.loc[b, TP2]:.2f}×" for b in speed.index)
    sizes = ", ".join(map(str, speed.index))
    return (f"Sequence parallelism took {ratios} the time of plain tensor parallelism (b = {sizes}); the framework "
            "prices both alike, since their collectives move the same bytes.")


def communication_sentence(tp, comm: bool) -> str:
    """The measured tensor-parallel bytes per layer against the framework's (error range), and the collective calls
    each layout made per step against the framework's 4L; that they were not measured unless ``comm``."""
    if not comm:
        return "communication bytes were not measured in this build; the right panel shows the prediction only"
    two_rank = tp[tp.t > 1]
    err = signed_error(two_rank.predicted_tp_bytes_layer, two_rank[SENT] / two_rank[LAYERS])
    calls = two_rank.groupby("layout")["communication.calls.tensor_parallel"].max()
    return (f"the measured tensor-parallel bytes per layer differ from the framework's by {error_range(err)}. The "
            "measurement counts every tensor-parallel collective of the step, including those outside the layers' "
            "four (for example gradient reductions of replicated parameters that see only part of the sequence); per "
            "step the runs made " + ", ".join(f"{int(n)} collective calls with {k}" for k, n in calls.items())
            + f", against the framework's {4 * int(two_rank[LAYERS].iloc[0])} all-reduces (or their "
            "all-gather/reduce-scatter pairs)")


def layout_colours(tp) -> dict:
    """One colour of the current cycle per layout, in the order the layouts first appear."""
    import matplotlib.pyplot as plt

    return dict(zip(dict.fromkeys(tp.layout), plt.rcParams["axes.prop_cycle"].by_key()["color"]))


def draw_times(ax, tp, colours: dict) -> None:
    """Iteration time against the microbatch size per layout: measured points, the prediction dashed, the
    prediction from profiled layer times dotted where the runs have it."""
    for layout, part in tp.groupby("layout", sort=False):
        c = colours[layout]
        ax.plot(part.b, part.measured_s * 1e3, "o", color=c, label=f"{layout}, measured")
        ax.plot(part.b, part.predicted_s * 1e3, "--x", color=c, label=f"{layout}, predicted")
        if part.profiled_s.notna().any():
            ax.plot(part.b, part.profiled_s * 1e3, ":+", color=c, label=f"{layout}, profiled")
    ax.set_xlabel("microbatch size b")
    ax.set_ylabel("iteration time (ms)")
    ax.legend(fontsize="x-small")


def draw_layer_bytes(ax, tp, comm: bool, colours: dict) -> None:
    """Tensor-parallel kB sent per layer and rank against the microbatch size, for each layout over several ranks:
    measured points where measured (``comm``), the prediction dashed."""
    for layout, part in tp.groupby("layout", sort=False):
        if layout == ONE_RANK:
            continue
        if comm:
            ax.plot(part.b, part[SENT] / part[LAYERS] / 1e3, "o", color=colours[layout], label=f"{layout}, measured")
        ax.plot(part.b, part.predicted_tp_bytes_layer / 1e3, "--x", color=colours[layout], label=f"{layout}, predicted")
    ax.set_xlabel("microbatch size b")
    ax.set_ylabel("tensor-parallel kB sent per layer and rank")
    ax.legend(fontsize="x-small")


def error_rows(memory, tp, comm: bool) -> list[dict]:
    """The rows of the signed-error table: memory per category, then each run's iteration time and, over several
    ranks where measured (``comm``), its tensor-parallel kB sent per layer."""
    table = memory_rows(memory)
    for _, run in tp.iterrows():
        table += time_rows(run)
        if comm and run.t > 1:
            table.append(dict(quantity="TP bytes sent per layer", configuration=run.label,
                              measured=run[SENT] / run[LAYERS] / 1e3, predicted=run.predicted_tp_bytes_layer / 1e3,
                              unit="kB"))
    return table


def profiled_errors(table) -> str:
    """The sentence on the time predicted from profiled layer times (its error range); empty where none was made."""
    errors = errors_of(table, "iteration time (profiled)")
    if not len(errors):
        return ""
    return (f"With compute from profiled layer times (the run's second prediction, dotted in the time figure) the "
            f"error ranges from {error_range(errors)}.")


def statistics(memory, table, speed, predicted, peak: bool, comm: bool) -> dict:
    """The rule's statistics (:mod:`distperf.analysis.verdicts`): the largest |error| of the model states, of the
    bytes sent per layer (``comm``: measured) and of the activations (``peak``: measured), NaN where not measured,
    and the share of microbatch sizes at which the framework, like the measurement, has tp 2 faster (or slower)
    than one rank."""
    sent = table[table.quantity == "TP bytes sent per layer"]
    activations = memory[memory.category == "activations"]
    agree = (speed[ONE_RANK] > speed[TP2]) == (predicted[ONE_RANK] > predicted[TP2])
    return {"states_error": float(model_state_rows(memory).error.abs().max()),
            "comm_error": float(sent.error.abs().max()) if comm and len(sent) else math.nan,
            "activations_error": float(activations.error.abs().max()) if peak and len(activations) else math.nan,
            "faster_agree": share(int(agree.sum()), len(agree))}

def finding(share: float, speed, predicted) -> str:
    """The verdict's finding: tp 2's share of the model states, and its speed-up over one rank at the largest
    microbatch, measured and predicted."""
    b, b_predicted = speed.index.max(), predicted.index.max()
    return (f"At tp = 2 a rank keeps {share:.0%} of the model states; tp 2 ran "
            f"{speed.loc[b, ONE_RANK] / speed.loc[b, TP2]:.2f}× one rank's speed at b = {b} (framework: "
            f"{predicted.loc[b_predicted, ONE_RANK] / predicted.loc[b_predicted, TP2]:.2f}×)")
