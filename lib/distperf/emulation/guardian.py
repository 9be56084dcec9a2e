"""``python -m distperf.emulation.guardian NAMESPACE...``: tear down a run's namespaces when the run ends.

The run starts it with a pipe on its standard input and keeps the write end; the guardian reads until
the pipe closes — which happens when the run closes it after its own teardown, or when the run dies in
any way, SIGKILL included (the kernel closes a dead process's descriptors) — then stops the processes
left inside the namespaces and deletes them (:func:`distperf.emulation.topology.teardown`). It ignores
SIGINT and SIGHUP, which a terminal sends to the whole foreground job.
"""
from __future__ import annotations

import signal
import sys


def main(argv: list[str]) -> int:
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    while sys.stdin.buffer.read(4096):
        pass
    from .topology import teardown

    teardown(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
