"""Every process a run or a sweep starts dies with it: SIGTERM (a polite stop: the launch's clean-up runs) and
SIGKILL (no clean-up at all: the launchers die with their parent, and the ranks with their launcher, through the
kernel's parent-death signal) of ``distperf run`` and of ``distperf sweep``, with two real gloo ranks. Each
process is found by a marker in its environment, which every process of the run inherits."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest

from distperf.launch import tagged_processes

PY = sys.executable
MARK = "TEST_HYGIENE_MARK"
LONG_RUN = ["--model", "tiny", "--dp", "2", "--device", "cpu", "--steps", "100000", "--timeout", "300"]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signals are Linux's")


def _wait_for(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def _start(argv: list[str], cwd=None) -> tuple[subprocess.Popen, str]:
    mark = uuid.uuid4().hex
    proc = subprocess.Popen([PY, "-m", "distperf", *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, MARK: mark, "OMP_NUM_THREADS": "1"}, cwd=cwd)
    return proc, mark


def _ranks(mark: str) -> list[int]:
    """The marked processes that are ranks (they run distperf.train; their launcher names it too)."""
    out = []
    for pid in tagged_processes(MARK, mark, strict=True):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
            if b"distperf.train" in cmdline and b"torch.distributed.run" not in cmdline:
                out.append(pid)
        except OSError:
            continue
    return out


def _stop_and_check(proc: subprocess.Popen, mark: str, sig: int) -> None:
    try:
        assert _wait_for(lambda: len(_ranks(mark)) == 2, 90), "the two ranks never started"
        proc.send_signal(sig)
        proc.wait(timeout=30)
        # nothing that carried the marker is left: run or sweep, launcher, ranks
        assert _wait_for(lambda: not tagged_processes(MARK, mark, strict=True), 15), tagged_processes(MARK, mark)
    finally:
        for pid in tagged_processes(MARK, mark):
            os.kill(pid, signal.SIGKILL)
        proc.kill()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_stopping_a_run_stops_its_launcher_and_ranks(sig):
    proc, mark = _start(["run", *LONG_RUN])
    _stop_and_check(proc, mark, sig)
    if sig == signal.SIGTERM:
        assert proc.returncode == 130 and "interrupted" in proc.stderr.read().decode()


@pytest.mark.parametrize("sig, batch", [(signal.SIGTERM, True), (signal.SIGKILL, False)],
                         ids=["SIGTERM", "SIGKILL-one-per-process"])
def test_stopping_a_sweep_stops_every_run_it_started(tmp_path, sig, batch):
    exp = tmp_path / "exp.yaml"
    exp.write_text(textwrap.dedent("""\
        name: long
        command: run
        timeout: 300
        base: {model: tiny, device: cpu, steps: 100000, timeout: 300}
        grid: {dp: [2]}
        """))
    argv = ["sweep", str(exp), "--out", str(tmp_path / "long.csv"), "--no-progress"]
    proc, mark = _start(argv + ([] if batch else ["--one-per-process"]))
    _stop_and_check(proc, mark, sig)
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []


@pytest.mark.parametrize("stopper", ["launch", "sweep"])
def test_a_stop_returns_though_a_stop_signal_left_the_childs_wait_lock_held(stopper):
    """A stop signal whose handler raises inside ``Popen.poll()`` just after its non-blocking acquire of the child's
    wait lock leaves that lock held (CPython's ``subprocess``); the stop that follows must still kill and reap the
    child and return, where a plain ``Popen.wait()`` blocks forever (a ``distperf run`` stopped by SIGTERM once
    outlived this file's 30 s)."""
    from distperf.launch import TAG, spawn, stop_launchers
    from distperf.runner.sweep import stop

    tag = uuid.uuid4().hex
    proc = spawn([PY, "-c", "import time; time.sleep(120)"], env={**os.environ, TAG: tag}, start_new_session=True)
    assert proc._waitpid_lock.acquire(False)  # as the interrupted poll leaves it
    done = threading.Event()

    def stopping():
        stop_launchers([proc], tag) if stopper == "launch" else stop(proc, tag, grace=0.1)
        done.set()

    try:
        threading.Thread(target=stopping, daemon=True).start()
        assert done.wait(30), "the stop blocked on the child's wait lock"
        assert not os.path.exists(f"/proc/{proc.pid}"), "the child was not reaped"
    finally:
        proc._waitpid_lock.release()
        if os.path.exists(f"/proc/{proc.pid}"):
            proc.kill()


def test_the_check_for_processes_left_cannot_pass_without_proc(monkeypatch):
    """The checks above look for processes in /proc: where it cannot be read they must fail, not find none."""
    import builtins

    def unreadable(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", path)

    real_open = builtins.open
    for name, fake in (("listdir", unreadable), ("open", lambda path, *a, **k: (
            unreadable(path) if str(path).startswith("/proc/") else real_open(path, *a, **k)))):
        with monkeypatch.context() as m:
            m.setattr(os if name == "listdir" else builtins, name, fake)
            assert tagged_processes(MARK, "x") == []  # the library's own clean-up on a system without /proc
            with pytest.raises(PermissionError):
                tagged_processes(MARK, "x", strict=True)
