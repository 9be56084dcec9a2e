"""Find the processes of one launch by a tag in their environment.

A launch (``run``'s ranks, a sweep's configuration) exports ``NAME=tag``; every process it starts
inherits it, even one that left its process group, so the tag finds them all for a clean stop.
"""
from __future__ import annotations

import os


def tagged_processes(name: str, tag: str) -> list[int]:
    """PIDs of this user's processes (not this one) whose environment holds ``name=tag``."""
    needle, found = f"{name}={tag}".encode(), []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found
