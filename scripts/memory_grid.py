"""The run-versus-prediction grid: memory by category and communication bytes by kind, measured against the
cost model, for every strategy and hybrid on up to 4 ranks.

    python scripts/memory_grid.py [--presets tiny,small,medium] [--full] [--out data/fresh/memory_grid.csv]

Each point is ``python -m distperf run --json`` (fresh processes over gloo, one optimizer step, then the
measurement steps of :mod:`distperf.measure.steps`) with the prediction on a hardware preset (memory and bytes do
not depend on the hardware). One CSV row per point holds the configuration and the signed errors
(predicted − measured)/measured of :mod:`distperf.measure.compare`: for each model state and the activations
the error of the pipeline rank whose |error| is largest (``err_<category>``), the model states kept between
steps likewise (``err_rest_<state>``), the communication bytes per kind, algorithmic and on gloo's wire
(``err_comm_<kind>``, ``err_wire_<kind>``), and the measured values beside them (``measured_<category>`` of the
most loaded rank, ``rss_peak_increase`` its resident-set peak over the memory step). At the end it prints the
largest |error| per strategy and category.

By default it measures a subset that covers every strategy at each preset and every micro-batch size and
recomputation mode: strategy k at preset j takes the (micro-batch, recomputation) pair (k + 3j) mod 9 and
(k + 3j + 4) mod 9 of the 9, so every pair appears at every preset: 96 runs, about 35 minutes on two cores.
``--full`` measures the whole product (3 micro-batch sizes × 3 recomputation modes at every strategy and preset,
432 runs; hours on two cores).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MICRO_BATCHES = (1, 2, 4)
RECOMPUTE = ("none", "selective", "full")
PAIRS = [(b, rc) for b in MICRO_BATCHES for rc in RECOMPUTE]
STATES = ("parameters", "gradients", "optimizer_states")
CATEGORIES = STATES + ("activations",)
KINDS = ("data_parallel", "tensor_parallel", "pipeline_parallel")

# name -> flags of the layout (microbatches: 2 per step everywhere, so that FSDP2 accumulates and pipelines fill)
STRATEGIES = {
    "dp": ["--dp", "2"],
    "zero1": ["--dp", "2", "--zero", "1"],
    "zero2": ["--dp", "2", "--zero", "2"],
    "zero3": ["--dp", "2", "--zero", "3"],
    "tp": ["--tp", "2"],
    "tp+sp": ["--tp", "2", "--sequence-parallel"],
    "pp-gpipe": ["--pp", "2", "--schedule", "gpipe"],
    "pp-1f1b": ["--pp", "2", "--schedule", "1f1b"],
    "pp-interleaved": ["--pp", "2", "--schedule", "interleaved", "--chunks", "2"],
    "pp-2bw": ["--pp", "2", "--schedule", "2bw"],
    "dp×pp": ["--dp", "2", "--pp", "2", "--schedule", "1f1b"],
    "dp×tp": ["--dp", "2", "--tp", "2"],
    "tp×pp": ["--tp", "2", "--pp", "2", "--schedule", "1f1b"],
    "zero1 dp=4": ["--dp", "4", "--zero", "1"],
    "zero3 m=1": ["--dp", "2", "--zero", "3", "--microbatches", "1"],
    "tp+sp×pp": ["--tp", "2", "--pp", "2", "--schedule", "1f1b", "--sequence-parallel"],
}
LAYERS = {("tiny", "pp-interleaved"): 4}  # tiny has 2 layers; interleaving 2 chunks on 2 ranks needs 4


def points(presets: list[str], full: bool) -> list[tuple[str, str, int, str]]:
    """(preset, strategy, micro-batch, recomputation) of every point to measure."""
    out = []
    for j, preset in enumerate(presets):
        for k, strategy in enumerate(STRATEGIES):
            pairs = PAIRS if full else [PAIRS[(k + 3 * j) % 9], PAIRS[(k + 3 * j + 4) % 9]]
            out += [(preset, strategy, b, rc) for b, rc in pairs]
    return out


def flags(preset: str, strategy: str, b: int, rc: str) -> list[str]:
    args = ["--model", preset, *STRATEGIES[strategy], "--micro-batch", str(b), "--recompute", rc]
    if "--microbatches" not in args:
        args += ["--microbatches", "2"]
    if (preset, strategy) in LAYERS:
        args += ["--layers", str(LAYERS[preset, strategy])]
    return args


def _worst(errors: list[dict], key: str):
    """The signed error of largest magnitude over the pipeline ranks (None when none is defined)."""
    values = [e[key] for e in errors if e.get(key) is not None]
    return max(values, key=abs) if values else None


def row_of(result: dict) -> dict:
    """The CSV columns of one run's ``--json`` result."""
    err, mem, comm = result["error"], result["memory_bytes"], result["communication"]
    row = {f"err_{c}": _worst(err["memory_bytes_by_stage"], c) for c in CATEGORIES}
    row.update({f"err_rest_{c}": _worst(err["model_states_at_rest"], c) for c in STATES})
    row.update({f"err_comm_{k}": err["communication_bytes"][k] for k in KINDS})
    row.update({f"err_wire_{k}": err.get("communication_wire_bytes", {}).get(k) for k in KINDS})
    row.update({f"measured_{c}": mem[c] for c in CATEGORIES + ("temporaries", "total")})
    row.update({f"predicted_{c}": result["prediction"]["memory_bytes_by_stage"][err["memory_bytes"]["stage"]][c]
                for c in CATEGORIES})
    row.update({f"sent_{k}": comm["sent_bytes"].get(k, 0) for k in KINDS})
    row.update({f"wire_{k}": comm["wire_bytes"].get(k, 0) for k in KINDS})
    row["rss_peak_increase"] = mem.get("rss_peak_increase")
    return row


def measure(preset: str, strategy: str, b: int, rc: str, timeout: float) -> dict:
    """One point: run it, and return its CSV row (``status`` ok, or why not)."""
    cmd = [sys.executable, "-m", "distperf", "run", *flags(preset, strategy, b, rc), "--steps", "1", "--warmup", "0",
           "--device", "cpu", "--hardware", "A100-80GB", "--json", "--timeout", str(int(timeout))]
    base = {"preset": preset, "strategy": strategy, "micro_batch": b, "recompute": rc, "flags": " ".join(cmd[4:])}
    env = {**os.environ, "PYTHONPATH": str(ROOT / "lib")}
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {**base, "status": "timeout", "elapsed_s": timeout}
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        return {**base, "status": "failed", "elapsed_s": elapsed, "message": proc.stderr.strip()[-300:]}
    return {**base, "status": "ok", "elapsed_s": round(elapsed, 1), **row_of(json.loads(proc.stdout))}


COLUMNS = (["preset", "strategy", "micro_batch", "recompute", "status", "elapsed_s"]
           + [f"err_{c}" for c in CATEGORIES] + [f"err_rest_{c}" for c in STATES]
           + [f"err_comm_{k}" for k in KINDS] + [f"err_wire_{k}" for k in KINDS]
           + [f"measured_{c}" for c in CATEGORIES + ("temporaries", "total")] + [f"predicted_{c}" for c in CATEGORIES]
           + [f"sent_{k}" for k in KINDS] + [f"wire_{k}" for k in KINDS] + ["rss_peak_increase", "flags", "message"])
SUMMARY = ([f"err_{c}" for c in CATEGORIES] + [f"err_rest_{c}" for c in STATES] + [f"err_comm_{k}" for k in KINDS]
           + [f"err_wire_{k}" for k in KINDS])


def summary(rows: list[dict]) -> str:
    """Largest |signed error| per strategy and category, in percent (— where nothing was measured)."""
    names = {"parameters": "par", "gradients": "grad", "optimizer_states": "opt", "activations": "act",
             "data_parallel": "dp", "tensor_parallel": "tp", "pipeline_parallel": "pp"}

    def short(col):
        for prefix, label in (("err_rest_", "rest "), ("err_comm_", "bytes "), ("err_wire_", "wire "), ("err_", "")):
            if col.startswith(prefix):
                return label + names[col[len(prefix):]]
        return col

    lines = ["strategy        runs " + " ".join(f"{short(c):>9}" for c in SUMMARY)]
    for strategy in dict.fromkeys(r["strategy"] for r in rows):
        ok = [r for r in rows if r["strategy"] == strategy and r["status"] == "ok"]
        cells = []
        for c in SUMMARY:
            values = [abs(float(r[c])) for r in ok if r.get(c) not in (None, "")]
            cells.append(f"{100 * max(values):8.3f}%" if values else f"{'—':>9}")
        lines.append(f"{strategy:15s} {len(ok):4d} " + " ".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="tiny,small,medium", help="model presets (default tiny,small,medium)")
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help="strategies to measure (default all)")
    parser.add_argument("--full", action="store_true", help="every micro-batch × recomputation pair at every point")
    parser.add_argument("--out", default=str(ROOT / "data" / "fresh" / "memory_grid.csv"),
                        help="the CSV of signed errors (default data/fresh/memory_grid.csv, git-ignored)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run (default 600)")
    args = parser.parse_args(argv)
    chosen = set(args.strategies.split(","))
    todo = [p for p in points(args.presets.split(","), args.full) if p[1] in chosen]
    rows = []
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for i, point in enumerate(todo, 1):
            row = measure(*point, timeout=args.timeout)
            rows.append(row)
            writer.writerow(row)
            f.flush()
            worst = max((abs(float(row[c])) for c in SUMMARY if row.get(c) not in (None, "")), default=float("nan"))
            print(f"[{i}/{len(todo)}] {' '.join(map(str, point))}: {row['status']} {row.get('elapsed_s')} s, "
                  f"largest |error| {100 * worst:.3f}%", flush=True)
    print(summary(rows))
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
