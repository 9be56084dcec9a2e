"""Reading the tables a sweep writes (:mod:`distperf.runner.sweep`): one row per configuration, the run's JSON
result flattened into dotted columns, lists kept as JSON text.

- :func:`ok`, :func:`has`: the rows that ran, and whether a column was measured at all;
- :func:`json_cell`, :func:`truthy`: values that a CSV keeps as text (JSON lists, booleans);
- :func:`config_of_row`, :func:`global_batch`: the :class:`~distperf.config.Config` a row trained, its global batch;
- :func:`measured_memory`, :func:`most_loaded_memory`: memory by category (:data:`distperf.config.MEMORY_CATEGORIES`)
  per rank, and of the most loaded rank;
- :func:`with_predictions`: the cost model's prediction beside each row, each measured run priced on
  :func:`run_hardware`: the profile at the speed the machine had during the run.
"""
from __future__ import annotations

import contextlib
import json
import math
from dataclasses import fields

from ..config import MEMORY_CATEGORIES, MODEL_STATES, Config, Layout, ModelSpec, Training

PEAK, AT_REST = "peak in a step", "between steps"
PROFILED_ITERATION = "prediction.profiled.time_s.iteration"


def ok(frame):
    """The rows whose run succeeded (status ``ok``), as a new frame: one per configuration, its repeats folded into
    one (:func:`distperf.analysis.repeats.fold`: the median over the repeats; memory from repeat 0)."""
    from .repeats import fold

    return fold(frame[frame["status"] == "ok"].copy())


def has(frame, column: str) -> bool:
    """Whether ``column`` exists and holds at least one value (a build that did not measure it has none)."""
    return column in frame and bool(frame[column].notna().any())


def json_cell(value):
    """A JSON value kept in a CSV cell (a list, a dict), or None for an empty cell."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return json.loads(value) if isinstance(value, str) else value


def truthy(column):
    """A boolean column whose values may have come back from the CSV as text ("True", "true")."""
    return column.astype(str).str.lower() == "true"


def config_of_row(row) -> Config:
    """The configuration a ``run --json`` row trained, rebuilt from its flattened ``config.<section>.<field>``
    columns, each value cast back to its field's type whatever dtype the table gave it (a failed row turns
    integer columns into floats; booleans come back as text)."""
    def cast(value, like):
        if isinstance(like, bool):
            return value if isinstance(value, bool) else str(value) == "True"
        if isinstance(like, int):
            return int(value)
        if isinstance(like, float):
            return float(value)
        if isinstance(like, tuple):
            return tuple(json.loads(value)) if isinstance(value, str) else tuple(value)
        return str(value)

    def section(name, cls):
        default = cls()
        return cls(**{f.name: cast(row[f"config.{name}.{f.name}"], getattr(default, f.name))
                      for f in fields(cls) if f"config.{name}.{f.name}" in row.index})

    return Config(model=section("model", ModelSpec), layout=section("layout", Layout),
                  training=section("training", Training))


def measured_memory(row) -> tuple[list[dict], str]:
    """Bytes by category of every rank, and which kind of number they are: each category's peak in the
    measured step (:data:`PEAK`, with ``total``) where the run measured memory, else the model states each
    rank kept between steps (:data:`AT_REST`; activations NaN)."""
    if isinstance(row.get("memory_bytes.per_rank.total"), str):
        per = {c: json.loads(row[f"memory_bytes.per_rank.{c}"]) for c in MEMORY_CATEGORIES + ("total",)}
        return [{c: per[c][r] for c in per} for r in range(len(per["total"]))], PEAK
    return [{**{c: x[c] for c in MODEL_STATES}, "activations": math.nan, "total": sum(x[c] for c in MODEL_STATES)}
            for x in json.loads(row["model_state_bytes_at_rest"])], AT_REST


def most_loaded_memory(row, peak: bool) -> dict:
    """Bytes by category on the most loaded rank: the measured step's peaks (``peak``; the run's own choice of
    rank, :mod:`distperf.measure.steps`), else the model states of the rank that keeps the most between steps."""
    if peak:
        return {c: row[f"memory_bytes.{c}"] for c in MEMORY_CATEGORIES}
    ranks = json.loads(row["model_state_bytes_at_rest"])
    most = max(ranks, key=lambda d: sum(d[c] for c in MODEL_STATES))
    return {c: most[c] for c in MODEL_STATES}


def global_batch(frame):
    """Each row's global batch in sequences, B = microbatch · microbatches · dp."""
    return frame["config.layout.micro_batch"] * frame["config.layout.microbatches"] * frame["config.layout.dp"]


def bucket_bytes(row) -> float:
    """The DDP bucket a run used, in bytes: its ``options.bucket_mb`` (MiB; every run records it), torch's default
    (25 MiB) where the row has none."""
    from ..cost.predict import DDP_BUCKET_BYTES

    mb = row.get("options.bucket_mb")
    return DDP_BUCKET_BYTES if mb is None or mb != mb else float(mb) * 2**20


RUN_ALLREDUCE = False  # a what-if until a build judges it: distperf.analysis.time_model.allreduce_probe_rule


# how far the analytical mode follows a run's speed probe: each part's ratio r to the calibration's probe is taken as
# r ** SPEED_ELASTICITY (distperf.measure.speed.at_speed). 1, the probe's ratio itself, since 5 December 2026; the
# rule of 7 December 2026 (distperf.analysis.time_model.elasticity_rule) judges ½ on the next ten-repeat build
SPEED_ELASTICITY = 1.0


def run_hardware(hw, row, elasticity: float | None = None):
    """The profile on which the analytical mode prices a measured run: ``hw`` with its kernel times scaled to the
    speed the machine had during the run, as the run's speed probes measured it
    (:func:`distperf.measure.speed.at_speed`), or ``hw`` itself where the row or ``hw`` holds no probe (a run before
    the probe existed, a GPU run, a profile without measured kernels). A rule declared before the data adopted it on
    5 December 2026 (the chapter "Where the time goes", section "The machine's speed"); a prediction made before any
    run keeps the calibration's speed. With :data:`RUN_ALLREDUCE` (:func:`run_allreduce`), also the all-reduce's fit
    through the run's own all-reduce probe (:func:`distperf.measure.speed.at_allreduce`). ``elasticity``: how far
    it follows the probe (:data:`SPEED_ELASTICITY` by default)."""
    from ..measure.speed import at_allreduce, at_speed, of_row

    probe = of_row(row)
    out = at_speed(hw, probe, SPEED_ELASTICITY if elasticity is None else elasticity)
    return at_allreduce(out, probe) if RUN_ALLREDUCE else out


@contextlib.contextmanager
def run_allreduce(on: bool):
    """Price runs with (``on``) or without their own all-reduce probe inside the block (:data:`RUN_ALLREDUCE`)."""
    global RUN_ALLREDUCE
    before, RUN_ALLREDUCE = RUN_ALLREDUCE, on
    try:
        yield
    finally:
        RUN_ALLREDUCE = before


def with_predictions(frame, hw, bucket_mb=None, check: bool = True, speed: bool | float = True,
                     contention: bool = False):
    """``frame`` with the cost model beside each row: ``prediction`` (the dictionary of :func:`distperf.cost.predict`
    on ``hw`` — with ``speed`` (the analytical mode's rule), its kernel times scaled to the speed the machine
    had during the row's run (:func:`run_hardware`; a number instead of True: that elasticity), else at the
    calibration's speed; with ``contention`` the contention ratios the row's ranks measured in place of the
    calibration's (:mod:`distperf.measure.speed`) —,
    with the DDP bucket of ``bucket_mb`` MiB per row, a column or one number, else the run's own
    (:func:`bucket_bytes`)), ``predicted_s``, ``predicted_exposed_s``, ``measured_s`` (the median step) and
    ``profiled_s`` (the run's own prediction from profiled layer times, NaN where it has none)."""
    import numpy as np

    from ..cost import predict
    from ..measure.speed import at_contention, of_row

    frame = frame.copy()
    if bucket_mb is None:
        buckets = [bucket_bytes(r) for _, r in frame.iterrows()]
    else:
        buckets = [float(mb) * 2**20 for mb in (bucket_mb if hasattr(bucket_mb, "__len__") else [bucket_mb] * len(frame))]

    def priced(row):
        out = run_hardware(hw, row, None if speed is True else float(speed)) if speed else hw
        return at_contention(out, of_row(row)) if contention else out

    frame["prediction"] = [predict(config_of_row(r), priced(r), bucket_bytes=b, check=check)
                           for (_, r), b in zip(frame.iterrows(), buckets)]
    frame["predicted_s"] = [p["time_s"]["iteration"] for p in frame.prediction]
    frame["predicted_exposed_s"] = [p["time_s"]["communication_exposed"] for p in frame.prediction]
    frame["measured_s"] = frame["iteration_time_s.median"]
    frame["profiled_s"] = frame[PROFILED_ITERATION] if PROFILED_ITERATION in frame else np.nan
    return frame
