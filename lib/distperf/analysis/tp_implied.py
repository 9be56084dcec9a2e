"""What DTensor's cost per tensor-parallel collective each held-out run implies, beside what the profile prices
(the chapter "Where the time goes", section "The kernel time model").

The profile's ``tp_collective_s`` (``tp_sp_collective_s`` with sequence parallelism) is fitted on the tiny preset's
tensor-parallel steps (:func:`distperf.measure.path_fits.tensor_parallel_paths`). A held-out run's own step says what
that constant would have had to be for the cost model to meet it: c_run = (measured step − the cost model's step
with DTensor's per-call and per-byte constants at 0) / the step's collectives, priced at the run's own speed
(:func:`distperf.analysis.rows.run_hardware`), per repeat. Set against the profile's constant and against the
tiny steps the calibration took at the message size nearest the run's (the same quantity on the fit's preset), it
shows whether a tensor-parallel run's miss is the model's (the runs imply one value, the profile prices another) or
the machine's (the value one configuration implies moves from one repeat, or one build, to the next by as much as
the miss). A diagnostic only: it reads the held-out runs, and nothing is fitted on it.
"""
from __future__ import annotations

from dataclasses import replace

import pandas as pd

from ..cost.kernels import PROBE_PARTS, STEP_FIT_MODEL
from ..measure.profiles import sidecar_conditions
from . import rows
from .goal_floor import TIME, held_out_repeats
from .noise import strategy

COLUMNS = ["strategy", "micro_batch", "message_kib", "collectives", "repeats", "implied_us", "implied_min_us",
           "implied_max_us", "profile_us", "tiny_us", "tiny_message_kib", "python"]


def _per_call(cfg, hw, prefix: str) -> tuple[float, float]:
    """(the cost model's step on ``hw`` with DTensor's ``prefix`` constants at 0, its collectives: the step's change
    per second of the per-call constant)."""
    from ..cost import predict

    steps = []
    for per_call in (0.0, 1.0):
        costs = replace(hw.kernels, **{f"{prefix}_collective_s": per_call, f"{prefix}_collective_byte_s": 0.0})
        steps.append(predict(cfg, replace(hw, kernels=costs), check=False)["time_s"]["iteration"])
    return steps[0], steps[1] - steps[0]


def _tiny(paths: dict, hw, prefix: str, world: int) -> dict[float, float]:
    """{message KiB: per-call cost c its step implies} over the tiny preset's tensor-parallel steps the calibration
    took (``paths``, its sidecar's ``conditions.paths``), at the calibration's speed."""
    from ..measure.path_fits import stepped_batches, step_terms

    bare_hw = replace(hw, kernels=replace(hw.kernels, **{f"{prefix}_collective_s": 0.0,
                                                         f"{prefix}_collective_byte_s": 0.0}))
    out = {}
    for b in stepped_batches(paths, prefix):
        bare, calls, nbytes = step_terms(STEP_FIT_MODEL, b, prefix == "tp_sp", bare_hw, world)
        if calls > 0:
            out[nbytes / calls / 1024] = (paths[f"{prefix}_b{b}_step_s"] - bare) / calls
    return out


def implied(tables: dict, hw, side: dict | None = None) -> pd.DataFrame:
    """Per held-out tensor-parallel configuration (:data:`COLUMNS`): its strategy and micro-batch, the bytes of one
    collective's message (KiB; a layer's all-reduce, or with sequence parallelism its all-gather), the step's
    collectives, and over its repeats the median, least and largest per-call cost c_run it implies (µs; the module's
    docstring), the profile's constant, the one the calibration's tiny step of the nearest message implies (NaN
    where the sidecar holds none) and the message it was, and the median over the repeats of the run's Python speed
    over the calibration's (its speed probe; NaN without one). Empty without measured kernels."""
    from ..measure.speed import of_row, ratios

    if hw is None or hw.kernels is None:
        return pd.DataFrame(columns=COLUMNS)
    paths = sidecar_conditions(side).get("paths") or {}
    probe = dict(zip(PROBE_PARTS, hw.kernels.probe)) if hw.kernels.probe else None
    found, tiny = {}, {}
    for _, row in held_out_repeats(tables):
        cfg = rows.config_of_row(row)
        if cfg.layout.tp < 2 or cfg.layout.pp > 1 or cfg.layout.dp > 1:
            continue
        prefix = "tp_sp" if cfg.layout.sequence_parallel else "tp"
        bare, calls = _per_call(cfg, rows.run_hardware(hw, row), prefix)
        if calls <= 0:
            continue
        speed = ratios(of_row(row), probe) if probe else None
        entry = found.setdefault(row["config_hash"], {"cfg": cfg, "prefix": prefix, "row": row, "calls": calls,
                                                      "c": [], "python": []})
        entry["c"].append((float(row[TIME]) - bare) / calls)
        entry["python"].append(speed["python"] if speed else float("nan"))
        if prefix not in tiny:
            tiny[prefix] = _tiny(paths, hw, prefix, cfg.layout.tp) if paths else {}
    out = []
    for entry in found.values():
        cfg, prefix, c = entry["cfg"], entry["prefix"], pd.Series(entry["c"])
        kib = cfg.layout.micro_batch * cfg.model.seq * cfg.model.hidden * 4 / 1024
        near = min(tiny[prefix], key=lambda k: abs(k - kib), default=None)
        out.append({"strategy": strategy(entry["row"]), "micro_batch": cfg.layout.micro_batch, "message_kib": kib,
                    "collectives": entry["calls"], "repeats": len(c), "implied_us": c.median() * 1e6,
                    "implied_min_us": c.min() * 1e6, "implied_max_us": c.max() * 1e6,
                    "profile_us": getattr(hw.kernels, f"{prefix}_collective_s") * 1e6,
                    "tiny_us": tiny[prefix][near] * 1e6 if near is not None else float("nan"),
                    "tiny_message_kib": near if near is not None else float("nan"),
                    "python": pd.Series(entry["python"]).median()})
    return pd.DataFrame(out, columns=COLUMNS).sort_values(["strategy", "micro_batch"]).reset_index(drop=True)


def sentence(table: pd.DataFrame) -> str:
    """:func:`implied` in words: each configuration's implied cost and its repeats' range against the profile's and
    the tiny step's, and whether the repeats of one configuration span more than the profile's distance from their
    median."""
    if not len(table):
        return "no held-out run used tensor parallelism alone"
    parts = []
    for r in table.itertuples():
        tiny = (f", the calibration's tiny step of {r.tiny_message_kib:.0f} KiB {r.tiny_us:.0f} µs"
                if pd.notna(r.tiny_us) else "")
        parts.append(f"{r.strategy} at micro-batch {r.micro_batch} ({r.message_kib:.0f} KiB messages, "
                     f"{r.collectives:.0f} collectives): {r.implied_us:.0f} µs, its {r.repeats} repeats "
                     f"{r.implied_min_us:.0f} to {r.implied_max_us:.0f} µs, against the profile's "
                     f"{r.profile_us:.0f} µs{tiny}")
    spans = table.implied_max_us - table.implied_min_us
    gaps = (table.implied_us - table.profile_us).abs()
    wider = int((spans > gaps).sum())
    python = table.python.dropna()
    speed = (f"; those runs' speed probes read Python at {python.min():.2f} to {python.max():.2f} times the "
             f"calibration's" if len(python) else "")
    return ("per collective, each held-out tensor-parallel configuration's measured step implies (median over its "
            "repeats, at its own speed) " + "; ".join(parts) + f"{speed}. In {wider} of {len(table)} configurations "
            "the repeats span more than the median's distance from the profile's constant")


# the experiment of scripts/tp_drift.py (archived as reference data): each round's probes and tensor-parallel steps
DRIFT_STEPS = {"tp_step_s": "with tensor parallelism", "tp_sp_step_s": "with tensor and sequence parallelism"}
DRIFT_PROBES = {"ar_128k_s": "an all-reduce of 128 KiB", "ar_8b_s": "one of 8 bytes",
                "dtensor_128k_s": "DTensor's redistribution of 128 KiB", "gemm_s": "the speed probe's matrix product",
                "elementwise_s": "its element-wise kernel", "python_s": "its module calls"}
FOLLOWS = 0.5  # a probe follows the steps where its rank correlation with each of them is at least this
DRIFT_WINDOW_S = 60.0  # the span of the rolling medians that show how far the steps drift


def drift(table: pd.DataFrame) -> pd.DataFrame:
    """Per probe of the experiment (:data:`DRIFT_PROBES`): its relative standard deviation over the rounds and its
    Spearman rank correlation with each tensor-parallel step (:data:`DRIFT_STEPS`), and whether it follows both
    (:data:`FOLLOWS`); the steps themselves as the first rows (their correlation with each other)."""
    out = []
    for column, label in {**DRIFT_STEPS, **DRIFT_PROBES}.items():
        values = table[column]
        corr = {step: values.rank().corr(table[step].rank()) for step in DRIFT_STEPS}  # Spearman's
        out.append({"measure": column, "what": label, "rsd": values.std() / values.mean(),
                    **{f"with_{step}": corr[step] for step in DRIFT_STEPS},
                    "follows": column in DRIFT_PROBES and all(c >= FOLLOWS for c in corr.values())})
    return pd.DataFrame(out)


def drift_range(table: pd.DataFrame, column: str) -> tuple[float, float]:
    """The least and largest of ``column``'s medians over windows of :data:`DRIFT_WINDOW_S` seconds of rounds (each
    round's window centred on it), over its median over all rounds."""
    series = pd.Series(table[column].to_numpy(), index=pd.to_datetime(table["time_s"], unit="s"))
    rolling = series.rolling(pd.Timedelta(seconds=DRIFT_WINDOW_S), center=True).median()
    return rolling.min() / series.median(), rolling.max() / series.median()


def drift_sentence(table: pd.DataFrame | None) -> str:
    """:func:`drift` in words."""
    if table is None or not len(table):
        return "the experiment has not been run on this machine (scripts/tp_drift.py)"
    found = drift(table).set_index("measure")
    minutes = (table.time_s.max() - table.time_s.min()) / 60
    steps = []
    for column, label in DRIFT_STEPS.items():
        low, high = drift_range(table, column)
        steps.append(f"{label} {table[column].median() * 1e3:.0f} ms, relative standard deviation "
                     f"{found.rsd[column]:.0%}, its one-minute medians {low:.0%} to {high:.0%} of that")
    probes = "; ".join(f"{row.what} {row.with_tp_step_s:+.2f} and {row.with_tp_sp_step_s:+.2f}"
                       for row in found.itertuples() if row.Index in DRIFT_PROBES)
    following = [row.what for row in found.itertuples() if row.follows]
    verdict = (f"{', '.join(following)} {'follows' if len(following) == 1 else 'follow'} both (a rank correlation of "
               f"at least {FOLLOWS} with each)" if following else
               f"none reaches {FOLLOWS} with both, so none would price a run at the cost per collective it had")
    return (f"over {len(table)} rounds in {minutes:.0f} minutes, the two ranks' step of `small` at micro-batch 2 "
            f"took: {'; '.join(steps)} (the two steps' rank correlation "
            f"{found.with_tp_sp_step_s['tp_step_s']:+.2f}). The probes' rank correlations with the two steps: "
            f"{probes}: {verdict}")
