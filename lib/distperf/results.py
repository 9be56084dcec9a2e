"""Where results live, and how they are written: tidy CSV tables with provenance, written atomically.

- ``data/fresh/<scale>/<experiment>.csv``: measurements of the machine that builds the book (git-ignored);
- ``data/reference/<machine>/<experiment>.csv``: committed results of other machines (a GPU, say), each row
  with its provenance; see ``data/README.md``.
"""
from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
import tempfile
from pathlib import Path

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
    """'auto' → 'cuda' when a GPU is visible, else 'cpu'; 'cuda' without a GPU is an error."""
    import torch

    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device: must be auto, cpu or cuda, got {device!r}")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: cuda was asked for but no CUDA device is visible")
    return device


def write_csv_atomic(frame, path: Path) -> Path:
    """Write a DataFrame to ``path`` through a temporary file and a rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", newline="") as f:
            frame.to_csv(f, index=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load(experiment: str, scale: str | None = None, archived: bool = False):
    """Fresh results of this machine at ``scale`` and every committed reference table, in one DataFrame.

    A column ``source`` says 'fresh' or 'reference'. A missing fresh table is an error that says how to
    produce it; reference tables are optional. An ``archived`` experiment (one too long for a build, such as the
    long convergence study) is read from the reference tables, with a fresh table beside them where one exists.
    """
    import pandas as pd

    scale = scale or book_scale()
    fresh = fresh_dir(scale) / f"{experiment}.csv"
    references = sorted((DATA / "reference").glob(f"*/{experiment}.csv"))
    if not fresh.exists() and not (archived and references):
        raise FileNotFoundError(f"{fresh} is missing: run `make data SCALE={scale}` (or `make book`) first"
                                if not archived else f"no table of {experiment} in data/reference/ or {fresh.parent}")
    paths = ([fresh] if fresh.exists() else []) + references
    kinds = (["fresh"] if fresh.exists() else []) + ["reference"] * len(references)
    frames = [pd.read_csv(path) for path in paths]
    source = pd.Series([kind for kind, f in zip(kinds, frames) for _ in range(len(f))], name="source", dtype=object)
    # one concatenation rather than a column inserted into a frame of hundreds of columns (pandas then warns, and
    # the warning would print in the book)
    return pd.concat([pd.concat(frames, ignore_index=True), source], axis=1)


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

