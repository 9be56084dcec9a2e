"""The reference dataset: one build's results, archived in the repository so that a figure can be cited.

``data/reference/<machine>/`` holds what a build of the study measured on ``<machine>`` (this project's canonical
one: the 2-core CPU machine at scale ``cpu``; a GPU machine's beside it): every table its notebooks wrote, gzipped
without a timestamp (``<experiment>.csv.gz``, so that the same table always gives the same bytes), the hardware
profiles they calibrated (``*.json``), and ``MANIFEST.json``:

- ``machine``, ``device_name``, ``scale``: where and at which scale the tables were measured;
- ``archived_at``, ``archived_commit``, ``torch``, ``python``: when and from which commit they were archived;
- ``tables``: per file its ``sha256`` (of the uncompressed CSV: the content, whatever the compression), ``short``
  (its first 12 hex digits, which the book's captions print), ``rows``, and from its rows' provenance the
  ``commits`` and the ``first``/``last`` dates of measurement;
- ``profiles``: per hardware profile its ``sha256``;
- ``notebooks``: per executed experiment notebook (``notebooks/<name>.ipynb``, what measured the tables, published
  by a reader's build) its ``sha256`` and whether papermill recorded its end (``finished``: a notebook whose run
  was stopped after its last cell had completed is kept, with ``finished`` false);
- ``verdicts``, ``verdicts_commit``: per verdict record of the chapters (``verdicts/verdict-<chapter>.json``, what
  :mod:`distperf.analysis.findings` reads) its ``sha256``, and the commit whose code computed them from these
  tables (:func:`archive_verdicts`); a fresh build's landing page sets its own verdicts beside them.

:func:`archive` writes it (``make reference``); :func:`check` verifies a directory against its manifest (a test
does, for every committed one). A reader's build (``make book FROM=reference``, :func:`distperf.results.load`)
reads the archived tables in place of fresh ones and measures nothing.
"""
from __future__ import annotations

import datetime as _dt
import gzip
import hashlib
import io
import json
from pathlib import Path

from . import atomic

MANIFEST = "MANIFEST.json"
SHORT = 12


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_table_bytes(path: Path) -> bytes:
    """The CSV bytes of a table, ``.csv`` or ``.csv.gz``."""
    path = Path(path)
    data = path.read_bytes()
    return gzip.decompress(data) if path.suffix == ".gz" else data


def write_gzip(data: bytes, path: Path) -> None:
    """``data`` gzipped to ``path`` with no name and a zero timestamp (the same bytes on every run), atomically."""
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=9) as f:
        f.write(data)
    atomic.write_bytes(path, buffer.getvalue())


def table_entry(data: bytes, with_machines: bool = False):
    """The manifest's entry of one table (its CSV bytes): hash, rows, and the commits and dates of its rows; with
    ``with_machines``, also ``{"machine": {...}, "device_name": {...}}``, the values its rows name."""
    import pandas as pd

    frame = pd.read_csv(io.BytesIO(data), low_memory=False)
    seen = {c: {str(v) for v in frame[c].dropna()} if c in frame else set() for c in ("machine", "device_name")}
    digest = sha256(data)
    entry = {"sha256": digest, "short": digest[:SHORT], "rows": int(len(frame))}
    if "commit" in frame:
        entry["commits"] = sorted({str(c) for c in frame["commit"].dropna()})
    if "date" in frame and frame["date"].notna().any():
        dates = sorted(str(d) for d in frame["date"].dropna())
        entry.update(first=dates[0], last=dates[-1])
    return (entry, seen) if with_machines else entry


def archive(source: Path, dest: Path, scale: str, executed: Path | None = None) -> dict:
    """Copy every table (``*.csv``) and hardware profile (``*.json``) of ``source`` (a build's
    ``data/fresh/<scale>``) into ``dest``, the tables gzipped, and the executed notebooks of ``executed`` (papermill's
    ``_build/executed/<scale>-<device>``) into ``dest/notebooks``; write and return the manifest. Tables already in
    ``dest`` that ``source`` lacks (an archived long study) stay, and stay in the manifest."""
    source, dest = Path(source), Path(dest)
    tables = sorted(source.glob("*.csv"))
    if not tables:
        raise FileNotFoundError(f"{source}: no table to archive; build the book at scale {scale} first")
    dest.mkdir(parents=True, exist_ok=True)
    for path in tables:
        write_gzip(path.read_bytes(), dest / f"{path.name}.gz")
    for path in sorted(source.glob("*.json")):
        atomic.write_bytes(dest / path.name, path.read_bytes())
    if executed is not None and Path(executed).is_dir():
        (dest / "notebooks").mkdir(exist_ok=True)
        for path in sorted(Path(executed).glob("*.ipynb")):
            name = path.name.replace(".part.ipynb", ".ipynb")
            if path.name.endswith(".part.ipynb") and (Path(executed) / name).exists():
                continue  # a run in progress beside a finished one
            if path.name.endswith(".part.ipynb") and not _all_cells_ran(path):
                continue
            atomic.write_bytes(dest / "notebooks" / name, path.read_bytes())
    for stale in (dest / VERDICTS).glob("verdict-*.json"):
        stale.unlink()  # computed from the tables just replaced; archive_verdicts adds the new build's
    manifest = describe(dest, scale)
    atomic.write_text(dest / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


VERDICTS = "verdicts"


def archive_verdicts(figures: Path, dest: Path) -> dict:
    """Copy the verdict records (``verdict-<chapter>.json``, :mod:`distperf.analysis.findings`) that a build of the
    book wrote to ``figures`` into ``dest/verdicts/`` and list them in ``dest``'s manifest, with the commit that
    computed them; the rest of the manifest stays as it was. A fresh build's landing page sets its own verdicts
    beside these."""
    from . import results

    figures, dest = Path(figures), Path(dest)
    records = sorted(figures.glob("verdict-*.json"))
    manifest = read_manifest(dest)
    if manifest is None:
        raise FileNotFoundError(f"{dest}: no archived build (no {MANIFEST}) to add verdicts to")
    if not records:
        raise FileNotFoundError(f"{figures}: no verdict record; build the book first")
    for old in (dest / VERDICTS).glob("verdict-*.json"):
        old.unlink()
    for path in records:
        atomic.write_bytes(dest / VERDICTS / path.name, path.read_bytes())
    manifest[VERDICTS] = {p.name: sha256(p.read_bytes()) for p in records}
    manifest["verdicts_commit"] = results.git_commit()
    atomic.write_text(dest / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def describe(directory: Path, scale: str) -> dict:
    """The manifest of ``directory`` as it is now (see the module docstring)."""
    import platform

    import torch

    from . import results

    directory = Path(directory)
    tables, machines, names = {}, set(), set()
    for p in sorted(directory.iterdir()):
        if p.name.endswith((".csv", ".csv.gz")):
            tables[p.name], seen = table_entry(read_table_bytes(p), with_machines=True)
            machines |= seen["machine"]
            names |= seen["device_name"]
    return {
        "machine": directory.name, "device_name": sorted(names)[0] if len(names) == 1 else sorted(names),
        "machines_in_rows": sorted(machines), "scale": scale,
        "archived_at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "archived_commit": results.git_commit(), "torch": torch.__version__, "python": platform.python_version(),
        "tables": tables,
        "profiles": {p.name: sha256(p.read_bytes()) for p in sorted(directory.glob("*.json")) if p.name != MANIFEST},
        "notebooks": {p.name: {"sha256": sha256(p.read_bytes()), "finished": _finished(p)}
                      for p in sorted(directory.glob("notebooks/*.ipynb"))},
    }


def _papermill(path: Path) -> tuple[dict, list[dict]]:
    notebook = json.loads(Path(path).read_text())
    cells = [c.get("metadata", {}).get("papermill", {}) for c in notebook["cells"] if c["cell_type"] == "code"]
    return notebook.get("metadata", {}).get("papermill", {}), cells


def _all_cells_ran(path: Path) -> bool:
    """Whether papermill ran every code cell of the notebook to completion (no cell failed or was left out)."""
    _, cells = _papermill(path)
    return bool(cells) and all(c.get("status") == "completed" for c in cells)


def _finished(path: Path) -> bool:
    """Whether papermill recorded the end of the notebook's run, without an exception."""
    meta, _ = _papermill(path)
    return bool(meta.get("end_time")) and not meta.get("exception")


def read_manifest(directory: Path) -> dict | None:
    path = Path(directory) / MANIFEST
    return json.loads(path.read_text()) if path.exists() else None


def record_table(path: Path) -> None:
    """Where the table ``path`` lies in an archived reference directory (one with a manifest), set its entry there
    (a table an experiment script archives beside a build's: ``scripts/tp_drift.py``,
    ``scripts/breakdown_steps.py``, ``scripts/pipeline_instruments.py``)."""
    path = Path(path)
    manifest = read_manifest(path.parent)
    if manifest is not None:
        manifest["tables"][path.name] = table_entry(read_table_bytes(path))
        atomic.write_text(path.parent / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def two_stage_experiment(name: str, grid: dict, **base) -> dict:
    """The keys of an experiment file (:mod:`distperf.runner.grid`) for the pipeline experiments the chapter "Where
    the time goes" cites: ``distperf run`` of the `small` model on two pipeline stages, micro-batch 2, seven steps of
    which two warm up, one thread per rank as the book's runs, no memory or communication step and no prediction,
    over ``grid``; ``base`` adds to or overrides those flags."""
    return {"name": name, "command": "run", "timeout": 300, "env": {"OMP_NUM_THREADS": 1},
            "base": {"model": "small", "pp": 2, "micro-batch": 2, "steps": 7, "warmup": 2, "device": "cpu",
                     "hardware": "none", "measure": False, **base},
            "grid": grid}


def at_least_two(text: str) -> int:
    """An argparse type: a whole number of runs of at least 2 (a spread needs two)."""
    import argparse

    if not text.isdigit() or int(text) < 2:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 2, got {text!r}")
    return int(text)


def at_least_one(text: str) -> int:
    """An argparse type: a whole number of rounds of at least 1."""
    import argparse

    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return int(text)


def two_rank_rows(script: Path, rounds: int, timeout: float) -> list[dict]:
    """Run ``script --worker --rounds N --rows FILE`` on two ranks launched by torchrun (one thread each) and return
    the JSON rows its rank 0 wrote to FILE; RuntimeError when the launch fails or takes longer than ``timeout``."""
    return worker_rows(script, rounds, timeout)


def worker_rows(script: Path, rounds: int, timeout: float, ranks: int = 2, env: dict | None = None,
                unset: tuple = ()) -> list[dict]:
    """Run ``script --worker --rounds N --rows FILE`` — on ``ranks`` ranks launched by torchrun, or as one plain
    process where ``ranks`` is 1 — with one thread each, ``env`` added to this process's environment and the variables
    ``unset`` taken out of it, and return the JSON rows it (its rank 0) wrote to FILE; RuntimeError when it fails or
    takes longer than ``timeout``."""
    import os
    import subprocess
    import sys
    import tempfile

    lib = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        rows_path = os.path.join(tmp, "rows.jsonl")
        environment = {**{k: v for k, v in os.environ.items() if k not in unset}, "OMP_NUM_THREADS": "1",
                       "PYTHONPATH": os.pathsep.join(filter(None, [str(lib), os.environ.get("PYTHONPATH")])),
                       **(env or {})}
        launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)] if ranks > 1 else []
        command = [sys.executable, *launcher, str(Path(script).resolve()), "--worker", "--rounds", str(rounds),
                   "--rows", rows_path]
        try:
            done = subprocess.run(command, env=environment, timeout=timeout, capture_output=True, text=True)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"the ranks did not finish within {timeout:.0f} s") from None
        if done.returncode != 0:
            raise RuntimeError(f"the ranks failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
        with open(rows_path) as f:
            return [json.loads(line) for line in f if line.strip()]


def rounds_main(script: Path, name: str, description: str, argv: list[str] | None, rounds: int, worker,
                seconds: tuple[float, float], report=None, suffix: str = ".csv", launch=None) -> int:
    """The command line of a reference experiment measured in rounds (``--rounds``, at least 1, default ``rounds``;
    ``--out``, default ``data/reference/<machine>/<name><suffix>``, gzipped where it ends in ``.gz``; ``--force``):
    under ``--worker`` it is one rank's (or process's) part, ``worker(rounds, rows_path)``; else it launches that
    (``launch(script, rounds, timeout)``, by default :func:`two_rank_rows`, with ``seconds`` = (to start, per round)
    giving its timeout), writes the rows with provenance atomically, sets the table's entry in its directory's
    manifest (:func:`record_table`) and prints ``report(table)``. An existing table is kept. Exit status 0 on success,
    1 when the run failed or timed out (2 on bad input, from argparse)."""
    import argparse
    import sys

    import pandas as pd

    from . import results

    p = argparse.ArgumentParser(description=description)
    p.add_argument("--rounds", type=at_least_one, default=rounds, help=f"rounds to measure (default {rounds})")
    p.add_argument("--out", type=Path, help=f"the table to write (default data/reference/<machine>/{name}{suffix})")
    p.add_argument("--force", action="store_true", help="measure again where the table exists")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rows", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.rounds, args.rows)
        return 0
    out = args.out or results.DATA / "reference" / results.machine_slug("cpu") / f"{name}{suffix}"
    if out.exists() and not args.force:
        print(f"{name}: {out} exists (--force measures again)")
        return 0
    try:
        rows = (launch or two_rank_rows)(script, args.rounds, seconds[0] + seconds[1] * args.rounds)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    table = pd.DataFrame(rows).assign(**results.provenance("cpu"))
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".gz":
        write_gzip(table.to_csv(index=False).encode(), out)
    else:
        results.write_csv_atomic(table, out)
    record_table(out)
    print(f"{name}: {args.rounds} rounds -> {out}" + (f"\n{report(table)}" if report else ""))
    return 0


def sweep_experiment(experiment: dict, out: Path | None = None, repeats: int = 1, force: bool = False):
    """Run a reference experiment on this machine's CPU (``experiment``: the keys of an experiment file,
    :func:`distperf.runner.grid.Experiment.from_dict`), ``repeats`` runs of each configuration, into ``out`` (default
    ``data/reference/<machine>/<name>.csv``; an existing table is resumed unless ``force``), and set its entry in that
    directory's manifest (:func:`record_table`). Returns (the sweep's counts by status, the table, its path)."""
    import pandas as pd

    from . import results
    from .runner.grid import Experiment
    from .runner.sweep import sweep

    out = Path(out) if out else results.DATA / "reference" / results.machine_slug("cpu") / f"{experiment['name']}.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    counts = sweep(Experiment.from_dict(experiment, workdir=out.parent), out, force=force, device="cpu",
                   progress=False, repeats=repeats)
    record_table(out)
    return counts, pd.read_csv(out, low_memory=False), out


def experiment_main(experiment: dict, description: str, argv: list[str] | None, repeats: int, report) -> int:
    """The command line of a reference experiment script (``--repeats``, at least 2, default ``repeats``; ``--out``;
    ``--force``): runs it (:func:`sweep_experiment`), prints its counts and ``report(table)``. Exit status 0 on
    success, 1 when a run failed (2 on bad input, from argparse)."""
    import argparse

    name = experiment["name"]
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--repeats", type=at_least_two, default=repeats, help=f"runs of each configuration (default "
                                                                         f"{repeats})")
    p.add_argument("--out", type=Path, help=f"the table to write (default data/reference/<machine>/{name}.csv)")
    p.add_argument("--force", action="store_true", help="measure every run again where the table exists")
    args = p.parse_args(argv)
    counts, table, out = sweep_experiment(experiment, args.out, args.repeats, args.force)
    print(f"{name}: {counts} -> {out}")
    print(report(table))
    return 1 if any(n for status, n in counts.items() if status not in ("ok", "done")) else 0


def check(directory: Path) -> list[str]:
    """What differs between ``directory`` and its manifest: a table or profile missing, unlisted, or whose
    content hash or row count changed. Empty when they agree (or when there is no manifest)."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    if manifest is None:
        return []
    problems = []
    present = {p.name for p in directory.iterdir() if p.name.endswith((".csv", ".csv.gz"))}
    for name, entry in manifest["tables"].items():
        if name not in present:
            problems.append(f"{name}: listed in the manifest, missing")
            continue
        data = read_table_bytes(directory / name)
        if sha256(data) != entry["sha256"]:
            problems.append(f"{name}: content differs from the manifest's sha256")
    problems += [f"{name}: not in the manifest" for name in sorted(present - set(manifest["tables"]))]
    for name, digest in manifest.get("profiles", {}).items():
        path = directory / name
        if not path.exists() or sha256(path.read_bytes()) != digest:
            problems.append(f"{name}: profile missing or changed")
    for name, entry in manifest.get("notebooks", {}).items():
        path = directory / "notebooks" / name
        if not path.exists() or sha256(path.read_bytes()) != entry["sha256"]:
            problems.append(f"notebooks/{name}: missing or changed")
    listed = manifest.get(VERDICTS, {})
    for name, digest in listed.items():
        path = directory / VERDICTS / name
        if not path.exists() or sha256(path.read_bytes()) != digest:
            problems.append(f"{VERDICTS}/{name}: missing or changed")
    problems += [f"{VERDICTS}/{p.name}: not in the manifest" for p in sorted((directory / VERDICTS).glob("*.json"))
                 if p.name not in listed]
    return problems


def builds() -> dict[str, dict]:
    """{machine: manifest} of every archived build in ``data/reference/``."""
    from .results import DATA

    out = {}
    for directory in sorted((DATA / "reference").iterdir()) if (DATA / "reference").exists() else []:
        manifest = read_manifest(directory) if directory.is_dir() else None
        if manifest:
            out[directory.name] = manifest
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m distperf.reference --scale cpu``: archive this machine's fresh results at that scale to
    ``data/reference/<machine>/`` (``make reference``); ``--check``: verify every archived build instead."""
    import argparse
    import sys

    from . import results

    p = argparse.ArgumentParser(prog="python -m distperf.reference", description=main.__doc__.splitlines()[0])
    p.add_argument("--scale", default="cpu", choices=results.SCALES)
    p.add_argument("--executed", type=Path, default=None,
                   help="the executed experiment notebooks to archive beside the tables (default "
                        "_build/executed/<scale>-auto)")
    p.add_argument("--verdicts", type=Path, default=None, metavar="FIGURES",
                   help="also archive the verdict records a build of the book wrote to FIGURES")
    p.add_argument("--verdicts-only", action="store_true",
                   help="archive only the verdict records of --verdicts (say, a reader's build), tables untouched")
    p.add_argument("--check", action="store_true", help="verify every archived build against its manifest")
    a = p.parse_args(argv)
    if a.check:
        problems = [f"{m}: {x}" for m in builds() for x in check(results.DATA / "reference" / m)]
        print("\n".join(problems) or f"{len(builds())} archived build(s) agree with their manifests")
        return 1 if problems else 0
    if a.verdicts_only and a.verdicts is None:
        p.error("--verdicts-only: needs --verdicts FIGURES")
    source = results.fresh_dir(a.scale)
    dest = results.DATA / "reference" / results.machine_slug("cpu")
    try:
        manifest = read_manifest(dest) if a.verdicts_only else \
            archive(source, dest, a.scale, a.executed or results.ROOT / "_build" / "executed" / f"{a.scale}-auto")
        if a.verdicts is not None:
            manifest = archive_verdicts(a.verdicts, dest)
    except FileNotFoundError as e:
        print(f"python -m distperf.reference: error: {e}", file=sys.stderr)
        return 2
    size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    print(f"{len(manifest['tables'])} tables, {len(manifest['profiles'])} profiles, {len(manifest['notebooks'])} "
          f"executed notebooks and {len(manifest.get(VERDICTS, {}))} verdict records archived in "
          f"{dest.relative_to(results.ROOT)} ({size / 1e3:,.0f} kB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
