"""What the chapter *PipeDream-2BW* (``chapters/twobw.md``) computes: 2BW's throughput against PipeDream-Flush
and GPipe (the runs of the experiment ``pipeline_schedules``, calibrated as in :mod:`.pipeline_schedules`), its
second weight version between steps, its convergence against vanilla 1F1B (experiments ``twobw_convergence`` and
``twobw_simulation``), the verdict, and the paper's results it quotes (:mod:`distperf.published`).

- :func:`throughput_runs`, :func:`speedups`: tokens per second, measured and predicted, and 2BW's speed-up;
- :func:`weight_ratio`: 2BW's parameter bytes over 1F1B's, per stage;
- :func:`latest_grid`, :func:`loss_curves`, :func:`final_losses`, :func:`convergence_summary`,
  :func:`simulation_remark`: the loss curves, paired by seed, and whether 2BW tracks vanilla training;
- :func:`long_runs`, :func:`held_out_gaps`, :func:`gap_bound`, :func:`gap_sentence`, :func:`draw_long_study`: the
  long study (``twobw_convergence_long``, archived reference data): 2BW against no pipeline on held-out text, the
  paired gap in final held-out loss per learning rate with its 95 % interval, against the declared margin;
- :func:`statistics`, :func:`finding` and the sentences built from data;
- :func:`draw_memory_model`, :func:`draw_convergence`: the chapter's figures.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from .. import published
from ..config import Config
from ..cost import schedules
from ..results import signed_error
from . import rows
from .pipeline_schedules import microbatch_reference, rank_flops
from .repeats import interval, ratio_interval

NAMES = {"gpipe": "GPipe", "1f1b": "PipeDream-Flush (1F1B)", "2bw": "PipeDream-2BW"}
TAIL_FRACTION = 5  # the final loss is the mean over the last fifth of the steps
SMOOTHING_FRACTION = 20  # the curves' moving mean spans a twentieth of the steps
SIMULATION_AGREES = 0.1  # the simulated rule agrees when within a tenth of the trainer's gap to vanilla

THROUGHPUT_TABLE_FORMAT = {"measured tokens/s": "{:.0f}", "predicted tokens/s": "{:.0f}", "signed error": "{:+.0%}"}
SPEEDUP_TABLE_FORMAT = {"measured speed-up": "{:.2f}×", "predicted speed-up": "{:.2f}×", "signed error": "{:+.0%}"}
CONVERGENCE_TABLE_FORMAT = {"vanilla 1F1B": "{:.4f}", "2BW": "{:.4f}", "2BW − vanilla": "{:+.4f}"}


def paper_speedups() -> dict:
    """The largest speed-ups the paper reports for 2BW (§5.2, Fig. 6), over PipeDream-Flush and over GPipe, as
    the chapter quotes them ("1.6×")."""
    return {other: f"{published.value(f'2BW against {other}', 'speed-up, at most'):g}×"
            for other in ("PipeDream-Flush", "GPipe")}


def rank_times(cfg: Config, t_microbatch: float) -> list[float]:
    """t_r: the one-process time of a microbatch split by each rank's share of the FLOPs, t·F_r / Σ F."""
    per_rank = rank_flops(cfg)
    return [t_microbatch * x / sum(per_rank) for x in per_rank]


def throughput_runs(runs):
    """The GPipe, 1F1B and 2BW rows of :func:`.pipeline_schedules.schedule_runs` with the calibrated
    ``predicted_s`` (v = 1), measured and predicted tokens per second, the signed ``error`` of the throughput and
    the schedule's ``name``; rows without a one-process reference on their machine are dropped."""
    reference = microbatch_reference(runs)
    pipes = runs[runs.schedule.isin(list(NAMES))].copy()
    pred = []
    for _, row in pipes.iterrows():
        t_mb = reference.get((row.machine, row.source), np.nan)
        pred.append(schedules.pipeline_time(row.schedule, rank_times(rows.config_of_row(row), t_mb), row.m, 1))
    pipes["predicted_s"] = pred
    tokens = pipes["config.layout.micro_batch"] * pipes["m"] * pipes["config.model.seq"]
    pipes["measured_tps"] = tokens / pipes["iteration_time_s.median"]
    pipes["predicted_tps"] = tokens / pipes["predicted_s"]
    pipes["error"] = signed_error(pipes.predicted_tps, pipes.measured_tps)
    pipes["name"] = pipes.schedule.map(NAMES)
    return pipes.dropna(subset=["predicted_s"])


def speedups(pipes):
    """This build's speed-up of 2BW over 1F1B and over GPipe at each m where both ran, measured and predicted
    (tokens per second over tokens per second), with the signed error of the prediction."""
    fresh = pipes[pipes.source == "fresh"].set_index(["schedule", "m"])
    speed = []
    for m in sorted({m for _, m in fresh.index}):
        for other in ("1f1b", "gpipe"):
            if ("2bw", m) in fresh.index and (other, m) in fresh.index:
                a, o = fresh.loc[("2bw", m)], fresh.loc[(other, m)]
                speed.append(dict(m=m, against=NAMES[other], measured=a.measured_tps / o.measured_tps,
                                  predicted=a.predicted_tps / o.predicted_tps))
    speed = pd.DataFrame(speed, columns=["m", "against", "measured", "predicted"])
    speed["signed error"] = signed_error(speed.predicted, speed.measured)
    return speed


def throughput_table(pipes):
    """Throughput per machine, schedule and m, under the names the chapter shows."""
    table = pipes[["machine", "name", "m", "measured_tps", "predicted_tps", "error"]]
    table = table.sort_values(["machine", "name", "m"])
    return table.rename(columns={"name": "schedule", "measured_tps": "measured tokens/s",
                                 "predicted_tps": "predicted tokens/s", "error": "signed error"})


def speedup_table(speed):
    """:func:`speedups` under the names the chapter shows."""
    return speed.rename(columns={"measured": "measured speed-up", "predicted": "predicted speed-up"})


def weight_ratio(pipes):
    """Per stage, the largest parameter bytes this build's 2BW runs keep between steps over 1F1B's (empty where
    either was not measured)."""
    mem = pd.DataFrame([dict(name=row["name"], schedule=row.schedule, m=row.m, stage=r, weights=x["parameters"])
                        for _, row in pipes[pipes.source == "fresh"].iterrows()
                        for r, x in enumerate(rows.json_cell(row["model_state_bytes_at_rest"]))])
    if not len(mem):
        return pd.Series(dtype=float)
    w = mem.groupby(["schedule", "stage"]).weights.max().unstack("schedule")
    return (w["2bw"] / w["1f1b"]) if {"2bw", "1f1b"} <= set(w.columns) else pd.Series(dtype=float)


def weight_ratio_sentence(ratio) -> str:
    """:func:`weight_ratio` per stage, or "not measured"."""
    return ", ".join(f"{v:.3f} on stage {r}" for r, v in ratio.items()) or "not measured"


def version_sentence(ratio) -> str:
    """Whether the measured ratio of :func:`weight_ratio` is the schedule's second weight version (2×) and nothing
    more, within 1 %, or how far it is from it."""
    if not len(ratio):
        return "the weight versions were not measured"
    off = max(abs(v / 2 - 1) for v in ratio.values)
    if off <= 0.01:
        return "the second weight version the schedule needs and nothing more (2× within 1 %)"
    return f"up to {off:.0%} away from the second weight version alone (2×)"


# --- 2BW against Flush on the same engine (experiment "twobw_engines") -----------------------------------------

ENGINE_NAMES = {"2bw": "PipeDream-2BW", "2bw-flush": "PipeDream-Flush (same engine)", "1f1b": "torch 1F1B (Flush)",
                "gpipe": "torch GPipe", "gpipe+recompute": "torch GPipe, full recomputation"}
SIMULATED_DEPTHS = (2, 4, 8, 16)
SIMULATED_M = (2, 4, 8, 16, 32)


def engine_runs(table):
    """The ``ok`` runs of the engines experiment on this build, every repeat its own row, with ``schedule`` (GPipe with full recomputation
    as ``gpipe+recompute``), ``m``, ``time_s`` (the run's median step) and ``peak`` (the most loaded rank's
    measured total, bytes)."""
    runs = table[table["status"] == "ok"]  # every repeat: the intervals are taken over them
    runs = runs[runs.source == "fresh"] if "source" in runs else runs
    out = runs.assign(m=runs["arg.microbatches"].astype(int), time_s=runs["iteration_time_s.median"].astype(float),
                      schedule=np.where((runs["arg.schedule"] == "gpipe") & (runs["config.layout.recompute"] == "full"),
                                        "gpipe+recompute", runs["arg.schedule"]))
    out["peak"] = out["memory_bytes.total"].astype(float) if "memory_bytes.total" in out else np.nan
    return out


def engine_speedups(runs):
    """At each m, 2BW's speed-up over each other schedule (their time over 2BW's: :func:`~.repeats.ratio_interval`
    of the repeats' median steps) with its 95 % interval and the repeats behind it."""
    out = []
    two = runs[runs.schedule == "2bw"]
    for other in ("2bw-flush", "1f1b", "gpipe", "gpipe+recompute"):
        for m, part in runs[runs.schedule == other].groupby("m"):
            mine = two[two.m == m]
            if len(mine):
                ratio, low, high = ratio_interval(part.time_s, mine.time_s)
                out.append({"m": m, "against": ENGINE_NAMES[other], "speed-up": ratio, "low": low, "high": high,
                            "repeats": min(len(part), len(mine))})
    return pd.DataFrame(out, columns=["m", "against", "speed-up", "low", "high", "repeats"])


def same_engine(speed):
    """The rows of :func:`engine_speedups` against Flush on the 2BW engine."""
    return speed[speed.against == ENGINE_NAMES["2bw-flush"]]


def stage_times(runs, depth: int) -> tuple[list[float], list[float], float]:
    """Per-stage forward and backward times of one microbatch, and the slowest stage's optimizer step, for a
    pipeline of ``depth`` stages of the measured stage: each stage holds the layers one stage of the measured
    two-stage runs holds, the first adds the embeddings and the last the head (the parts each run timed with its
    ranks at once, ``part_times.*``, median over the 2BW and Flush runs)."""
    parts = runs[runs.schedule.isin(["2bw", "2bw-flush"])]
    col = {k: float(parts[f"part_times.{k}"].median()) for k in
           ("layer.forward_s", "layer.backward_s", "embedding.forward_s", "embedding.backward_s", "head.forward_s",
            "head.backward_s", "optimizer.layer_s", "optimizer.first_s", "optimizer.last_s")}
    per_stage = int(parts["config.model.layers"].iloc[0]) // int(parts["arg.pp"].iloc[0])
    forward, backward = [], []
    for r in range(depth):
        ends = ("embedding",) * (r == 0) + ("head",) * (r == depth - 1)
        forward.append(per_stage * col["layer.forward_s"] + sum(col[f"{e}.forward_s"] for e in ends))
        backward.append(per_stage * col["layer.backward_s"] + sum(col[f"{e}.backward_s"] for e in ends))
    update = per_stage * col["optimizer.layer_s"] + max(col["optimizer.first_s"], col["optimizer.last_s"])
    return forward, backward, update


def simulated_speedups(runs, depths=SIMULATED_DEPTHS, ms=SIMULATED_M, batches: int = 4):
    """2BW's speed-up over Flush from the schedule simulator (:func:`distperf.parallel.twobw_schedule.batch_time`:
    both engines' action lists, free communication) fed with :func:`stage_times`, at each depth and each m ≥ d."""
    from ..parallel import twobw_schedule as sch

    out = []
    for d in depths:
        forward, backward, update = stage_times(runs, d)
        for m in ms:
            if m >= d:
                two = sch.batch_time(sch.schedule(d, m, batches), forward, backward, update)
                flush = sch.batch_time(sch.flush_schedule(d, m, batches), forward, backward, update)
                out.append({"depth": d, "m": m, "simulated": flush / two})
    return pd.DataFrame(out, columns=["depth", "m", "simulated"])


def simulation_check(speed, simulated):
    """The measured depth-2 speed-ups over Flush (same engine) beside the simulated ones, with the signed error."""
    measured = same_engine(speed)[["m", "speed-up", "low", "high"]]
    sim = simulated[simulated.depth == 2][["m", "simulated"]]
    both = measured.merge(sim, on="m")
    both["signed error"] = signed_error(both.simulated, both["speed-up"])
    return both


def engine_memory(runs):
    """Per schedule and m: the most loaded rank's measured peak (median over repeats) beside the cost model's
    most loaded stage (the run's own prediction), and the signed error."""
    runs = runs.dropna(subset=["peak"])
    predicted = runs["prediction.memory_bytes_per_stage"].map(lambda x: max(json.loads(x)) if isinstance(x, str)
                                                              else np.nan)
    table = runs.assign(predicted=predicted).groupby(["schedule", "m"], as_index=False)[["peak", "predicted"]].median()
    table["signed error"] = signed_error(table.predicted, table.peak)
    table["schedule"] = table.schedule.map(ENGINE_NAMES)
    return table.rename(columns={"peak": "measured (bytes)", "predicted": "predicted (bytes)"})


def capped(runs):
    """The memory-capped regime: at each m, the memory cap is 2BW's measured peak (its most loaded rank); GPipe
    must fit under it, without recomputation if it can, else with full recomputation, else not at all. Returns
    per m the cap, GPipe's peaks, which GPipe runs, and 2BW's speed-up over it (:func:`~.repeats.ratio_interval`)."""
    out = []
    for m, part in runs.groupby("m"):
        peaks = part.groupby("schedule").peak.median()
        if "2bw" not in peaks:
            continue
        cap = peaks["2bw"]
        choice = next((s for s in ("gpipe", "gpipe+recompute") if s in peaks and peaks[s] <= cap), None)
        ratio = low = high = np.nan
        if choice is not None:
            ratio, low, high = ratio_interval(part[part.schedule == choice].time_s,
                                              part[part.schedule == "2bw"].time_s)
        out.append({"m": m, "cap (MiB)": cap / 2**20, "GPipe (MiB)": peaks.get("gpipe", np.nan) / 2**20,
                    "GPipe + recomputation (MiB)": peaks.get("gpipe+recompute", np.nan) / 2**20,
                    "GPipe under the cap": ENGINE_NAMES[choice] if choice else "does not fit",
                    "speed-up": ratio, "low": low, "high": high})
    return pd.DataFrame(out)


def interval_text(row) -> str:
    """'1.12× [1.05, 1.19]' from a row with ``speed-up``, ``low`` and ``high``."""
    if row["low"] != row["low"]:
        return f"{row['speed-up']:.2f}× (one repeat, no interval)"
    return f"{row['speed-up']:.2f}× [{row['low']:.2f}, {row['high']:.2f}]"


def latest_grid(conv):
    """The convergence runs that ran with the learning rate and length of the latest run (a results table may
    also hold rows of an earlier grid), with ``head`` "tied head" or "untied head"."""
    conv = rows.ok(conv)
    latest = conv.sort_values("date").iloc[-1]
    same = (conv["options.lr"] == latest["options.lr"]) & (conv["options.steps"] == latest["options.steps"])
    conv = conv[same].copy()
    conv["head"] = np.where(conv["config.model.tied"].astype(str) == "True", "tied head", "untied head")
    return conv


def loss_curves(conv) -> tuple[pd.DataFrame, int, int]:
    """(one row per run and step with the loss and its moving mean ``smoothed`` over ``window`` steps, the number
    of steps, the window: a twentieth of the steps, at least one)."""
    curves = pd.DataFrame([dict(machine=row.machine, source=row.source, head=row["head"], seed=int(row["arg.seed"]),
                                schedule=row["arg.schedule"], step=i + 1, loss=x)
                           for _, row in conv.iterrows() for i, x in enumerate(rows.json_cell(row["losses"]))])
    steps = int(curves.step.max())
    window = max(1, steps // SMOOTHING_FRACTION)
    curves["smoothed"] = curves.groupby(["machine", "source", "head", "seed", "schedule"]).loss.transform(
        lambda x: x.rolling(window, min_periods=1).mean())
    return curves, steps, window


def tail_start(steps: int) -> int:
    """The number of steps before the last fifth (at least the last step is kept)."""
    return steps - max(1, steps // TAIL_FRACTION)


def final_losses(curves, steps: int):
    """Mean loss over the last fifth of the steps per head and seed (rows), for 1F1B and 2BW (columns), with the
    paired ``difference`` 2BW − 1F1B."""
    tail = curves[curves.step > tail_start(steps)]
    final = tail.groupby(["head", "seed", "schedule"]).loss.mean().unstack("schedule")
    final["difference"] = final["2bw"] - final["1f1b"]
    return final


def convergence_summary(final):
    """Per head: mean final loss of vanilla and 2BW, mean paired difference ``diff``, the seed-to-seed standard
    deviation of vanilla ``spread`` (NaN with one seed), and whether 2BW ``tracks`` vanilla: |diff| ≤ spread."""
    summary = final.groupby("head").agg(vanilla=("1f1b", "mean"), twobw=("2bw", "mean"), diff=("difference", "mean"),
                                        spread=("1f1b", lambda x: x.std(ddof=1) if len(x) > 1 else np.nan))
    summary["tracks"] = summary["diff"].abs() <= summary["spread"]
    return summary


def convergence_table(final):
    """:func:`final_losses` per head and seed under the names the chapter shows."""
    return final.reset_index().rename(columns={"head": "head", "1f1b": "vanilla 1F1B", "2bw": "2BW",
                                               "difference": "2BW − vanilla"})


def loss_drop(curves, final) -> float:
    """How far the loss falls over a run: the mean first-step loss over both schedules minus vanilla's mean
    final loss."""
    first = curves[curves.step == 1].groupby("schedule").loss.mean()
    return first.mean() - final["1f1b"].mean()


def summary_sentence(summary) -> str:
    """Per head, 2BW's final loss against vanilla's and whether it is within the seed-to-seed spread."""
    return "; ".join(
        f"with the {head}, 2BW's loss differs from vanilla by {r['diff']:+.3f} nats per byte "
        f"({r['diff'] / r.vanilla:+.1%}), {'within' if r.tracks else 'outside'} the seed-to-seed spread of vanilla "
        f"({r.spread:.3f})" for head, r in summary.iterrows())


def seed_count(final) -> int:
    """The number of seeds :func:`final_losses` pairs."""
    return final.reset_index().seed.nunique()


def simulation_runs(sim, steps: int):
    """This build's runs of the one-process simulation (experiment ``twobw_simulation``) as long as the
    convergence runs."""
    return sim[(sim.source == "fresh") & (sim.steps == steps)]


def simulation_remark(sim, final, steps: int, summary) -> str:
    """What the one-process simulation of the delayed update (``sim``: this build's rows of the same length)
    says: whether the trainer's 2BW (seed 0, tied head) ends within a tenth of its gap to vanilla of the rule's
    own final loss; without a simulation, whether the delay costs more than the seed noise."""
    if len(sim):
        sim_losses = np.array(rows.json_cell(sim.iloc[-1]["losses"]))
        sim_tail = sim_losses[tail_start(steps):].mean()
        trainer_tail = final.loc[("tied head", 0), "2bw"] if ("tied head", 0) in final.index else np.nan
        vanilla_tail = final.loc[("tied head", 0), "1f1b"] if ("tied head", 0) in final.index else np.nan
        agree = abs(sim_tail - trainer_tail) <= SIMULATION_AGREES * abs(trainer_tail - vanilla_tail)
        return (f"A one-process simulation of the rule W(t+1) = W(t) − ν∇f(W(t−1)) — no pipeline, same model, "
                f"data and seed 0 with the tied head — ends at {sim_tail:.3f} nats per byte against the 2BW trainer's "
                f"{trainer_tail:.3f} and vanilla's {vanilla_tail:.3f}: "
                + ("the gap belongs to the one-step-stale update at this learning rate and length, not to the "
                   "pipeline that implements it." if agree else
                   "the trainer does not follow the rule it implements here, a question for the trainer."))
    if not summary.tracks.any():
        return ("At this scale the one-step delay costs more than the seed-to-seed noise; the paper's runs are far "
                "longer and use a ten times smaller learning rate.")
    return "The delay costs nothing measurable here."


def conv_model_line(row) -> str:
    """The convergence runs' model and training in a few words."""
    return (f"{int(row['config.model.layers'])} layers, h = {int(row['config.model.hidden'])}, "
            f"s = {int(row['config.model.seq'])}, b = {int(row['config.layout.micro_batch'])}, "
            f"m = {int(row['config.layout.microbatches'])}, Adam, lr {row['options.lr']:g}")


def flush_speedups(speed):
    """The rows of :func:`speedups` against PipeDream-Flush."""
    return speed[speed.against == NAMES["1f1b"]]


def always_faster(flush_speed) -> bool:
    """Whether 2BW was measured faster than Flush at every m (and at least one)."""
    return bool(len(flush_speed)) and bool((flush_speed.measured > 1).all())


def faster_sentence(faster: bool) -> str:
    """:func:`always_faster` in words, as the chapter's sentence needs it."""
    return "faster than" if faster else "not always faster than"


def speed_sentence(flush_speed) -> str:
    """Measured and predicted speed-up over Flush at each m, or "not measured"."""
    return ", ".join(f"{r.measured:.2f}× (predicted {r.predicted:.2f}×) at m = {r.m}"
                     for r in flush_speed.itertuples()) or "not measured"


def statistics(engine_speed, gaps) -> dict:
    """The rule's statistics (:mod:`distperf.analysis.verdicts`): the lower 95 % bound of 2BW's speed-up over Flush
    on the same engine (:func:`engine_speedups`) at the m where it is smallest (NaN without repeats), and the
    largest |end| of the held-out loss gap's 95 % intervals of the long study (:func:`gap_bound`); NaN where not
    measured."""
    same = same_engine(engine_speed).dropna(subset=["low"])
    return {"speedup": float(same["low"].min()) if len(same) else math.nan, "gap_bound": gap_bound(gaps)}


def finding(flush_speed, gaps) -> str:
    """The chapter's finding in one sentence: the speed-up over torch's Flush, and the long study's held-out gaps."""
    text = f"2BW ran {flush_speed.measured.mean():.2f}× as fast as PipeDream-Flush on average"
    if gaps.empty:
        return text + "; the long convergence study has not been run."
    return (text + "; its final held-out loss differed from training without a pipeline by "
            + ", ".join(f"{r.gap:+.3f} [{r.low:+.3f}, {r.high:+.3f}] (lr {r.lr:g})" for r in gaps.itertuples())
            + " nats/byte.")


def draw_memory_model(depth: int = 8, weights: float = 1.0, activations_total: float = 4.0,
                      activations_input: float = 0.05):
    """Per-worker memory of 2BW and GPipe with recomputation (:func:`distperf.cost.schedules.pipedream_2bw_memory`,
    :func:`~distperf.cost.schedules.gpipe_memory`) against m = d, 2d, ..., 8d, in units of |W|; the default sizes
    are illustrative (activations a few times the weights, one stage's input small), not measured."""
    import matplotlib.pyplot as plt

    ms = np.arange(depth, 8 * depth + 1, depth)
    fig, ax = plt.subplots(figsize=(6.0, 3.6))
    ax.plot(ms, [schedules.pipedream_2bw_memory(weights, activations_total, activations_input, depth) for _ in ms],
            ls="--", label="2BW (2 versions)")
    ax.plot(ms, [schedules.gpipe_memory(weights, activations_total, activations_input, depth, m) for m in ms],
            ls="--", label="GPipe (m input stashes)")
    ax.set_xlabel("microbatches per batch m")
    ax.set_ylabel("memory per worker (units of |W|)")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def paper_flush_speedup() -> float:
    """The paper's largest speed-up of 2BW over PipeDream-Flush (§5.2), from the published table."""
    return float(published.value("2BW against PipeDream-Flush", "speed-up, at most"))


def draw_engines(speed, simulated, paper: float):
    """2BW's speed-up over Flush on the same engine against m: measured at depth 2 (points, 95 % intervals) and
    simulated at each depth (lines), with the paper's largest speed-up (dotted)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    from ..plots import PALETTE

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    depths = sorted(simulated.depth.unique())
    colours = dict(zip(depths, sns.color_palette(PALETTE, len(depths))))
    for d in depths:
        part = simulated[simulated.depth == d]
        ax.plot(part.m, part.simulated, color=colours[d], marker=".", lw=1.2, label=f"simulated, depth {d}")
    same = same_engine(speed)
    if len(same):
        err = np.vstack([same["speed-up"] - same["low"].fillna(same["speed-up"]),
                         same["high"].fillna(same["speed-up"]) - same["speed-up"]])
        ax.errorbar(same.m, same["speed-up"], yerr=err, fmt="o", color=colours.get(2, "black"), capsize=3,
                    label="measured, depth 2 (95 % interval)")
    ax.axhline(paper, color="grey", ls=":", lw=1.0, label=f"paper's largest ({paper:g}×)")
    ax.axhline(1.0, color="black", lw=0.6)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("microbatches per batch m")
    ax.set_ylabel("2BW speed-up over Flush")
    ax.legend(fontsize="x-small")
    fig.tight_layout()
    return fig


def simulation_sentence(check) -> str:
    """How far the simulator's depth-2 speed-ups lie from the measured ones."""
    if not len(check):
        return "no depth-2 run to check the simulator against"
    return (f"at depth 2 the simulated speed-ups miss the measured ones by {check['signed error'].min():+.0%} to "
            f"{check['signed error'].max():+.0%} over {len(check)} values of m")


def capped_sentence(table) -> str:
    """What the memory-capped regime shows: at which m GPipe must recompute or does not fit under 2BW's memory, and
    2BW's speed-up there."""
    if not len(table):
        return "the memory-capped regime was not measured"
    parts = []
    for _, r in table.iterrows():
        where = r["GPipe under the cap"]
        if where == "does not fit":
            parts.append(f"at m = {r.m} GPipe does not fit even with recomputation")
        else:
            parts.append(f"at m = {r.m} GPipe runs as {where}, and 2BW is {interval_text(r)} faster")
    return "; ".join(parts)


def draw_convergence(curves, window: int):
    """Per head (rows): the smoothed loss of vanilla 1F1B (solid) and 2BW (dashed), one line per seed, and the
    paired difference 2BW − vanilla per seed."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    from ..plots import PALETTE

    heads = sorted(curves["head"].unique())
    fig, axes = plt.subplots(len(heads), 2, figsize=(9.0, 3.6 * len(heads)), squeeze=False)
    colours = dict(zip(["1f1b", "2bw"], sns.color_palette(PALETTE, 2)))
    for (ax, ax_d), head in zip(axes, heads):
        part_h = curves[curves["head"] == head]
        for (sched, seed), part in part_h.groupby(["schedule", "seed"]):
            ax.plot(part.step, part.smoothed, color=colours[sched], lw=1.0, alpha=0.8,
                    ls="-" if sched == "1f1b" else "--", label=f"{NAMES[sched]}" if seed == part_h.seed.min() else None)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(f"loss (nats/byte, mean of {window} steps)")
        ax.set_title(head, fontsize="small")
        ax.legend(fontsize="x-small")
        _draw_paired_difference(ax_d, part_h, head)
    fig.tight_layout()
    return fig


def _draw_paired_difference(ax, curves_of_head, head: str) -> None:
    """The smoothed 2BW − vanilla loss per seed of one head."""
    import seaborn as sns

    paired = curves_of_head.pivot_table(index=["seed", "step"], columns="schedule", values="smoothed").reset_index()
    for colour, (seed, part) in zip(sns.color_palette("dark", paired.seed.nunique()), paired.groupby("seed")):
        ax.plot(part.step, part["2bw"] - part["1f1b"], color=colour, lw=1.0, label=f"seed {seed}")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("2BW − vanilla (nats/byte)")
    ax.set_title(head, fontsize="small")
    ax.legend(fontsize="x-small")


LONG_NAMES = {"2bw": "PipeDream-2BW", "none": "no pipeline"}


def long_runs(conv):
    """The long study's runs that succeeded, one row each: ``source``, ``machine``, ``lr``, ``seed``, ``method``
    ('2bw' or 'none'), ``steps``, ``held_out`` (final held-out loss, nats per byte), ``train_tail`` (mean training
    loss over the last fifth of the steps), ``losses`` (the training loss: per step, or, in an archived table with
    ``loss_window`` w, the means over windows of w steps) and ``date``, ``commit``."""
    conv = conv[conv["status"] == "ok"]
    out = []
    for _, r in conv.iterrows():
        losses = rows.json_cell(r["losses"])
        window = r.get("loss_window", 1)
        window = int(window) if window == window and window else 1
        steps = len(losses) * window
        out.append(dict(source=r.get("source", "fresh"), machine=r["machine"], lr=float(r["options.lr"]),
                        seed=int(r["options.seed"]), method=str(r["config.layout.schedule"]), steps=steps,
                        held_out=float(r["held_out_loss"]),
                        train_tail=float(np.mean(losses[tail_start(len(losses)):])),
                        losses=losses, window=window, date=r["date"], commit=r["commit"]))
    return pd.DataFrame(out, columns=["source", "machine", "lr", "seed", "method", "steps", "held_out", "train_tail",
                                      "losses", "window", "date", "commit"])


def held_out_gaps(long):
    """Per machine and learning rate: ``seeds`` paired, the mean final held-out loss without a pipeline
    (``baseline``) and the mean paired gap 2BW − no pipeline (``gap``, nats per byte) with its 95 % t-interval
    (``low``, ``high``; :func:`.repeats.interval` on the per-seed differences, NaN with one seed)."""
    out = []
    for (machine, lr), part in long.groupby(["machine", "lr"]):
        paired = part.pivot_table(index="seed", columns="method", values="held_out").dropna()
        if not {"2bw", "none"} <= set(paired.columns) or paired.empty:
            continue
        diff = paired["2bw"] - paired["none"]
        gap, low, high = interval(diff)
        out.append(dict(machine=machine, lr=lr, seeds=len(diff), baseline=float(paired["none"].mean()), gap=gap,
                        low=low, high=high))
    return pd.DataFrame(out, columns=["machine", "lr", "seeds", "baseline", "gap", "low", "high"])


def gap_bound(gaps) -> float:
    """The equivalence test's statistic: the largest |end| of the gaps' 95 % intervals over the learning rates
    (2BW is equivalent within a margin when every interval lies inside ±margin); NaN without an interval."""
    ends = pd.concat([gaps.low.abs(), gaps.high.abs()]).dropna() if len(gaps) else pd.Series(dtype=float)
    return float(ends.max()) if len(ends) else math.nan


def gap_sentence(gaps, margin: float) -> str:
    """Each learning rate's gap with its interval and whether the interval lies inside ±``margin``."""
    if gaps.empty:
        return "the long study has not been run on any machine"
    return "; ".join(
        f"at lr {r.lr:g}, 2BW's final held-out loss differs by {r.gap:+.3f} nats per byte (95 % CI "
        f"{r.low:+.3f} to {r.high:+.3f}, {r.seeds} seeds; {r.gap / r.baseline:+.1%} of {r.baseline:.3f}), "
        + ("inside" if max(abs(r.low), abs(r.high)) <= margin else "not inside") + f" ±{margin:g}"
        for r in gaps.itertuples())


def draw_long_study(long, gaps, margin: float):
    """Left: the training loss of both methods (mean over seeds, smoothed) at each learning rate; right: the
    paired gap in final held-out loss per learning rate with its 95 % interval and the margin ±``margin``."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    from ..plots import PALETTE

    fig, (ax, ax_gap) = plt.subplots(1, 2, figsize=(10, 3.8))
    colours = dict(zip(sorted(long.lr.unique()), sns.color_palette(PALETTE, max(1, long.lr.nunique()))))
    for (lr, method), part in long.groupby(["lr", "method"]):
        curve = np.mean(np.array(part.losses.tolist(), dtype=float), axis=0)
        smooth = pd.Series(curve).rolling(max(1, len(curve) // SMOOTHING_FRACTION), min_periods=1).mean()
        steps = np.arange(1, len(curve) + 1) * int(part.window.iloc[0])
        ax.plot(steps, smooth, color=colours[lr], ls="--" if method == "2bw" else "-", lw=1.0,
                label=f"{LONG_NAMES.get(method, method)}, lr {lr:g}")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss (nats/byte, smoothed)")
    if ax.get_lines():
        ax.legend(fontsize="x-small")
    x = np.arange(len(gaps))
    ax_gap.errorbar(x, gaps.gap, yerr=np.nan_to_num(np.array([gaps.gap - gaps.low, gaps.high - gaps.gap])), fmt="o",
                    capsize=4, color="C0", label="2BW − no pipeline (95 % CI)")
    ax_gap.axhspan(-margin, margin, color="grey", alpha=0.2, label=f"margin ±{margin:g}")
    ax_gap.axhline(0, color="grey", lw=0.8)
    ax_gap.set_xticks(x, [f"lr {lr:g}" for lr in gaps.lr])
    ax_gap.set_ylabel("final held-out loss gap (nats/byte)")
    ax_gap.legend(fontsize="x-small")
    fig.tight_layout()
    return fig
