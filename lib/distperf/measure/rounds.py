"""When the calibration's noisiest probes have been repeated enough (no torch: the book reads a sidecar's rounds).

The collectives as a step issues them and the parallel-path probes (:func:`distperf.measure.calibrate.
training_conditions`) are differences of a few milliseconds on a shared machine: on the eighth build of the book on
this two-core machine, one 8-byte issued all-reduce read 3.68 ms where the build before read 0.37 ms, the issued
all-reduce's α moved from 0.26 to 0.88 ms, and the tensor-parallel path constant spread from 310 to 2272 µs over its
three rounds, while the runs it priced moved by a few percent. A full calibration therefore repeats a round (each
issued collective at each size, the path probes) at least :data:`ROUNDS_MIN` times and then
until the constants the profile takes from the rounds' medians have **settled**: adding the last round moved none
of them by more than :data:`SETTLED` (relative), or :data:`ROUNDS_MAX` rounds or :data:`ROUNDS_BUDGET_S` seconds of
rounds have passed (the sidecar then says that they did not settle). The constants watched are each issued
collective's α and β (the α-β fit of the rounds' median time at every size) and each path probe's median time.
"""
from __future__ import annotations

import statistics

from ..config import DDP_BUCKET_MB
from .alpha_beta import fit_collectives

ROUNDS_MIN, ROUNDS_MAX = 3, 8
SETTLED = 0.10  # the largest relative move of a watched constant when the last round is added
ROUNDS_BUDGET_S = 150.0  # no round starts after this many seconds of rounds (then at least ROUNDS_MIN are done)
# Each issued collective is also timed at the largest message a trainer's step gives it (ISSUED_LARGEST): the
# all-reduce at DDP's default bucket. Until 6 December 2026 the issued sizes stopped at 4 MiB, and the all-reduce's
# fit priced the 24.6 MiB bucket of the `medium` preset at 12.0 ms where its data-parallel runs exposed 22.7 ms (their
# breakdown steps; the same model's backward under DDP took 20-22 ms longer than without it, both ranks at once, on
# the development machine), and the issued all-reduce of 25 MiB, timed as the calibration times it, 15-19 ms.
# Whether the fit takes that point is the rule BUCKET_IN_FIT (chapter "Where the time goes", section "Held-out
# validation"), judged on the ten-repeat build at 1237e08: it did not stand. That calibration's sizes to 4 MiB already
# gave β 1.51 GB/s (afd1f12's 2.31), the point raised it to 1.63, and the two runs' exposed communication missed by a
# median 22.8 % with it against 17.4 % without. The point stays measured and out of the fit.
ISSUED_LARGEST = {"all-reduce": DDP_BUCKET_MB * 2**20}
BUCKET_IN_FIT = False


def fitted_rows(rows: list[dict], bucket: bool = BUCKET_IN_FIT) -> list[dict]:
    """The issued rows an α-β fit takes: all of them with ``bucket`` (:data:`BUCKET_IN_FIT`), else those of the sizes
    below :data:`ISSUED_LARGEST` (the sizes every collective is timed at)."""
    if bucket:
        return rows
    return [r for r in rows if r["bytes"] < ISSUED_LARGEST.get(r["collective"], float("inf"))]


def median_rows(issued_rounds: list[list[dict]]) -> list[dict]:
    """Each (collective, ranks, bytes) point's median ``seconds`` over the rounds (rows as
    :func:`distperf.measure.calibrate.collective_times` gives them, in the first round's order)."""
    seen: dict = {}
    for rows in issued_rounds:
        for r in rows:
            seen.setdefault((r["collective"], r["ranks"], r["bytes"]), []).append(r["seconds"])
    return [{"collective": c, "ranks": n, "bytes": b, "seconds": statistics.median(times)}
            for (c, n, b), times in seen.items()]


def watched(issued_rounds: list[list[dict]], path_rounds: list[dict]) -> dict:
    """The constants the profile takes from these rounds: ``<kind> alpha`` and ``<kind> beta`` of
    :func:`distperf.measure.alpha_beta.fit_collectives` over :func:`median_rows` (:func:`fitted_rows`), and each path
    probe's median."""
    out = {}
    if issued_rounds:
        for kind, found in fit_collectives(fitted_rows(median_rows(issued_rounds))).items():
            out[f"{kind} alpha"], out[f"{kind} beta"] = found["all"]["alpha"], found["all"]["beta"]
    for name in (path_rounds[0] if path_rounds else {}):
        out[name] = statistics.median(r[name] for r in path_rounds)
    return out


def moves(issued_rounds: list[list[dict]], path_rounds: list[dict]) -> dict:
    """{constant: |with the last round / without it − 1|} of :func:`watched` (empty with fewer than two rounds; a
    constant that was 0 and stays 0 moved 0, one that leaves 0 moved infinitely)."""
    if len(path_rounds) < 2 and len(issued_rounds) < 2:
        return {}
    before = watched(issued_rounds[:-1], path_rounds[:-1])
    after = watched(issued_rounds, path_rounds)
    out = {}
    for name, value in after.items():
        old = before.get(name)
        if old is None:
            continue
        out[name] = abs(value / old - 1) if old else (0.0 if value == old else float("inf"))
    return out


def another_round(done: int, elapsed_s: float, moved: dict, least: int = ROUNDS_MIN,
                  most: int = ROUNDS_MAX) -> bool:
    """Whether to run one more round after ``done`` rounds and ``elapsed_s`` seconds of them, the last round having
    moved the watched constants by ``moved`` (:func:`moves`): below ``least``, yes; at ``most`` or past
    :data:`ROUNDS_BUDGET_S`, no; otherwise while any moved more than :data:`SETTLED`."""
    if done < least:
        return True
    if done >= most or elapsed_s > ROUNDS_BUDGET_S:
        return False
    return not moved or max(moved.values()) > SETTLED


def settled(moved: dict) -> bool:
    """Whether the last round moved no watched constant by more than :data:`SETTLED`."""
    return bool(moved) and max(moved.values()) <= SETTLED


def least_contention(rounds: list[dict]) -> dict:
    """Each contention ratio (``memory``, ``compute``) over the rounds of the contention probe: the least (the comment
    at :data:`distperf.measure.calibrate.PATH_ROUNDS_FROM_REPS` says why); and the layer's (``layer``, where every
    round measured one: from 6 December 2026) the rounds' median, since each round's ratio is clipped at 1 and the
    least of a few reads 1 whenever one round's time alone ran slow (in development on this machine, four rounds of the
    calibration's length read 1.18, 1.00, 1.00 and 1.00; the same layer, alone and at once in turn six times, 1.00 to
    1.08, median 1.04)."""
    out = {name: min(r[name] for r in rounds) for name in ("memory", "compute")}
    if rounds and all("layer" in r for r in rounds):
        out["layer"] = statistics.median(r["layer"] for r in rounds)
    return out


def profile_from_rounds(hw, side: dict, issued: slice = slice(None), paths: slice = slice(None),
                        contention: slice = slice(None), bucket: bool = BUCKET_IN_FIT):
    """The hardware profile ``hw`` (a calibration's, with its sidecar ``side``) with the constants taken from the
    rounds of its noisy probes recomputed from the rounds ``issued``, ``paths`` and ``contention`` select, as the
    calibration takes them (:func:`distperf.measure.calibrate.calibrate`): each collective's α and β from the chosen
    issued rounds' median times (:func:`median_rows`, with the bucket's point if ``bucket``: :func:`fitted_rows`; a
    collective with no positive time keeps the profile's), the contention ratios their least round, and the path
    constants from the chosen path rounds' median times (:func:`distperf.measure.path_fits.with_path_constants`). So
    a build can be priced with the profile another rule would have given it. ValueError without rounds."""
    from dataclasses import replace

    from .path_fits import with_path_constants
    from .profiles import sidecar_conditions

    conditions = sidecar_conditions(side)
    issued_rounds = (conditions.get("issued_rounds") or [])[issued]
    path_rounds = (conditions.get("path_rounds") or [])[paths]
    ratios = [r for r in (conditions.get("contention_rounds") or [])[contention] if r]
    if hw is None or hw.kernels is None or not issued_rounds or not path_rounds or not ratios:
        raise ValueError("the calibration kept no rounds of the issued collectives, paths or contention to choose from")
    fits = {kind: (alpha, beta) for kind, alpha, beta in hw.collectives}
    fits.update((kind, (fit["all"]["alpha"], fit["all"]["beta"]))
                for kind, fit in fit_collectives(fitted_rows(median_rows(issued_rounds), bucket)).items())
    least = {f"contention_{name}": value for name, value in least_contention(ratios).items()}
    out = replace(hw, collectives=tuple((kind, *fits[kind]) for kind in sorted(fits)),
                  kernels=replace(hw.kernels, **least))
    timed = {name: statistics.median(r[name] for r in path_rounds) for name in path_rounds[0]}
    return with_path_constants(out, timed, side.get("ranks") or 2)
