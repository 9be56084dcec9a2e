"""``python -m distperf sweep EXPERIMENT.yaml``: run a grid of configurations, resumably.

The experiment file is described in :mod:`distperf.runner.grid`; each configuration runs ``--repeats`` times
(default: the file's ``repeats``, else 3 for ``run`` at scale cpu or gpu and 1 otherwise), each repeat in fresh
processes with a timeout, and each repeat becomes one row of ``data/fresh/<scale>/<experiment>.csv`` (or
``--out``) with its ``repeat``, its status (ok, failed, timeout, oom), its message, its flattened JSON result and
provenance (:mod:`distperf.runner.sweep`). ``run`` configurations of one repeat round run many to a launch
(:mod:`distperf.runner.batch`; ``--one-per-process`` starts ``distperf run`` for each instead). Rows already
``ok`` with the same configuration hash and repeat are skipped unless ``--force``. Interrupting (Ctrl-C) keeps the rows done so far; run the same command again to
go on. With ``--network SPEC`` (or ``network:`` in the file) the runs use an emulated cluster
(:mod:`distperf.emulation`); without root their rows are ``skipped``, with the reason. Exit status: 0
when every configuration is ok or skipped, 1 when some failed, 2 on bad input, 130 when interrupted.
"""
from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("experiment", metavar="EXPERIMENT.yaml", help="the experiment: base flags, grid, exclude")
    p.add_argument("--force", action="store_true", help="run every configuration again, even those done")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds per configuration (default: the file's timeout, else 600)")
    p.add_argument("--out", default=None, help="the CSV to write (default data/fresh/<scale>/<experiment>.csv)")
    p.add_argument("--scale", default=None, help="smoke, cpu or gpu (default: the file's scale, else $DISTPERF_SCALE "
                                                 "or cpu)")
    p.add_argument("--repeats", type=int, default=None,
                   help="independent repeats of each configuration, each in fresh processes (default: the file's "
                        "repeats, else 3 for run at scale cpu or gpu, 1 otherwise)")
    p.add_argument("--one-per-process", action="store_true",
                   help="start distperf run for each configuration instead of running many to a launch")
    p.add_argument("--list", action="store_true", help="print the configurations and whether each is done; run nothing")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--network", default=None, metavar="SPEC",
                   help="run every configuration that sets no network of its own on an emulated cluster "
                        "(run's --network; needs root, else the rows are written as skipped with the reason)")


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(args: argparse.Namespace) -> int:
    from ..config import ConfigError
    from ..results import book_scale, check_scale, fresh_dir
    from ..runner.grid import load
    from ..runner.sweep import sweep

    exp = load(args.experiment)
    if args.network:
        from ..runner.grid import with_network

        exp = with_network(exp, args.network)
    if args.timeout is not None and not args.timeout > 0:
        raise ConfigError("timeout", f"must be a positive number of seconds, got {args.timeout}")
    if args.repeats is not None:
        from ..runner.grid import check_repeats

        check_repeats(args.repeats)
    try:
        scale = check_scale(args.scale or exp.scale or book_scale())
    except ValueError as e:
        raise ConfigError("scale", str(e).split(": ", 1)[-1]) from None
    out = Path(args.out) if args.out else fresh_dir(scale) / f"{exp.name}.csv"
    repeats = args.repeats or exp.repeats_at(scale)
    if args.list:
        return _list(exp, out, repeats)
    # A polite stop (SIGTERM, or SIGINT — which a shell leaves ignored for background jobs, and Python
    # then never turns into KeyboardInterrupt) leaves the table as it is.
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        counts = sweep(exp, out, timeout=args.timeout, force=args.force, progress=not args.no_progress,
                       repeats=repeats, batch=not args.one_per_process)
    except KeyboardInterrupt:
        print(f"distperf sweep: interrupted; the rows done so far are in {out}; run the same command to go on",
              file=sys.stderr)
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    ran = {k: v for k, v in counts.items() if v and k != "done"}
    summary = ", ".join(f"{v} {k}" for k, v in ran.items()) or "nothing to run"
    print(f"{exp.name}: {summary}; {counts['done']} already done; table: {out}")
    return 0 if not any(counts[s] for s in ("failed", "timeout", "oom")) else 1


def _list(exp, out: Path, repeats: int) -> int:
    from ..results import machine_slug
    from ..runner.resume import done_keys, read_rows
    from ..runner.sweep import device_of

    done = done_keys(read_rows(out), machine_slug(device_of(exp)))
    for cfg in exp.configurations:
        states = ["done" if (cfg.hash, r) in done else ("invalid" if cfg.invalid else "todo") for r in range(repeats)]
        state = states[0] if len(set(states)) == 1 else f"{states.count('done')}/{repeats} done"
        print(f"{cfg.hash}  {state:9}  {cfg.label(exp.varying)}")
    print(f"{len(exp.configurations)} configurations, {repeats} repeat(s) each; table: {out}")
    return 0
