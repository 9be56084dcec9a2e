"""Fixtures shared by the test files."""
from __future__ import annotations

import json

import pytest

from distperf import published


@pytest.fixture(autouse=True)
def no_build_settings(monkeypatch):
    """Every test starts outside a book build: `make test` exports the build's settings (at scale cpu,
    DISTPERF_LONG=archive, which makes the long studies read the archive), and a test sets what it needs."""
    for name in ("DISTPERF_LONG", "DISTPERF_FROM", "DISTPERF_REFERENCE"):
        monkeypatch.delenv(name, raising=False)


def published_row(source, where, item, quantity, value, unit) -> dict:
    """One row of the published table (data/published/values.csv), for a synthetic table."""
    return {"source": source, "where": where, "item": item, "quantity": quantity, "value": float(value),
            "unit": unit, "read": "text", "note": ""}


@pytest.fixture
def fake_published(monkeypatch):
    """``fake_published(rows)`` replaces the published table by ``rows`` (see :func:`published_row`)."""
    def use(rows):
        monkeypatch.setattr(published, "rows", lambda: tuple(rows))
    return use


QUICK_CALIBRATION = ["--quick", "--threads", "1", "--ranks", "2", "--models", "tiny"]


@pytest.fixture(scope="session")
def quick_profile(tmp_path_factory, worker_id):
    """One quick calibration of this machine (``calibrate`` with :data:`QUICK_CALIBRATION`: the tiny preset, two
    ranks, one thread), made once per test session and shared by the tests that need a measured profile: under
    pytest-xdist the workers share it through a lock, the first to need it measures it (about a minute).
    Returns (profile path, the calibration's CompletedProcess); a test asserts the exit status it needs."""
    import fcntl
    import os
    import subprocess
    import sys

    root = tmp_path_factory.getbasetemp()
    root = root.parent if worker_id != "master" else root  # the workers' temporary folders share a parent
    profile, log = root / "quick-profile" / "hw.json", root / "quick-profile" / "calibrate.json"
    profile.parent.mkdir(exist_ok=True)
    with open(root / "quick-profile.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not log.exists():
            proc = subprocess.run([sys.executable, "-m", "distperf", "calibrate", *QUICK_CALIBRATION, "--out",
                                   str(profile)], capture_output=True, text=True, timeout=250,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"})
            log.write_text(json.dumps({"args": proc.args, "returncode": proc.returncode, "stdout": proc.stdout,
                                       "stderr": proc.stderr}))
    return profile, subprocess.CompletedProcess(**json.loads(log.read_text()))
