"""Notebook kernels reached over Unix sockets instead of TCP ports.

jupyter_client gives a new kernel its five TCP ports by binding port 0 and closing the socket; the kernel binds
them a second or so later. Meanwhile the experiment notebooks' gloo process groups take ephemeral ports of their
own (every listening pair and every connection), and when one of them takes a port in that gap the kernel dies
with ``zmq.error.ZMQError: Address already in use`` and the notebook fails to run. ``make test`` builds the smoke
study (two notebooks at a time) and a reader's book side by side, which is where this was seen. With the ``ipc``
transport a kernel's sockets are files, ``<prefix>-1`` to ``<prefix>-5``, under a prefix no other kernel shares:
there is no port to lose. jupyter_client deletes the files when the kernel shuts down.

Two ways in: papermill runs notebooks with the engine :class:`distperf.papermill_engine.IPCEngine` (``papermill
--engine distperf``), and the book's chapters (myst-nb through jupyter-cache) through the Sphinx extension
``_ext/distperf_kernels.py``. Both hand :func:`ipc_config` to each execution.
"""
from __future__ import annotations

import os
import sys
import tempfile
import uuid

from traitlets.config import Config

# bytes of a Unix socket's path, its terminating NUL included, by platform; elsewhere (macOS, the BSDs) 104
SUN_PATH = {"linux": 108}
SUN_PATH_ELSEWHERE = 104


def ipc_config(platform: str = sys.platform) -> Config:
    """A kernel manager's configuration: ``ipc`` transport, socket files under a prefix of their own in ``$TMPDIR``.

    Where the temporary directory's path is too long for a socket's (:data:`SUN_PATH`), or on Windows, whose ZeroMQ
    has no ``ipc`` transport, the configuration is empty: the kernel keeps jupyter_client's TCP ports, and the race
    above, rather than failing to start.
    """
    if platform == "win32":
        return Config()
    prefix = os.path.join(tempfile.gettempdir(), f"distperf-kernel-{uuid.uuid4().hex[:10]}")
    if len(os.fsencode(f"{prefix}-5")) >= SUN_PATH.get(platform, SUN_PATH_ELSEWHERE):
        return Config()
    return Config({"KernelManager": {"transport": "ipc", "ip": prefix}})
