"""A run on one machine listens on loopback only: while a two-rank ``distperf run`` is going, no socket of its
processes (the launcher's stores, the ranks' gloo connections) listens on another address. Sockets are read from
``/proc/net/tcp`` and ``tcp6`` and matched to the processes through their file descriptors."""
from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from distperf.launch import tagged_processes

PY = sys.executable
MARK = "TEST_LOOPBACK_MARK"
pytestmark = pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads /proc/net/tcp")


def _address(hex_address: str) -> ipaddress._BaseAddress:
    """An address of /proc/net/tcp{,6} (hex, in the host's byte order per 32-bit word)."""
    raw = bytes.fromhex(hex_address)
    return ipaddress.ip_address(b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)))


def listening(pids: list[int]) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state that one of ``pids`` holds."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and inode in inodes:  # 0A: LISTEN
                    address, port = local.split(":")
                    out.append((str(_address(address)), int(port, 16)))
    return out


def test_the_address_decoding():
    assert _address("0100007F") == ipaddress.ip_address("127.0.0.1")
    assert _address("00000000000000000000000001000000") == ipaddress.ip_address("::1")


def test_nothing_of_a_run_listens_beyond_loopback():
    mark = uuid.uuid4().hex
    proc = subprocess.Popen([PY, "-m", "distperf", "run", "--model", "tiny", "--dp", "2", "--device", "cpu",
                             "--steps", "100000", "--timeout", "300"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, MARK: mark, "OMP_NUM_THREADS": "1"})
    seen = set()
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # until both ranks listen (their gloo pairs), and a while after
            pids = tagged_processes(MARK, mark, strict=True)
            seen.update(listening(pids))
            if len(pids) >= 4 and len(seen) >= 3:
                break
            time.sleep(0.2)
        for _ in range(10):
            seen.update(listening(tagged_processes(MARK, mark, strict=True)))
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert len(seen) >= 3, seen  # the store and the ranks' listeners were seen
    exposed = [(a, p) for a, p in seen if not ipaddress.ip_address(a).is_loopback]
    assert exposed == [], exposed
