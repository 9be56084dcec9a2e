"""Sphinx extension: the chapters execute in kernels reached over Unix sockets (``distperf.notebook_kernels``: why).

myst-nb executes a page through jupyter-cache's ``single_nb_execution``, which calls nbclient's ``execute`` by the
name ``executenb`` in its module and takes no kernel configuration from the book's settings: that name is bound
here to nbclient's ``execute`` with :func:`distperf.notebook_kernels.ipc_config`. Parallel reading forks the
processes that execute pages, which keep the binding.
"""
import jupyter_cache.executors.utils
import nbclient

from distperf.notebook_kernels import ipc_config


def execute_over_ipc(nb, **kwargs):
    return nbclient.execute(nb, config=ipc_config(), **kwargs)


def setup(app):
    jupyter_cache.executors.utils.executenb = execute_over_ipc
    return {"parallel_read_safe": True, "parallel_write_safe": True}
