"""The long convergence study of PipeDream-2BW, archived as reference data (too long for a build of the book).

    python scripts/convergence_reference.py              # this machine, scale cpu (`make convergence-reference`)
    python scripts/convergence_reference.py --dry-run    # print the grid and where it writes
    python scripts/convergence_reference.py --scale smoke --out /tmp/conv.csv   # a few steps, to try it

The same model trained on English text (``--data text``) with PipeDream-2BW on a two-stage pipeline and without a
pipeline (one process, the same microbatches accumulated: the same global batch, so the same gradient as
PipeDream-Flush), from the same initial weights and the same batches, for several seeds and learning rates; the
head untied from the token embedding, as the paper's implementation keeps it. Each run reports its per-step
training loss and, after the last step, its loss on held-out text (``--eval-batches``: the corpus's last 10 %,
never trained on). The chapter "PipeDream-2BW" reads the table (``distperf.analysis.twobw``).

Writes ``data/reference/<machine>/twobw_convergence_long.csv`` (one row per run, with provenance), resuming
where an earlier call stopped. At scale cpu it took 1 h 37 min on two cores (part of it alongside other work): longer
than the book's whole build is allowed, hence archived. Exit status 0 when every run succeeded, 1 when some failed, 2 on bad input.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from distperf import results  # noqa: E402
from distperf.config import ConfigError  # noqa: E402

NAME = "twobw_convergence_long"
LOSS_WINDOW = 20  # the archived table keeps the training loss as means over windows of this many steps
# model flags, microbatch size b, microbatches m, steps, seeds, learning rates, held-out batches
GRIDS = {
    "smoke": dict(model=dict(model="tiny"), b=2, m=2, steps=20, seeds=[0, 1], lrs=[1e-3], eval_batches=2),
    "cpu": dict(model=dict(model="tiny", layers=4, hidden=64, seq=64), b=4, m=4, steps=2000, seeds=[0, 1, 2, 3, 4],
                lrs=[1e-3, 3e-3], eval_batches=32),
}


def experiment(scale: str, device: str) -> dict:
    """The study as an experiment dictionary (:func:`distperf.runner.grid.Experiment.from_dict`)."""
    g = GRIDS[scale]
    return {
        "name": NAME,
        "command": "run",
        "timeout": 3600,
        "repeats": 1,  # the seeds are the replication
        "env": {"OMP_NUM_THREADS": 1},
        "base": dict(g["model"], untied=True, data="text", steps=g["steps"], microbatches=g["m"],
                     **{"micro-batch": g["b"], "eval-batches": g["eval_batches"]}, device=device, measure=False,
                     hardware="none"),
        # pp 2 runs PipeDream-2BW; pp 1 trains the same batches without a pipeline
        "grid": {"lr": g["lrs"], "seed": g["seeds"], "pp": [1, 2], "schedule": ["none", "2bw"]},
        "exclude": [{"pp": 1, "schedule": "2bw"}, {"pp": 2, "schedule": "none"}],
        "description": "PipeDream-2BW against training without a pipeline: final held-out loss, paired by seed",
    }


def compact(path: Path, window: int = LOSS_WINDOW) -> None:
    """Keep the archived table small: each run's per-step training losses and step times
    (``iteration_time_s.steps``) become their means over windows of ``window`` steps (column ``loss_window``;
    the held-out loss and the time statistics are untouched). Runs already compacted stay as they are."""
    import json

    import pandas as pd

    def means(values: list) -> str:
        return json.dumps([round(sum(values[k:k + window]) / len(values[k:k + window]), 5)
                           for k in range(0, len(values), window)])

    table = pd.read_csv(path)
    if "loss_window" not in table:
        table["loss_window"] = float("nan")
    for i, row in table.iterrows():
        if row["status"] != "ok":
            continue
        if row["loss_window"] != row["loss_window"]:
            table.loc[i, "losses"] = means(json.loads(row["losses"]))
            table.loc[i, "loss_window"] = window
        steps = row.get("iteration_time_s.steps")
        if isinstance(steps, str) and len(json.loads(steps)) > len(json.loads(table.loc[i, "losses"])):
            table.loc[i, "iteration_time_s.steps"] = means(json.loads(steps))
    results.write_csv_atomic(table, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", default="cpu", choices=sorted(GRIDS))
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--out", type=Path, help="the table to write (default data/reference/<machine>/" + NAME + ".csv)")
    p.add_argument("--dry-run", action="store_true", help="print the grid and the table it would write")
    args = p.parse_args(argv)
    from distperf.runner.grid import Experiment
    from distperf.runner.sweep import sweep

    out = args.out or results.DATA / "reference" / results.machine_slug(args.device) / f"{NAME}.csv"
    try:
        exp = Experiment.from_dict({"scale": args.scale, **experiment(args.scale, args.device)}, workdir=ROOT)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        for cfg in exp.configurations:
            print(" ".join(cfg.flags()))
        print(f"-> {out}")
        return 0
    counts = sweep(exp, out, device=args.device, progress=True, scale=args.scale)
    compact(out)
    print(f"{NAME}: {counts} -> {out}")
    return 1 if any(counts.get(status) for status in ("failed", "timeout", "oom")) else 0


if __name__ == "__main__":
    sys.exit(main())
