"""Measure what a GPU adds to the book, in one run of at most ten minutes, and commit-ready reference data.

    python scripts/gpu_reference.py                  # on a machine with a CUDA device (`make gpu-reference`)
    python scripts/gpu_reference.py --dry-run        # print the plan
    python scripts/gpu_reference.py --device cpu --scale smoke --reference /tmp/ref   # the same steps, here

Steps (the first three experiment notebooks run with papermill at ``--scale``, default gpu, on ``--device``; each
step with its own time limit, so that one slow step cannot eat the others', plus what the steps before it left):

1. ``calibration``: the device's matrix rates, layer and whole-model times and its collectives: its hardware
   profile. Its collectives need two devices (``distperf calibrate`` refuses fewer), so with one GPU the step
   is skipped and said so;
2. ``layer_timing``: per-layer time against FLOPs, the cost model's compute error on this device;
3. ``memory_anatomy``: single-device memory by category against the cost model;
4. ``gpu_step_time``: whole training steps on one device (:data:`STEP_TIME`, a sweep of ``distperf run`` with
   ``--hardware`` the device's preset, three repeats): measured iteration time and memory beside the preset's
   prediction, the measurement the chapter "Against published step times" predicts with its fitted constants;
5. ``gpu_step_profile``: the same configurations once more, each step's wall time beside the time its device was
   busy (:mod:`distperf.measure.device_busy`, torch's profiler): how much of a step the device waits on the host.

Multi-rank runs are left out: NCCL refuses two ranks on one GPU, and gloo would measure the host, not the GPU.

Then every table the steps wrote (``data/fresh/<scale>/*.csv`` newer than the run's start) is published to
``data/reference/<machine>/`` with this device's rows only — each row keeps its provenance (machine, device,
torch, python, commit, date) and scale — together with the device's ``hardware.json`` and the executed notebooks,
in the canonical archive's form (gzipped tables and a ``MANIFEST.json``, :mod:`distperf.reference`); the chapters
show those rows beside the fresh ones. A step that fails or runs out of time is reported and publishes nothing of
its own.
Exit status: 0 when every step ran, 1 when some failed, 2 on bad input.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from distperf import results  # noqa: E402
from distperf.config import ConfigError  # noqa: E402

# (step, seconds, devices it needs on CUDA): under the 10 minutes a lent GPU gives one command. A step skipped, or
# done early, leaves its time to the next: on one H200 (2026-12-04) layer_timing took 63 s, memory_anatomy 77 s,
# and gpu_step_time's 48 runs about 350 s (210 s, then 136 s in a second run that resumed the table)
STEPS = [("calibration", 150, 2), ("layer_timing", 80, 1), ("memory_anatomy", 90, 1), ("gpu_step_time", 200, 1),
         ("gpu_step_profile", 50, 1)]
NOTEBOOK_STEPS = ("calibration", "layer_timing", "memory_anatomy")
CUDA_ONLY = ("gpu_step_profile",)  # device time exists only on a device: skipped on a CPU

# One device's training steps: each model at microbatch 1 and 8, fp32 and mixed precision, with and without full
# recomputation, one microbatch per step; timed over `steps` after `warmup`, three repeats in fresh processes.
STEP_PRECISIONS, STEP_RECOMPUTE = ("fp32", "mixed"), ("none", "full")
STEP_TIME = {
    "smoke": dict(model=["tiny"], micro_batch=[1, 2], steps=3, warmup=1, hardware="H200"),
    "cpu": dict(model=["tiny"], micro_batch=[1, 2], steps=3, warmup=1, hardware="H200"),
    "gpu": dict(model=["gpt2", "gpt2-medium"], micro_batch=[1, 8], steps=10, warmup=3, hardware="H200"),
}


def step_time_experiment(scale: str, device: str) -> dict:
    """The ``gpu_step_time`` sweep as an experiment dictionary (:func:`distperf.runner.sweep.run_experiment`)."""
    g = STEP_TIME[scale]
    return {"name": "gpu_step_time", "command": "run", "timeout": 120, "repeats": 3,
            "base": {"microbatches": 1, "steps": g["steps"], "warmup": g["warmup"], "device": device,
                     "hardware": g["hardware"]},
            "grid": {"model": g["model"], "micro-batch": g["micro_batch"], "precision": list(STEP_PRECISIONS),
                     "recompute": list(STEP_RECOMPUTE)}}


def plan(scale: str, device: str) -> list[list[str]]:
    out = ROOT / "_build" / "executed" / f"{scale}-{device}"
    notebooks = [[sys.executable, "-m", "papermill", "--engine", "distperf", "--kernel", "python3", "--cwd", "notebooks",
                  "-p", "scale", scale, "-p", "device", device, f"notebooks/{name}.ipynb", str(out / f"{name}.ipynb")]
                 for name in NOTEBOOK_STEPS]
    return notebooks + [[sys.executable, str(Path(__file__).resolve()), flag, "--scale", scale, "--device", device]
                        for flag in ("--step-time", "--step-profile")]


def step_profile(scale: str) -> Path:
    """The ``gpu_step_profile`` table: each configuration of :data:`STEP_TIME` at ``scale`` profiled on this CUDA
    device (:func:`distperf.measure.device_busy.step_profile`), one row each with provenance, written atomically after
    each configuration (a step stopped at its limit keeps what it measured)."""
    import itertools

    import pandas as pd

    from distperf.config import Config, Layout, Training
    from distperf.measure.device_busy import step_profile as profile
    from distperf.presets import model

    g, prov, rows = STEP_TIME[scale], results.provenance(results.resolve_device("cuda")), []
    out = results.fresh_dir(scale) / "gpu_step_profile.csv"
    for name, b, precision, recompute in itertools.product(g["model"], g["micro_batch"], STEP_PRECISIONS,
                                                            STEP_RECOMPUTE):
        cfg = Config(model=model(name), layout=Layout(micro_batch=b, microbatches=1, recompute=recompute),
                     training=Training(precision=precision))
        rows.append({"model": name, "micro_batch": b, "precision": precision, "recompute": recompute,
                     **profile(cfg, warmup=g["warmup"]), "scale": scale, **prov})
        results.write_csv_atomic(pd.DataFrame(rows), out)
        print(f"{name} b={b} {precision} {recompute}: busy {rows[-1]['busy_fraction']:.0%} of "
              f"{rows[-1]['wall_s'] * 1e3:.1f} ms", flush=True)
    return out


def run_step(cmd: list[str], limit_s: float) -> str | None:
    """Run one step in its own process group; None when it succeeded, else why it did not."""
    if cmd[-1].endswith(".ipynb"):
        Path(cmd[-1]).parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True)
    try:
        return None if proc.wait(timeout=limit_s) == 0 else f"exit status {proc.returncode}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        return f"ran past its {limit_s:.0f} s"


def publish(fresh: Path, reference: Path, machine: str, since: float, scale: str = "gpu",
            executed: Path | None = None) -> list[Path]:
    """Archive the tables written in ``fresh`` after ``since``, keeping the rows of ``machine``, to
    ``reference/<machine>/`` in the form of the canonical archive (:func:`distperf.reference.archive`: gzipped
    tables, ``MANIFEST.json``, the executed notebooks of ``executed``); every table must carry the provenance
    columns. ``hardware.json`` goes along when it is new. Returns the files written, none when no table was."""
    import tempfile

    import pandas as pd

    from distperf import reference as archive_module

    target = reference / machine
    with tempfile.TemporaryDirectory() as staging:
        staged = Path(staging)
        for path in sorted(fresh.glob("*.csv")):
            if path.stat().st_mtime < since:
                continue
            table = pd.read_csv(path)
            missing = [c for c in results.PROVENANCE_COLUMNS if c not in table.columns]
            if missing:
                raise ConfigError(f"{path.name}", f"a reference table carries its provenance; missing {missing}")
            mine = table[table.machine == machine]
            if len(mine):
                results.write_csv_atomic(mine, staged / path.name)
        if not any(staged.glob("*.csv")):
            return []
        profile = fresh / "hardware.json"
        if profile.exists() and profile.stat().st_mtime >= since:
            shutil.copyfile(profile, staged / "hardware.json")
        manifest = archive_module.archive(staged, target, scale, executed)
    return sorted([target / name for name in manifest["tables"]] + [target / name for name in manifest["profiles"]]
                  + [target / archive_module.MANIFEST])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--scale", default="gpu", choices=results.SCALES)
    parser.add_argument("--reference", type=Path, default=results.DATA / "reference",
                        help="where to publish (default data/reference)")
    parser.add_argument("--dry-run", action="store_true", help="print the steps and exit")
    parser.add_argument("--step-time", action="store_true", help="run only the gpu_step_time sweep (its step)")
    parser.add_argument("--step-profile", action="store_true", help="run only the gpu_step_profile step")
    args = parser.parse_args(argv)
    if args.step_profile:
        try:
            step_profile(args.scale)
        except ValueError as err:
            print(f"gpu_reference: {err}", file=sys.stderr)
            return 2
        return 0
    if args.step_time:
        from distperf.runner.sweep import run_experiment

        try:
            device = results.resolve_device(args.device)
            run_experiment(step_time_experiment(args.scale, device), args.scale, device, progress=False)
        except (ConfigError, ValueError) as err:
            print(f"gpu_reference: {err}", file=sys.stderr)
            return 2
        return 0
    if args.dry_run:
        for (name, limit, need), cmd in zip(STEPS, plan(args.scale, args.device)):
            print(f"[{limit:>3d} s, {need} device(s) on cuda] {' '.join(cmd)}")
        return 0
    try:
        device = results.resolve_device(args.device)
    except ValueError as err:
        print(f"gpu_reference: {err}", file=sys.stderr)
        return 2
    import torch

    machine = results.machine_slug(device)
    start = time.time()
    failed = []
    devices = torch.cuda.device_count() if device == "cuda" else None
    spare = 0.0  # what skipped and early-finished steps left of their limits: the next step may use it
    for (name, limit, need), cmd in zip(STEPS, plan(args.scale, device)):
        if devices is not None and devices < need:
            print(f"{name}: skipped, it needs {need} CUDA devices and {devices} is visible", flush=True)
            spare += limit
            continue
        if devices is None and name in CUDA_ONLY:
            print(f"{name}: skipped, it needs a CUDA device", flush=True)
            continue
        t0 = time.time()
        why = run_step(cmd, limit + spare)
        spare = max(limit + spare - (time.time() - t0), 0.0)
        print(f"{name}: {'ok' if why is None else 'FAILED, ' + why} ({time.time() - t0:.0f} s)", flush=True)
        if why:
            failed.append(name)
    try:
        written = publish(results.fresh_dir(args.scale), args.reference, machine, start, args.scale,
                          ROOT / "_build" / "executed" / f"{args.scale}-{device}")
    except ConfigError as err:
        print(f"gpu_reference: {err}", file=sys.stderr)
        return 2
    print(json.dumps({"machine": machine, "failed": failed, "written": [str(p) for p in written],
                      "seconds": round(time.time() - start)}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
