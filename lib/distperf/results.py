"""Where results live, and how they are written: tidy CSV tables with provenance, written atomically.

- ``data/fresh/<scale>/<experiment>.csv``: measurements of the machine that builds the book (git-ignored);
- ``data/reference/<machine>/<experiment>.csv[.gz]``: committed results, each row with its provenance; a directory
  with a ``MANIFEST.json`` is an archived build (:mod:`distperf.reference`); see ``data/README.md``.

A book is built from its *own* data (:func:`book_dir`): this machine's fresh tables (``make book``), or, in a
reader's build (``make book FROM=reference``, ``DISTPERF_FROM=reference``), the archived build at the book's scale,
read in their place (``source`` is then still ``fresh``: the data the book is built from; its captions name the
archive and its tables' hashes, :func:`table_digest`).

The *long studies* (:data:`LONG_STUDIES`: experiment notebooks that would take a fresh build at scale ``cpu`` past
30 minutes) are measured only when ``$DISTPERF_LONG`` is ``measure`` (``make book LONG=measure``); a fresh build at
``cpu`` leaves them out by default (``make book`` sets ``archive``) and reads their tables and profiles from the
archive (:func:`study_dir`), and their chapters say so (:func:`read_archive_for`).
"""
from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from functools import lru_cache
from pathlib import Path

from . import atomic

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data"
SCALES = ("smoke", "cpu", "gpu")
PROVENANCE_COLUMNS = ("machine", "device_name", "torch", "python", "commit", "date")


def check_scale(scale: str) -> str:
    if scale not in SCALES:
        raise ValueError(f"scale: must be one of {', '.join(SCALES)}, got {scale!r}")
    return scale


def fresh_dir(scale: str) -> Path:
    return DATA / "fresh" / check_scale(scale)


def book_scale() -> str:
    """The scale a book build shows: $DISTPERF_SCALE (set by the Makefile), else cpu."""
    return check_scale(os.environ.get("DISTPERF_SCALE", "cpu"))


FROM = ("fresh", "reference")
CANONICAL = "cpu-2c"  # the archived build a reader's build reads unless $DISTPERF_REFERENCE names another


def book_from() -> str:
    """Where a book build's own data comes from: $DISTPERF_FROM (``fresh``, the default, or ``reference``)."""
    value = os.environ.get("DISTPERF_FROM", "fresh") or "fresh"
    if value not in FROM:
        raise ValueError(f"DISTPERF_FROM: must be one of {', '.join(FROM)}, got {value!r}")
    return value


# Experiment notebook -> the tables it writes, for each long study (a test checks them against the notebooks).
LONG_STUDIES = {
    "dp_zero": ("dp_bucket", "dp_waiting", "dp_zero"),
    "network": ("network_bucket", "network_placement", "network_pp_vs_dp"),
    "planner": ("planner",),
    "time_breakdown": ("regimes",),
    "twobw": ("twobw_convergence", "twobw_engines", "twobw_simulation"),
}
LONG = ("measure", "archive")


def long_mode() -> str:
    """Whether this build measures the long studies or reads them from the archive: $DISTPERF_LONG (``measure``,
    the default outside ``make``, or ``archive``)."""
    value = os.environ.get("DISTPERF_LONG", "measure") or "measure"
    if value not in LONG:
        raise ValueError(f"DISTPERF_LONG: must be one of {', '.join(LONG)}, got {value!r}")
    return value


def study_archived(study: str | None) -> bool:
    """Whether this fresh build reads the long study ``study`` (a notebook's name; None: none) from the archive."""
    return study in LONG_STUDIES and book_from() == "fresh" and long_mode() == "archive"


def study_of(experiment: str) -> str | None:
    """The long study whose notebook writes ``experiment``, or None."""
    return next((s for s, names in LONG_STUDIES.items() if experiment in names), None)


def study_dir(study: str | None, scale: str | None = None) -> Path:
    """Where the tables and profiles of the notebook ``study`` are in this build: the archive when the build reads
    that long study from it (:func:`study_archived`), else :func:`book_dir` (also for None: no long study)."""
    scale = scale or book_scale()
    return archive_dir(scale) if study_archived(study) else book_dir(scale)


def read_archive_for(study: str, scale: str | None = None) -> str:
    """For a chapter that rests on the long study ``study``: when this build reads it from the archive, make this
    process (the chapter's kernel) read *all* its data from the archive, as a reader's build does, so that every
    prediction uses the profile of the machine and run that measured it. Return a sentence that says where the
    chapter's measurements come from."""
    scale = scale or book_scale()
    if book_from() == "reference":
        return (f"This chapter's measurements come from the reference build archived in "
                f"data/reference/{book_dir(scale).name}/ (a reader's build measures nothing).")
    if not study_archived(study):
        return "This chapter's measurements were made by this build."
    directory = archive_dir(scale)
    os.environ["DISTPERF_FROM"] = "reference"
    return (f"This chapter's measurements come from the reference build archived in data/reference/{directory.name}/, "
            f"not from this build: its experiments ({', '.join(LONG_STUDIES[study])}) are a long study, left out of "
            f"a default build to keep it under 30 minutes (make book LONG=measure measures them on this machine).")


def archive_dir(scale: str) -> Path:
    """The archived build a reader's build at ``scale`` reads: ``data/reference/$DISTPERF_REFERENCE`` (default
    :data:`CANONICAL`), which must hold a manifest of that scale."""
    from .reference import read_manifest

    machine = os.environ.get("DISTPERF_REFERENCE") or CANONICAL
    directory = DATA / "reference" / machine
    manifest = read_manifest(directory)
    if manifest is None or manifest.get("scale") != scale:
        found = manifest.get("scale") if manifest else "no archived build"
        raise FileNotFoundError(f"{directory}: a reader's build at scale {scale} needs an archived build of that "
                                f"scale there (found: {found}); `make reference SCALE={scale}` writes one")
    return directory


def book_dir(scale: str | None = None) -> Path:
    """The directory of the book's own data at ``scale``: fresh, or the archive in a reader's build."""
    scale = scale or book_scale()
    return archive_dir(scale) if book_from() == "reference" else fresh_dir(scale)


def table_path(directory: Path, experiment: str) -> Path | None:
    """``<experiment>.csv`` or ``.csv.gz`` in ``directory``, whichever exists."""
    for name in (f"{experiment}.csv", f"{experiment}.csv.gz"):
        if (directory / name).exists():
            return directory / name
    return None


def archived_builds() -> set[Path]:
    """The directories of ``data/reference/`` that hold an archived build (a manifest)."""
    return {p.parent for p in (DATA / "reference").glob("*/MANIFEST.json")}


def git_commit() -> str:
    """Short commit of the working tree, with '+dirty' when it has uncommitted changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    return cpu_name()


def machine_slug(device: str) -> str:
    """A short, path-safe name for the machine: 'cpu-2c' or the GPU's name, e.g. 'nvidia-h200'."""
    if device.startswith("cuda"):
        return "".join(c if c.isalnum() else "-" for c in device_name(device).lower()).strip("-")
    return f"cpu-{os.cpu_count()}c"


def provenance(device: str) -> dict:
    import torch

    return {
        "machine": machine_slug(device),
        "device_name": device_name(device),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "commit": git_commit(),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def resolve_device(device: str) -> str:
    """'auto' → 'cuda' when a GPU is visible, else 'cpu'; 'cuda' without a GPU is an error. 'cpu' imports no torch
    (a launching process never needs it)."""
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device: must be auto, cpu or cuda, got {device!r}")
    if device == "cpu":
        return device
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: cuda was asked for but no CUDA device is visible")
    return device


def write_csv_atomic(frame, path: Path) -> Path:
    """Write a DataFrame to ``path`` through a temporary file and a rename: readers never see half a file."""
    with atomic.replacing(path) as tmp:
        frame.to_csv(tmp, index=False)
    return Path(path)


def load(experiment: str, scale: str | None = None, archived: bool = False):
    """The book's own results at ``scale`` (:func:`book_dir`) and the committed reference tables, in one DataFrame.

    A column ``source`` says 'fresh' (the book's own data) or 'reference'. A missing table of the book's own is an
    error that says how to produce it. Reference tables are those of other machines: committed tables (a GPU's) and
    archived builds (:mod:`distperf.reference`) of a machine other than the one of the book's own rows, so that a
    build on another machine shows the canonical build's results beside its own while this machine's build does not
    show its own archive twice. An ``archived`` experiment (one too long for any build, such as the long
    convergence study) is read from every archived build, with a table of the book's own beside them where one
    exists.
    """
    import pandas as pd

    from .reference import read_manifest

    scale = scale or book_scale()
    own_dir = study_dir(study_of(experiment), scale)
    own = table_path(own_dir, experiment)
    own_frame = pd.read_csv(own, low_memory=False) if own is not None else None
    own_machines = set(own_frame["machine"].dropna().astype(str)) if own is not None and "machine" in own_frame \
        else set()
    builds = archived_builds()

    def beside(directory: Path) -> bool:
        if directory == own_dir:
            return False
        if archived or directory not in builds:
            return True
        return (read_manifest(directory) or {}).get("machine") not in own_machines

    references = sorted(p for p in (DATA / "reference").glob(f"*/{experiment}.csv*")
                        if p.name in (f"{experiment}.csv", f"{experiment}.csv.gz") and beside(p.parent))
    if own is None and not (archived and references):
        raise FileNotFoundError(f"{own_dir / (experiment + '.csv')} is missing: run `make data SCALE={scale}` (or "
                                f"`make book`) first" if not archived
                                else f"no table of {experiment} in data/reference/ or {own_dir}")
    kinds = (["fresh"] if own is not None else []) + ["reference"] * len(references)
    frames = ([own_frame] if own is not None else []) + [pd.read_csv(path, low_memory=False) for path in references]
    source = pd.Series([kind for kind, f in zip(kinds, frames) for _ in range(len(f))], name="source", dtype=object)
    # one concatenation rather than a column inserted into a frame of hundreds of columns (pandas then warns, and
    # the warning would print in the book)
    return pd.concat([pd.concat(frames, ignore_index=True), source], axis=1)


def table_digest(experiment: str, scale: str | None = None) -> str | None:
    """The first 12 hex digits of the sha256 of the book's own table of ``experiment`` (its CSV content: in a
    reader's build the archive's manifest says it), or None when the book has no such table."""
    from .reference import SHORT, read_manifest

    scale = scale or book_scale()
    directory = study_dir(study_of(experiment), scale)
    path = table_path(directory, experiment)
    if path is None:
        return None
    if directory in archived_builds():
        entry = (read_manifest(directory) or {}).get("tables", {}).get(path.name)
        if entry:
            return entry["short"]
    stat = path.stat()
    return _digest(str(path), stat.st_mtime_ns, stat.st_size)[:SHORT]


@lru_cache(maxsize=256)
def _digest(path: str, mtime_ns: int, size: int) -> str:
    from .reference import read_table_bytes, sha256

    return sha256(read_table_bytes(Path(path)))


def signed_error(predicted, measured):
    """Signed relative error (predicted − measured) / measured: negative means the model under-predicts.

    Element-wise on arrays and pandas columns. For two numbers: 0 when both are 0, None when only the
    measurement is 0 or either is missing (a run's JSON writes that as null)."""
    import numbers

    if predicted is None or measured is None:
        return None
    if isinstance(predicted, numbers.Real) and isinstance(measured, numbers.Real):
        if measured == 0:
            return 0.0 if predicted == 0 else None
        return float((predicted - measured) / measured)
    return (predicted - measured) / measured

