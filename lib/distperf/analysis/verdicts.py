"""Every verdict of the book, declared before the data: for each question, the statistics that decide it, the
threshold each must meet and why (``chapters/intro.md``, section "How a verdict is reached").

A :class:`Rule` is a list of :class:`Criterion`: a statistic (a number the chapter computes from its runs), a
comparison with a threshold, and the reason for that threshold. The verdict is the same function of the criteria
in every chapter:

- **reproduced** when every measured criterion holds;
- **depends** when some hold and some do not;
- **not reproduced** when none holds;
- **not measured** when no statistic could be computed (a missing or NaN value leaves its criterion out).

Thresholds shared by several chapters are module constants (:data:`TIME_MEDIAN`, :data:`TIME_MAX`, …), so that
the book holds every time prediction to the same standard. Each criterion also lists the alternative thresholds
the chapter tries (:meth:`Rule.sensitivity`), so a reader sees how far the verdict rests on the choice.

Nothing here reads data: the chapters' modules compute the statistics (their ``statistics`` functions), and
``tests/test_verdicts.py`` feeds every rule synthetic statistics on both sides of each threshold and checks that
the verdict and every sentence built here change with them.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import pandas as pd

VERDICTS = ("reproduced", "depends", "not reproduced", "not measured")

# A time prediction is judged like the analytical time model of "Where the time goes": a median |signed error|
# of at most 10 % and none above 25 %. The run-to-run spread of one configuration here is a few per cent
# (the noise floor of "Calibration"), so a miss beyond these is the model's, not the measurement's.
TIME_MEDIAN = 0.10
TIME_MAX = 0.25
ERROR_RANGE = (0.05, 0.10, 0.15, 0.25, 0.50)
# "Every case": a share of cases, tried from half of them up.
SHARE_RANGE = (0.5, 0.75, 0.9, 1.0)
# Rank agreement (Spearman's ρ): 0.7 is the usual "strong" correlation.
RHO = 0.7
RHO_RANGE = (0.5, 0.6, 0.7, 0.8, 0.9)
# A speed-up: more than 1 means faster; tried from a tie up to a clear margin.
SPEEDUP_RANGE = (0.95, 1.0, 1.05, 1.10)
# Convergence: the final held-out loss of two methods is "equivalent" when the 95 % interval of their paired gap lies
# inside ± this margin (nats per byte), declared before the long study ran.
EQUIVALENCE_MARGIN = 0.02
# A test of "no effect" on the repeats (a permutation test): the usual 5 % level, tried from 1 % to 10 %.
P_VALUE = 0.05
P_RANGE = (0.01, 0.05, 0.10)


@dataclass(frozen=True)
class Criterion:
    """One statistic against one threshold: ``op`` is "<=" (at most) or ">=" (at least)."""

    key: str  # the statistic's name in the dictionary a chapter's ``statistics`` returns
    statistic: str  # what it is, in words
    op: str
    threshold: float
    fmt: str  # how values and thresholds print: a format spec such as ".0%", ".2f", ".2g"
    why: str  # why this threshold
    holds: str  # what it means when the criterion holds (a clause)
    fails: str  # what it means when it does not
    alternatives: tuple = ()  # other thresholds tried by Rule.sensitivity

    def met(self, value, threshold: float | None = None) -> bool | None:
        """Whether ``value`` meets the threshold (``threshold`` replaces the declared one); None when the value
        is missing or NaN."""
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return None
        limit = self.threshold if threshold is None else threshold
        return bool(value <= limit) if self.op == "<=" else bool(value >= limit)

    def show(self, value: float) -> str:
        """``value`` in the criterion's format, with as many more digits as it takes not to print as the threshold
        when it differs from it (0.2512 against at most 0.25 prints 25.1%, not 25%, which would read as met)."""
        text, limit = format(value, self.fmt), format(self.threshold, self.fmt)
        digits = re.fullmatch(r"\.(\d+)([%fg])", self.fmt)
        if text != limit or value == self.threshold or digits is None:
            return text
        for more in range(int(digits[1]) + 1, int(digits[1]) + 7):
            fmt = f".{more}{digits[2]}"
            text = format(value, fmt)
            if text != format(self.threshold, fmt):
                break
        return text

    def rule(self, threshold: float | None = None) -> str:
        """'≤ 10 %'-style: the comparison and the threshold."""
        limit = self.threshold if threshold is None else threshold
        return f"{'≤' if self.op == '<=' else '≥'} {format(limit, self.fmt)}"

    def sentence(self, value) -> str:
        """The statistic, its value, the rule and what the result means."""
        ok = self.met(value)
        if ok is None:
            return f"{self.statistic} was not measured"
        return (f"{self.statistic} is {self.show(value)} (rule: {self.rule()}, {'met' if ok else 'not met'}): "
                f"{self.holds if ok else self.fails}")


@dataclass(frozen=True)
class Rule:
    """A question's verdict: its criteria, combined as the module docstring says."""

    chapter: str
    question: str
    criteria: tuple

    def outcome(self, stats: dict, thresholds: dict | None = None) -> dict:
        """{key: True/False/None} for each criterion (``thresholds`` overrides some, by key)."""
        thresholds = thresholds or {}
        return {c.key: c.met(stats.get(c.key), thresholds.get(c.key)) for c in self.criteria}

    def verdict(self, stats: dict, thresholds: dict | None = None) -> str:
        met = [ok for ok in self.outcome(stats, thresholds).values() if ok is not None]
        if not met:
            return "not measured"
        return "reproduced" if all(met) else "depends" if any(met) else "not reproduced"

    def statement(self) -> str:
        """The rule in words, as the chapter prints it before the result."""
        parts = [f"{c.statistic} {c.rule()} ({c.why})" for c in self.criteria]
        if len(parts) == 1:
            return f'"reproduced" when {parts[0]}, else "not reproduced"'
        return (f'"reproduced" when {"; ".join(parts[:-1])}; and {parts[-1]}. "Depends" when some of these hold '
                'and not all; "not reproduced" when none does')

    def explanation(self, stats: dict) -> str:
        """Each criterion's value and what it means, in one sentence per criterion."""
        sentences = (c.sentence(stats.get(c.key)) for c in self.criteria)
        return " ".join(text[:1].upper() + text[1:] + "." for text in sentences)

    def sensitivity(self, stats: dict) -> pd.DataFrame:
        """One row per criterion: the statistic, its value, the rule, whether it is met, and the verdict when that
        criterion's threshold alone takes each of its alternatives."""
        rows = []
        for c in self.criteria:
            value = stats.get(c.key)
            ok = c.met(value)
            tried = "; ".join(f"{c.rule(t)}: {self.verdict(stats, {c.key: t})}" for t in c.alternatives)
            rows.append({"statistic": c.statistic, "value": "–" if ok is None else c.show(value), "rule": c.rule(),
                         "met": "–" if ok is None else "yes" if ok else "no",
                         "verdict as this threshold varies": tried or "–"})
        return pd.DataFrame(rows)

    def robustness(self, stats: dict) -> str:
        """Whether the verdict survives every alternative threshold, and if not, which ones change it."""
        verdict = self.verdict(stats)
        changes = [f'{c.statistic} {c.rule(t)} gives "{other}"' for c in self.criteria for t in c.alternatives
                   if (other := self.verdict(stats, {c.key: t})) != verdict]
        if not changes:
            return f'the verdict stays "{verdict}" for every threshold tried'
        return f'the verdict is "{verdict}" at the declared thresholds, but ' + "; ".join(changes)


def _time(key: str, what: str, largest: bool = False) -> Criterion:
    """A time prediction's median (or largest) |signed error| against :data:`TIME_MEDIAN` (:data:`TIME_MAX`)."""
    if largest:
        return Criterion(key, f"the largest |signed error| of {what}", "<=", TIME_MAX, ".0%",
                         "no prediction further off than a quarter", "no case is far off",
                         "at least one case is far off", ERROR_RANGE)
    return Criterion(key, f"the median |signed error| of {what}", "<=", TIME_MEDIAN, ".0%",
                     "the book's standard for a time prediction", "the typical case is predicted well",
                     "the typical case is not predicted well", ERROR_RANGE)


def _every(key: str, what: str, holds: str, fails: str, threshold: float = 1.0) -> Criterion:
    """A share of cases that must hold (all of them by default)."""
    return Criterion(key, f"the share of {what}", ">=", threshold, ".0%",
                     "every case" if threshold == 1 else "most cases", holds, fails, SHARE_RANGE)


RULES = {rule.chapter: rule for rule in (
    Rule("layer_timing", "Does counting FLOPs predict one layer's time?", (
        _time("median_error", "one layer's time predicted as FLOPs over the best measured rate"),
        _time("largest_error", "one layer's time predicted as FLOPs over the best measured rate", largest=True))),
    Rule("calibration", "How well does an α-β and roofline calibration describe this machine?", (
        Criterion("fit_rms", "the largest rms relative error of the α-β fits", "<=", TIME_MAX, ".0%",
                  "a collective's time within a quarter over the message sizes", "α-β describes the collectives",
                  "α-β misses some collective's shape", ERROR_RANGE),
        _time("profiled_largest", "a whole model's time summed from profiled parts", largest=True))),
    Rule("memory_anatomy", "Does the framework predict memory by category on one device?", (
        Criterion("states_error", "the largest |error| of a model state (parameters, gradients, optimizer states)",
                  "<=", 0.005, ".1%", "model states are counted to the byte; 0.5 % leaves room for the "
                  "allocator's rounding only", "the states are counted exactly", "some state is miscounted",
                  (0.001, 0.005, 0.02, 0.05)),
        Criterion("activations_error", "the largest |error| of a row's activations", "<=", 0.02, ".1%",
                  "the saved tensors are counted one by one; 2 % is what the counts leave out (masks, small "
                  "buffers)", "the saved tensors are counted", "some saved tensors are missed",
                  (0.01, 0.02, 0.05, 0.10)))),
    Rule("dp_zero", "Do communication block size and waiting time matter? (claim 3)", (
        Criterion("bucket_spread", "the change of DDP's iteration time across bucket sizes on this machine (slowest "
                  "over fastest mean of the repeats)", ">=", 0.05, ".0%", "a change a user would notice",
                  "the bucket size changes the step time noticeably", "the bucket size barely changes the step time",
                  (0.02, 0.05, 0.10, 0.20)),
        Criterion("bucket_p", "the permutation p-value of that change", "<=", P_VALUE, ".2g",
                  "the usual 5 % test level, paid for picking the slowest and fastest sizes after the fact",
                  "the change is beyond the run-to-run noise", "the change is within the run-to-run noise", P_RANGE),
        Criterion("slow_spread", "the same change on an emulated slow link", ">=", 0.05, ".0%",
                  "a change a user would notice", "on a slow link the bucket size matters",
                  "even on a slow link the bucket size barely matters", (0.02, 0.05, 0.10, 0.20)),
        Criterion("slow_p", "its permutation p-value", "<=", P_VALUE, ".2g", "the usual 5 % test level",
                  "the slow link's change is beyond the noise", "the slow link's change is within the noise", P_RANGE),
        Criterion("waiting_share", "the largest share of its step a rank spends waiting for communication "
                  "(DDP at the default bucket, or a pipeline stage)", ">=", 0.10, ".0%",
                  "a tenth of the step is worth a user's attention", "waiting is a sizeable part of the step",
                  "waiting is a small part of every rank's step", (0.05, 0.10, 0.20, 0.30)))),
    Rule("tensor_parallel", "What do tensor and sequence parallelism cost and save?", (
        Criterion("states_error", "the largest |error| of a rank's model states", "<=", 0.10, ".0%",
                  "bytes are counted, so a tenth is generous", "the shards' states are predicted",
                  "some shard's states are mispredicted", (0.02, 0.05, 0.10, 0.25)),
        Criterion("comm_error", "the largest |error| of the bytes sent per layer", "<=", 0.10, ".0%",
                  "ring volumes are exact up to gloo's own algorithm", "the collectives' volume is predicted",
                  "the collectives' volume is mispredicted", (0.02, 0.05, 0.10, 0.25)),
        Criterion("activations_error", "the largest |error| of the activations", "<=", 0.25, ".0%",
                  "DTensor keeps copies the count leaves out", "the activations are predicted",
                  "the activations are mispredicted", (0.05, 0.10, 0.25, 0.50)),
        _every("faster_agree", "microbatch sizes at which the framework names the faster of tp 2 and one rank",
               "the framework says when tensor parallelism pays", "the framework misjudges when it pays"))),
    Rule("pipeline_schedules", "Do bubbles and in-flight microbatches follow the schedules' formulas?", (
        _time("median_error", "the schedules' iteration time"),
        Criterion("trend", "Spearman's ρ of the flushing schedules' time per microbatch with m", "<=", -0.5, "+.2f",
                  "the bubble's share falls as m grows, so should the time per microbatch",
                  "the time per microbatch falls as the bubble shrinks", "the time per microbatch does not fall "
                  "with m", (-0.9, -0.7, -0.5, -0.3)),
        Criterion("speedup_2bw", "the smallest measured speed-up of 2BW over 1F1B", ">=", 1.0, ".2f",
                  "2BW drops the flush, so it must not be slower", "2BW gains from dropping the flush",
                  "2BW is slower than 1F1B somewhere", SPEEDUP_RANGE))),
    Rule("partitioning", "Does a realistic pipeline partitioner raise *total* memory? (claim 2)", (
        Criterion("rise", "the largest rise of the measured total memory over the uniform split among the realistic "
                  "partitioners (balanced by parameters, by time, by FLOPs), under 1F1B",
                  ">=", 0.02, ".1%", "accounting is exact to the byte, so 2 % is far above run-to-run differences",
                  "a realistic partitioner raises the total", "no realistic partitioner raises the total noticeably",
                  (0.005, 0.01, 0.02, 0.05, 0.10)),)),
    Rule("pp_vs_dp", "Does pipeline parallelism beat data parallelism? (claim 1)", (
        _every("measured_share", "measured cells (configurations on loopback and on emulated links of the map) "
               "in which the pipeline is faster (the 95 % interval of PP/DP over the repeats above 1)",
               "the pipeline wins most measured cells", "the pipeline wins fewer than half of the measured cells",
               0.5),
        Criterion("boundary_agree", "the share of the map's decisive cells (link rate × model × batch, ties left "
                  "out) whose winner the framework names", ">=", 0.75, ".0%", "a boundary misplaced by one swept "
                  "rate in each slice of the map costs about a quarter of its decisive cells",
                  "the framework places the boundary of the pipeline's region",
                  "the framework misplaces the boundary of the pipeline's region", SHARE_RANGE),
        _every("predicted_share", "cluster cells in which the framework has the pipeline faster",
               "the framework has the pipeline win most of a cluster's cells", "the framework has data "
               "parallelism win most of a cluster's cells", 0.5))),
    Rule("twobw", "Does PipeDream-2BW buy throughput without hurting convergence?", (
        Criterion("speedup", "the lower 95 % bound of 2BW's speed-up over Flush on the same engine, at the m where "
                  "it is smallest", ">=", 1.0, ".2f", "2BW must be faster at every m, beyond the run-to-run noise",
                  "2BW is faster at every m", "2BW is not clearly faster at some m", SPEEDUP_RANGE),
        Criterion("gap_bound", "the largest |end| of the 95 % intervals of the paired gap in final held-out loss, 2BW "
                  "against training without a pipeline (long study, every learning rate)", "<=", EQUIVALENCE_MARGIN,
                  ".3f", "an equivalence margin of 0.02 nats per byte, about 1 % of the loss these byte-level "
                  "models reach", "2BW's final held-out loss is equivalent within the margin",
                  "2BW's final held-out loss is not shown equivalent within the margin", (0.01, 0.02, 0.05, 0.10)))),
    Rule("planner", "Does the planner pick what runs fastest, and the paper's depths?", (
        Criterion("rho", "Spearman's ρ of the predicted with the measured ranking", ">=", RHO, "+.2f",
                  "a strong rank correlation", "the ranking follows the measurements",
                  "the ranking does not follow the measurements", RHO_RANGE),
        Criterion("share", "the throughput of the first choice over the measured best", ">=", 0.9, ".0%",
                  "a plan within a tenth of the best", "its first choice is near the best",
                  "its first choice is well below the best", (0.7, 0.8, 0.9, 0.95, 1.0)),
        _every("depth_hits", "the paper's planning cases in which it picks the paper's depth",
               "it picks the paper's depths", "it misses some of the paper's depths"))),
    Rule("network", "On links shaped to a cluster's FLOP per byte, where does the pipeline overtake data "
                    "parallelism?", (
        Criterion("crossover_factor", "the factor between the measured and the predicted crossover rate", "<=",
                  3.0, ".2g", "link rates are swept in steps of about 2×", "the framework places the crossover",
                  "the framework misplaces the crossover (or one of them was not found)", (1.5, 2.0, 3.0, 5.0)),
        _every("placement_right", "link rates at which the framework names the faster placement",
               "the framework names the faster placement", "the framework misjudges the placement"),
        _every("inside_wins", "link rates at which replicas inside a node are faster",
               "keeping replicas inside a node pays, as the planner assumes",
               "keeping replicas inside a node does not always pay"))),
    Rule("time_breakdown", "Does a model that prices every kernel predict the iteration time?", (
        Criterion("profiled_median", "the profiled mode's median |error|", "<=", 0.05, ".1%",
                  "the best published simulators reach 3–5 %", "the profiled mode meets its median goal",
                  "the profiled mode misses its median goal", ERROR_RANGE),
        Criterion("profiled_largest", "the profiled mode's largest |error|", "<=", 0.15, ".0%",
                  "three times the median goal", "no profiled prediction is far off",
                  "some profiled prediction is far off", ERROR_RANGE),
        _time("analytical_median", "the analytical mode"),
        _time("analytical_largest", "the analytical mode", largest=True),
        Criterion("exposed_largest", "the largest |error| of the exposed communication per kind (where it "
                  "exceeds 5 % of the iteration)", "<=", 0.10, ".0%", "the goal set for the communication term",
                  "the exposed communication is predicted", "the exposed communication is not predicted",
                  ERROR_RANGE))),
    Rule("published_validation", "Does the framework predict published step times and speed-ups at the papers' scale?", (
        Criterion("validation_mean", "the mean |signed error| of the published iteration times of Korthikanti et al.'s "
                  "Table 5, predicted with constants fitted on Megatron-LM's Table 1 only", "<=", 0.05, ".1%",
                  "the accuracy the best analytical model reports on the same table (Calculon)",
                  "the typical published step time is predicted within 5 %",
                  "the typical published step time is missed by more than 5 %", ERROR_RANGE),
        Criterion("validation_max", "the largest |signed error| of those iteration times", "<=", 0.10, ".1%",
                  "no miss larger than the largest the best analytical model reports on the table (Calculon)",
                  "no published step time is missed by more than 10 %",
                  "some published step time is missed by more than 10 %", ERROR_RANGE),
        _every("twobw_ratios", "PipeDream-2BW's published speed-ups (over PipeDream-Flush and GPipe) that the "
               "framework's planner predicts within 15 % at the paper's scale",
               "the 2BW speed-ups are reproduced at the paper's scale", "some 2BW speed-up is not reproduced"))),
    Rule("papers_scale",
         "Does the framework reproduce the papers' published parameter counts and model-state bytes?", (
        _every("counts_exact", "counts (parameters, model states, stages) equal to the real modules'",
               "the counts are exact", "some count is off"),
        _every("published_agree", "published values matched at the precision the paper prints",
               "the published values are reproduced", "some published value is not reproduced"))),
)}


def rule(chapter: str) -> Rule:
    """The rule of a chapter (its file name without ``.md``)."""
    return RULES[chapter]


def threshold(chapter: str, key: str) -> float:
    """The declared threshold of one criterion of a chapter's rule."""
    return next(c.threshold for c in RULES[chapter].criteria if c.key == key)


def share(hits, cases) -> float:
    """hits / cases, NaN when there are no cases (so the criterion counts as not measured)."""
    return hits / cases if cases else math.nan
