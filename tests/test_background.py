"""The background share of the machine (distperf.measure.background): CPU time of processes outside this process's
tree counts, this tree's (a child alive or reaped) does not. CPU-seconds are counted, not timed: a process that
burns one CPU-second adds about one second however busy the machine is."""
import os
import subprocess
import sys
import time

import pytest

from distperf.measure import background as bg

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs /proc")

BURN = "import time\nwhile time.process_time() < 1.0:\n    pass\nopen({done!r}, 'w').close()\n"


def _wait(path, seconds=60):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        assert time.monotonic() < deadline, "the burning process never finished"
        time.sleep(0.02)


def test_a_process_outside_this_tree_counts_as_background(tmp_path):
    done = str(tmp_path / "done")
    busy, own = bg.machine_busy_s(), bg.tree_cpu_s()
    # the shell starts the burner in the background and exits: the burner is reparented, no longer ours
    subprocess.run(["sh", "-c", f'"{sys.executable}" -c "$0" >/dev/null 2>&1 &', BURN.format(done=done)], check=True)
    _wait(done)
    time.sleep(0.1)
    other = (bg.machine_busy_s() - busy) - (bg.tree_cpu_s() - own)
    assert other >= 0.9


def test_this_processes_children_are_its_own_alive_or_reaped(tmp_path):
    own = bg.tree_cpu_s()
    child = subprocess.Popen([sys.executable, "-c", BURN.format(done=str(tmp_path / "done"))])
    _wait(tmp_path / "done")
    alive = bg.tree_cpu_s() - own  # the child has finished burning and may not have exited yet
    child.wait(timeout=30)
    reaped = bg.tree_cpu_s() - own
    assert alive >= 0.9 and reaped >= 0.9


def test_a_watch_gives_a_share_per_window_and_none_without_proc(monkeypatch):
    watch = bg.Watch()
    with pytest.raises(RuntimeError):
        watch.share()
    watch.start()
    time.sleep(0.05)
    share = watch.share()
    assert share is None or 0.0 <= share <= 1.0
    monkeypatch.setattr(bg, "machine_busy_s", lambda: None)
    assert watch.share() is None
