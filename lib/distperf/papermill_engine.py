"""papermill's engine ``distperf``: its own nbclient engine with each notebook's kernel on Unix sockets.

Why: :mod:`distperf.notebook_kernels`. papermill finds the engine through the entry point ``papermill.engine``
(``pyproject.toml``) and loads it while ``papermill.engines`` is being imported: this module is for papermill to
import, after that class exists, and nothing else imports it.
"""
from __future__ import annotations

from papermill.engines import NBClientEngine

from distperf.notebook_kernels import ipc_config


class IPCEngine(NBClientEngine):
    """papermill's nbclient engine, each kernel on :func:`distperf.notebook_kernels.ipc_config`."""

    @classmethod
    def execute_managed_notebook(cls, nb_man, kernel_name, **kwargs):
        return super().execute_managed_notebook(nb_man, kernel_name, config=ipc_config(), **kwargs)
