"""Do the calibration's path probes slow down from one round to the next? (no torch: read from a calibration's
sidecar, ``conditions.path_rounds``, for the chapter "Where the time goes").

Until 6 December 2026 every round of the calibration's noisy probes ran in the same two processes, and each round's
trainers left gloo's threads behind (:func:`distperf.measure.calibrate.training_conditions`). On four ten-repeat
builds (d91ccc8, 7ee0426, ac5aefb, 177e3f8) the path probes' times rose with the round: the median over the 14 timed
probes of the rank correlation between a probe's time and its round's number read 0.71, 0.54, 0.66 and 0.89, and the
plain stack took 41 %, 30 %, 25 % and 43 % longer in the last round than in the first. From then on each round runs in
fresh processes, as each run does.

The rule, declared with that change (before the build that judges it): the rounds no longer drift if the median
rank correlation is below :data:`DRIFT_BELOW`. With no drift it scatters about 0 (each probe's correlation over six
rounds has a standard deviation of about 0.45, the median of 14 independent ones about 0.15; the probes of a round share
its moment, so somewhat more); 0.3 lies two of those above 0 and below every one of the four builds.

That reasoning holds for six rounds, not for three, which a calibration runs when each round takes long (on the
build at 8f43884, 56 s a round): over three rounds a probe's correlation is ±0.5 or ±1, and a round that happens to
be slow moves every probe at once. :func:`chance` says how often the rounds' order alone reaches the median found:
the share of the orders of the rounds (each order applied to every probe at once, since the probes of a round share
its moment) whose median correlation is at least as high. It is reported beside the rule's verdict, which stays as
declared.
"""
from __future__ import annotations

import itertools
import random
import statistics

DRIFT_BELOW = 0.3


def rank_correlation(values: list[float]) -> float:
    """Spearman's rank correlation between ``values`` and their positions 0, 1, 2, … (ties ranked by position)."""
    n = len(values)
    if n < 2:
        return 0.0
    ranks = [0] * n
    for rank, index in enumerate(sorted(range(n), key=lambda i: values[i])):
        ranks[index] = rank
    middle = (n - 1) / 2
    return sum((i - middle) * (r - middle) for i, r in enumerate(ranks)) / sum((i - middle) ** 2 for i in range(n))


EXACT_ORDERS_UP_TO = 7  # rounds: every order (5040); above, ORDERS random ones
ORDERS = 5000


def median_correlation(series: list[list[float]]) -> float:
    """The median over ``series`` (one list of times per probe, by round) of :func:`rank_correlation`."""
    return statistics.median(rank_correlation(values) for values in series)


def chance(series: list[list[float]]) -> float:
    """The share of the orders of the rounds, each applied to every probe's times at once, whose
    :func:`median_correlation` is at least that of ``series`` as measured: every order up to
    :data:`EXACT_ORDERS_UP_TO` rounds, else :data:`ORDERS` random ones (seed 0) with the measured one among them."""
    n = len(series[0])
    found = median_correlation(series)
    if n <= EXACT_ORDERS_UP_TO:
        orders = list(itertools.permutations(range(n)))
    else:
        generator = random.Random(0)
        orders = [tuple(range(n))] + [tuple(generator.sample(range(n), n)) for _ in range(ORDERS - 1)]
    reached = sum(median_correlation([[values[i] for i in order] for values in series]) >= found - 1e-12
                  for order in orders)
    return reached / len(orders)


def drift(side: dict | None) -> dict | None:
    """{rounds, probes, correlation: the median over the timed path probes (``*_s`` but not ``*_wait_s``) of
    :func:`rank_correlation` of their rounds' times, change: the median of (last round / first − 1), plain: the plain
    stack's, threads: each round's threads on rank 0 when its path probes began (None before 6 December 2026), chance:
    :func:`chance`, drifts: the rule's verdict}; None with fewer than three rounds."""
    conditions = (side or {}).get("conditions") or {}
    rounds = conditions.get("path_rounds") or []
    if len(rounds) < 3:
        return None
    probes = [name for name in rounds[0] if name.endswith("_s") and not name.endswith("_wait_s")
              and all(r.get(name) for r in rounds)]
    series = [[r[name] for r in rounds] for name in probes]
    correlation = median_correlation(series)
    threads = (conditions.get("rounds") or {}).get("threads")
    return {"rounds": len(rounds), "probes": len(probes), "correlation": correlation,
            "change": statistics.median(rounds[-1][name] / rounds[0][name] - 1 for name in probes),
            "plain": (rounds[-1]["plain_stack_s"] / rounds[0]["plain_stack_s"] - 1
                      if "plain_stack_s" in probes else None),
            "threads": [began for began, _ in threads] if threads else None,
            "chance": chance(series), "drifts": correlation >= DRIFT_BELOW}


def sentence(side: dict | None) -> str:
    """:func:`drift` in words, with the rule's verdict."""
    found = drift(side)
    if found is None:
        return "this calibration ran fewer than three rounds of its path probes, too few to tell a drift"
    where = ("each round in fresh processes (rank 0 began its path probes with "
             f"{min(found['threads'])} to {max(found['threads'])} threads)" if found["threads"]
             else "every round in the same processes")
    plain = f", the plain stack's {found['plain']:+.0%}" if found["plain"] is not None else ""
    verdict = ("the rounds drift: at or above" if found["drifts"] else "the rounds do not drift: below")
    return (f"over {found['rounds']} rounds, {where}, the median over {found['probes']} path probes of the rank "
            f"correlation between a probe's time and its round is {found['correlation']:+.2f}, and the last round "
            f"took a median {found['change']:+.0%} over the first{plain}: {verdict} the rule's {DRIFT_BELOW}; "
            f"{found['chance']:.0%} of the orders of these {found['rounds']} rounds reach that median by chance")
