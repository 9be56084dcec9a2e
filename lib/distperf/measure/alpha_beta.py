"""The α-β fits of the calibration's collective times (no torch: the book refits a sidecar's rounds).

time = steps(n)·α + volume(n, bytes)/β, with the ring terms of :func:`distperf.cost.collectives.ring_terms`
(chapter "The analytical framework", section on communication): weighted least squares, weights 1/time, so that
every size counts by its relative error.
"""
from __future__ import annotations

from ..cost.collectives import ring_terms


def fit_alpha_beta(points) -> dict:
    """Weighted least squares of time = steps·α + volume/β over ``points`` [(collective, n, bytes,
    seconds)], weights 1/time. Returns {alpha, beta, rms_relative_error, points}. A non-positive α (the
    smallest messages cost less than the fit's intercept) is replaced by the smallest time per step
    measured, and the note says so."""
    import numpy as np

    rows = [(ring_terms(c, n, m), t) for c, n, m, t in points if t > 0]
    a = np.array([[s, v] for (s, v), _ in rows], dtype=np.float64)
    t = np.array([t for _, t in rows], dtype=np.float64)
    w = 1.0 / t
    (alpha, inv_beta), *_ = np.linalg.lstsq(a * w[:, None], t * w, rcond=None)
    note = ""
    if not alpha > 0:
        alpha = float(min(ti / s for (s, _), ti in rows))
        note = "alpha: the fitted intercept was not positive; the smallest time per step measured is used"
        inv_beta = float(np.sum(w * w * a[:, 1] * (t - alpha * a[:, 0])) / np.sum(w * w * a[:, 1] ** 2))
    if not inv_beta > 0:
        inv_beta = float(min(ti / v for (_, v), ti in rows if v > 0))
        note += ("; " if note else "") + "beta: the fitted slope was not positive; the best throughput measured is used"
    pred = a[:, 0] * alpha + a[:, 1] * inv_beta
    rms = float(np.sqrt(np.mean(((pred - t) / t) ** 2)))
    out = {"alpha": float(alpha), "beta": float(1.0 / inv_beta), "rms_relative_error": rms, "points": len(rows)}
    if note:
        out["note"] = note
    return out


def fit_collectives(rows: list[dict]) -> dict:
    """{collective: {"ranks": {n: fit}, "all": fit over every rank count}}, for the collectives and rank counts with a
    positive time (a time measured as a difference, as :func:`training_conditions` does, can be none on a busy
    machine)."""
    fits = {}
    rows = [r for r in rows if r["seconds"] > 0]
    for collective in sorted({r["collective"] for r in rows}):
        mine = [r for r in rows if r["collective"] == collective]
        per_n = {}
        for n in sorted({r["ranks"] for r in mine}):
            per_n[str(n)] = fit_alpha_beta([(collective, n, r["bytes"], r["seconds"]) for r in mine if r["ranks"] == n])
        fits[collective] = {"ranks": per_n,
                            "all": fit_alpha_beta([(collective, r["ranks"], r["bytes"], r["seconds"]) for r in mine])}
    return fits


def fit_issued(rows: list[dict], alone: dict) -> dict:
    """:func:`fit_collectives` of the collectives as a step issues them (``rows``), and for a collective none of whose
    times was positive (each size within the noise of the burst before it), its fit alone (``alone``), with a note."""
    fits = fit_collectives(rows)
    for kind in sorted(set(alone) - set(fits)):
        fits[kind] = {**alone[kind], "note": "no positive time as a step issues it: the fit of the collective alone"}
    return fits
