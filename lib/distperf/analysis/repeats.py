"""Run-to-run spread: the independent repeats of each configuration of a sweep table (:mod:`distperf.runner.sweep`,
``repeat`` 0 … R − 1, each repeat in fresh processes).

:func:`fold` turns a table of repeats into one row per configuration, as the chapters read it (the median over the
repeats as the configuration's iteration time; memory and communication, measured in repeat 0 only, from there; the
time-breakdown step, which every repeat takes, folded over the repeats).
Per configuration (its ``config_hash`` on one machine, from one source), :func:`by_configuration` gives:

- ``repeats``: the repeats that ran (status ``ok``);
- ``median_s``: the median over the repeats of each run's median iteration time (``iteration_time_s.median``);
- ``ci_low_s``, ``ci_high_s``: a 95 % confidence interval of the configuration's iteration time, and
  ``ci_half_rel``: its half-width relative to ``median_s`` (the number a 5 % prediction goal must be read against);
- ``p10_s``, ``p90_s``: the spread of the steps inside a run (each run's p10 and p90 of its timed steps, the median
  over the repeats), beside the spread between runs.

**Which interval, and why.** The unit of replication is a run: steps inside one run share its process, its
placement on the cores and its neighbours on the machine, so they scatter less than runs do, and p10–p90 inside a
run says nothing about the next run. Each run gives one number, its median step, and the interval is a Student
*t*-interval on those R numbers: mean ± t₀.₉₇₅,R−1 · s / √R (s the sample standard deviation). With the 3 to 5
repeats a study on two cores can afford, a bootstrap does not work: resampling 3 values gives at most 10 distinct
means, and its percentile interval can never leave [min, max], which for 3 runs covers the median only 75 % of the
time (1 − 2 · 0.5³), not 95 %. A distribution-free interval for the median needs at least 6 runs for 95 %. The
t-interval is exact when the run medians are normal (a median of several steps is close to it, and the
t-interval is robust to moderate departures) and it pays honestly for few repeats: t₀.₉₇₅,₂ = 4.30 with 3 runs,
against 1.96 with many. Its centre is the mean of the run medians; ``median_s`` (the median of them) is the
point estimate the chapters read, and it lies inside the interval. One repeat gives no interval (NaN).
"""
from __future__ import annotations

import math
import statistics
from functools import lru_cache

from ..measure.speed import COLUMN as PROBE

TIME, P10, P90 = "iteration_time_s.median", "iteration_time_s.p10", "iteration_time_s.p90"
ERRORS = ("error.iteration_time_s.analytical", "error.iteration_time_s.profiled")
PROFILED = "prediction.profiled."  # the profiled mode: its part times and the prediction composed from them
AT_ONCE = "prediction.profiled.layer_times.ranks_at_once"  # set where the run's own ranks timed the parts
BREAKDOWN = "time_breakdown_s."  # the step whose time is broken down by class (distperf.measure.steps)
PER_RANK = BREAKDOWN + "per_rank."
CLOCK = "wait_clock_s.per_rank"  # a pipeline's waits on its timed steps, per rank (distperf.measure.wait_clock)
LEVEL = 0.95


def t_coverage(t: float, df: int) -> float:
    """P(|T| ≤ t) for Student's t with ``df`` (a positive integer) degrees of freedom, in closed form
    (Abramowitz & Stegun 26.7.3–4, with θ = atan(t/√df)): odd df, (2/π)(θ + sin θ (cos θ + (2/3) cos³θ + …
    + (2·4···(df−3))/(1·3···(df−2)) cos^(df−2) θ)); even df, sin θ (1 + (1/2) cos²θ + (1·3)/(2·4) cos⁴θ + …
    + (1·3···(df−3))/(2·4···(df−2)) cos^(df−2) θ)."""
    if df < 1 or int(df) != df:
        raise ValueError(f"degrees of freedom must be a positive integer, got {df!r}")
    theta = math.atan(t / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    if df % 2:
        term, total = c, c if df > 1 else 0.0
        for k in range(3, df - 1, 2):  # the factors 2/3, 4/5, …
            term *= (k - 1) / k * c * c
            total += term
        return 2 / math.pi * (theta + s * total)
    term = total = 1.0
    for k in range(2, df, 2):  # the factors 1/2, 3/4, …
        term *= (k - 1) / k * c * c
        total += term
    return s * total


@lru_cache(maxsize=1024)
def t_quantile(df: int, level: float = LEVEL) -> float:
    """The two-sided critical value t with P(|T| ≤ t) = ``level`` for ``df`` degrees of freedom (bisection on
    :func:`t_coverage`; 4.303 for df = 2 at 95 %)."""
    lo, hi = 0.0, 1.0
    while t_coverage(hi, df) < level:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_coverage(mid, df) < level else (lo, mid)
    return (lo + hi) / 2


def interval(values, level: float = LEVEL) -> tuple[float, float, float]:
    """(mean, low, high): the t-interval of the mean of ``values`` (see the module docstring); low and high NaN for
    fewer than two values."""
    xs = [float(v) for v in values]
    if not xs:
        return math.nan, math.nan, math.nan
    mean = statistics.fmean(xs)
    if len(xs) < 2:
        return mean, math.nan, math.nan
    half = t_quantile(len(xs) - 1, level) * statistics.stdev(xs) / math.sqrt(len(xs))
    return mean, mean - half, mean + half


def median_interval(values, level: float = LEVEL) -> tuple[float, float]:
    """(low, high): the distribution-free interval of the median of the runs ``values``, the k-th smallest and the
    k-th largest of n with the largest k whose coverage 1 − 2·P(Binomial(n, ½) ≤ k − 1) is at least ``level``
    (any continuous distribution; 97.9 % for n = 10 and k = 2). NaN for too few values: 6 at 95 % (k = 1)."""
    xs = sorted(float(v) for v in values)
    n, k, tail = len(xs), 0, 0.0
    while n and 1 - 2 * (tail + math.comb(n, k) / 2**n) >= level:
        tail += math.comb(n, k) / 2**n
        k += 1
    return (xs[k - 1], xs[n - k]) if k else (math.nan, math.nan)


def ratio_interval(numerator, denominator, level: float = LEVEL) -> tuple[float, float, float]:
    """(ratio, low, high): the ratio of the geometric means of two independent sets of repeats (e.g. one schedule's
    run medians over another's) and its Welch t-interval, taken on the logarithms: the difference of the mean logs
    with standard error √(s₁²/n₁ + s₂²/n₂), on the Welch–Satterthwaite degrees of freedom (rounded down, at least 1),
    exponentiated. Low and high are NaN unless both sets have two values or more."""
    a = [math.log(float(v)) for v in numerator if v == v and v > 0]
    b = [math.log(float(v)) for v in denominator if v == v and v > 0]
    if not a or not b:
        return math.nan, math.nan, math.nan
    diff = statistics.fmean(a) - statistics.fmean(b)
    if len(a) < 2 or len(b) < 2:
        return math.exp(diff), math.nan, math.nan
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return math.exp(diff), math.exp(diff), math.exp(diff)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = t_quantile(max(1, int(df)), level) * se
    return math.exp(diff), math.exp(diff - half), math.exp(diff + half)


def spread(groups) -> float:
    """How far apart the groups' means lie: the largest mean over the smallest, − 1 (groups of positive values,
    such as the run medians of each bucket size); NaN with fewer than two non-empty groups."""
    means = [statistics.fmean(g) for g in groups if len(g)]
    return max(means) / min(means) - 1 if len(means) > 1 else math.nan


def permutation_p(groups, statistic=spread, draws: int = 4000, seed: int = 0) -> float:
    """The permutation test of "the groups differ" (e.g. the run medians of each bucket size): the share of random
    relabellings of the pooled values, group sizes kept, whose ``statistic`` is at least the observed one, as
    (k + 1)/(draws + 1). Picking the slowest and the fastest group after the fact is paid for here: each relabelling
    picks them again. NaN when no group has two values (a relabelling of single runs tells nothing)."""
    import random

    groups = [[float(v) for v in g] for g in groups if len(g)]
    if len(groups) < 2 or max(len(g) for g in groups) < 2:
        return math.nan
    observed = statistic(groups)
    pooled = [v for g in groups for v in g]
    rng = random.Random(seed)
    hits = 0
    for _ in range(draws):
        rng.shuffle(pooled)
        it = iter(pooled)
        hits += statistic([[next(it) for _ in g] for g in groups]) >= observed - 1e-12
    return (hits + 1) / (draws + 1)


def _keys(frame) -> list[str]:
    return [k for k in ("experiment", "machine", "source", "config_hash") if k in frame]


def by_configuration(frame, level: float = LEVEL):
    """One row per configuration (``experiment``, ``machine``, ``source`` where the table has them, and
    ``config_hash``) with its ``ok`` repeats: ``repeats``, ``median_s``, ``mean_s``, ``ci_low_s``, ``ci_high_s``,
    ``ci_half_rel``, ``p10_s``, ``p90_s`` (module docstring), and the configuration's own columns (``arg.*``,
    ``env.*``, ``config.*``) from its first repeat. A table without a ``repeat`` column is one repeat each."""
    import pandas as pd

    runs = frame[frame["status"] == "ok"] if "status" in frame else frame
    keys = _keys(runs)
    own_columns = [c for c in runs.columns if c.startswith(("arg.", "env.", "config."))]
    out = []
    for key, part in runs.groupby(keys, sort=False, dropna=False):
        if "repeat" in part:
            part = part.assign(repeat=part["repeat"].fillna(0)).sort_values("repeat")
        times = part[TIME].astype(float).dropna()
        mean, low, high = interval(times, level)
        median = float(times.median()) if len(times) else math.nan
        own = part[own_columns].iloc[0].to_dict()
        out.append({**dict(zip(keys, key if isinstance(key, tuple) else (key,))), "repeats": len(times),
                    "median_s": median, "mean_s": mean, "ci_low_s": low, "ci_high_s": high,
                    "ci_half_rel": (high - low) / 2 / median if len(times) > 1 and median else math.nan,
                    "p10_s": float(part[P10].astype(float).median()) if P10 in part else math.nan,
                    "p90_s": float(part[P90].astype(float).median()) if P90 in part else math.nan, **own})
    return pd.DataFrame(out)


def fold(frame, level: float = LEVEL):
    """One row per configuration of a sweep table's ``ok`` rows (a table without repeats comes back as it is): the row
    of its first repeat (repeat 0 holds memory and communication), with ``iteration_time_s.median`` the median over the
    repeats of their medians, ``iteration_time_s.p10`` and ``.p90`` the medians of theirs, ``tokens_per_s`` and the
    signed errors of the run's own predictions (``error.iteration_time_s.*``) for that median, the time-breakdown step's
    classes over the repeats that took it (:func:`_fold_breakdown`), the speed probe's columns (``speed_probe.*``) their
    medians over the repeats (each rank's readings, ``*.ranks.*``, repeat 0's), the profiled mode's numbers
    (``prediction.profiled.*``: the part times and the iteration composed from them) their medians over the repeats
    whose own ranks timed the parts (where repeat 0's did; older tables timed them in repeat 0 only), and the columns of
    :func:`by_configuration`'s interval beside them: ``repeats``, ``iteration_time_s.ci_low``,
    ``iteration_time_s.ci_high``, ``iteration_time_s.ci_half_rel``."""
    runs = frame[frame["status"] == "ok"] if "status" in frame else frame
    if "repeat" not in runs or "config_hash" not in runs or TIME not in runs:
        return runs.copy()
    keys = _keys(runs)
    runs = runs.assign(repeat=runs["repeat"].fillna(0))
    per = by_configuration(runs, level).set_index(keys)
    first = runs.sort_values("repeat", kind="stable").drop_duplicates(keys).sort_index().copy()
    index = first.set_index(keys).index
    median = per["median_s"].reindex(index).to_numpy()
    own = first[TIME].astype(float).to_numpy()
    if "tokens_per_s" in first:  # tokens per step are the same in every repeat: tokens/s scales with 1/time
        first["tokens_per_s"] = first["tokens_per_s"].astype(float) * own / median
    for column in ERRORS:  # (predicted − measured)/measured, against the new measurement
        if column in first:
            first[column] = (1 + first[column].astype(float)) * own / median - 1
    first[TIME] = median
    probes = [c for c in runs.columns if c.startswith(PROBE) and ".ranks." not in c]  # each rank's: repeat 0's
    if probes:  # the machine's speed during the repeats, beside the median of their times
        per_probe = runs[keys + probes].astype({c: float for c in probes}).groupby(keys, dropna=False)[probes].median()
        first[probes] = per_probe.reindex(index).to_numpy()
    if AT_ONCE in runs:
        _fold_profiled(runs, first, keys, median)
    if BREAKDOWN + "window" in runs:
        _fold_breakdown(runs, first, keys)
    if CLOCK in runs:
        _fold_clock(runs, first, keys)
    for column, name in ((P10, "p10_s"), (P90, "p90_s")):
        if column in first:
            first[column] = per[name].reindex(index).to_numpy()
    first["repeats"] = per["repeats"].reindex(index).to_numpy()
    for column, name in (("ci_low", "ci_low_s"), ("ci_high", "ci_high_s"), ("ci_half_rel", "ci_half_rel")):
        first[f"iteration_time_s.{column}"] = per[name].reindex(index).to_numpy()
    return first


def _fold_profiled(runs, first, keys: list, median) -> None:
    """In ``first`` (one row per configuration, in place): the profiled mode's numeric columns as their medians over
    the repeats whose ranks timed their own parts, where the first repeat's did, and the profiled error for the
    median iteration ``median`` (seconds, aligned with ``first``)."""
    import pandas as pd

    columns = [c for c in runs.columns if c.startswith(PROFILED) and c != AT_ONCE
               and pd.api.types.is_numeric_dtype(runs[c])]
    own = runs[runs[AT_ONCE].notna()]
    mask = first[AT_ONCE].notna().to_numpy()
    if not columns or not mask.any():
        return
    per = own[keys + columns].groupby(keys, dropna=False)[columns].median()
    first.loc[mask, columns] = per.reindex(first.loc[mask].set_index(keys).index).to_numpy()
    iteration, error = PROFILED + "time_s.iteration", ERRORS[1]
    if iteration in first and error in first:
        first.loc[mask, error] = first.loc[mask, iteration].astype(float) / median[mask] - 1


def _fold_clock(runs, first, keys: list) -> None:
    """In ``first`` (one row per configuration, in place): each rank's wait clock (:data:`CLOCK`, a JSON list of
    seconds per rank) as its median over the repeats that kept it, rank by rank."""
    import json

    from .rows import json_cell

    folded = {}
    for key, part in runs.groupby(keys, dropna=False):
        cells = [cell for cell in map(json_cell, part[CLOCK]) if isinstance(cell, list) and cell and None not in cell]
        if cells and all(len(cell) == len(cells[0]) for cell in cells):
            folded[key if isinstance(key, tuple) else (key,)] = json.dumps(
                [statistics.median(values) for values in zip(*cells)])
    first[CLOCK] = [folded.get(key if isinstance(key, tuple) else (key,)) for key in first.set_index(keys).index]


def _fold_breakdown(runs, first, keys: list) -> None:
    """In ``first`` (one row per configuration, in place): the time-breakdown step over the repeats that took it (every
    repeat in tables measured from 3 December 2026, repeat 0 alone before), and ``time_breakdown_s.repeats``, how many
    did. Each rank's class times (``time_breakdown_s.per_rank.<class>``, JSON lists) become their medians over those
    repeats, rank by rank; the step's own (``time_breakdown_s.<class>``, ``window``, ``rank``) are then those of the
    rank whose median window is longest, the rank :func:`distperf.measure.steps.combine_breakdowns` picks in one
    run. A table without per-rank lists takes each class's median over the repeats."""
    import json

    import pandas as pd

    from .rows import json_cell

    took = runs[runs[BREAKDOWN + "window"].notna()]
    index = first.set_index(keys).index
    first[BREAKDOWN + "repeats"] = took.groupby(keys, dropna=False).size().reindex(index).fillna(0).astype(int) \
        .to_numpy()
    lists = [c for c in runs.columns if c.startswith(PER_RANK)]
    scalars = [c for c in runs.columns if c.startswith(BREAKDOWN) and not c.startswith(PER_RANK)
               and c != BREAKDOWN + "rank" and pd.api.types.is_numeric_dtype(runs[c])]
    if not len(took):
        return
    first[scalars] = took[keys + scalars].groupby(keys, dropna=False)[scalars].median().reindex(index).to_numpy()
    if PER_RANK + "window" not in lists:
        return
    found, where = [], []
    for key, part in took.groupby(keys, dropna=False):
        folded = {}
        for column in lists:
            cells = [json_cell(cell) for cell in part[column]]
            cells = [cell for cell in cells if isinstance(cell, list) and cell]
            if cells and all(len(cell) == len(cells[0]) for cell in cells):
                folded[column] = [statistics.median(values) for values in zip(*cells)]
        windows = folded.get(PER_RANK + "window")
        if not windows:
            continue
        slowest = max(range(len(windows)), key=windows.__getitem__)
        row = {column: json.dumps(values) for column, values in folded.items()}
        row.update({BREAKDOWN + column[len(PER_RANK):]: values[slowest] for column, values in folded.items()})
        found.append({**row, BREAKDOWN + "rank": slowest})
        where.append(key)
    if not found:
        return
    per = pd.DataFrame(found, index=pd.MultiIndex.from_tuples(where, names=keys)) if len(keys) > 1 else \
        pd.DataFrame(found, index=pd.Index([k[0] if isinstance(k, tuple) else k for k in where], name=keys[0]))
    per = per.reindex(index)
    for column in per.columns:
        if column in first:
            values = per[column].to_numpy()
            kept = first[column].astype(object) if column in lists else first[column]
            first[column] = kept.where(pd.isna(values), values)


def spread_summary(per_configuration, goal: float = 0.05) -> dict:
    """How tight the intervals of :func:`by_configuration` are: ``configurations`` with an interval (two repeats or
    more), the median and largest ``ci_half_rel``, and ``within_goal``, the share whose half-width is at most
    ``goal`` of the median (a prediction can be told right within ``goal`` only where that holds)."""
    rel = per_configuration["ci_half_rel"].dropna() if len(per_configuration) else []
    if not len(rel):
        return {"configurations": 0, "median_half_rel": math.nan, "max_half_rel": math.nan, "within_goal": math.nan}
    return {"configurations": int(len(rel)), "median_half_rel": float(rel.median()), "max_half_rel": float(rel.max()),
            "within_goal": float((rel <= goal).mean())}
