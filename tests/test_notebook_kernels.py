"""Notebook kernels on Unix sockets (distperf.notebook_kernels): papermill's engine and the book's chapters use them."""
import importlib.util
import json
import tempfile
from pathlib import Path

import nbformat
import papermill
import pytest

from distperf import notebook_kernels

ROOT = Path(__file__).resolve().parents[1]
CONNECTION = "from ipykernel import get_connection_info; print(get_connection_info())"


def notebook() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(CONNECTION)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def connection(nb: nbformat.NotebookNode) -> dict:
    return json.loads(nb.cells[0].outputs[0]["text"])


def leftovers(tmp_path: Path) -> list[Path]:
    return sorted(tmp_path.glob("distperf-kernel-*"))


@pytest.fixture
def own_tmpdir(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_each_config_names_a_prefix_of_its_own(own_tmpdir):
    first, second = notebook_kernels.ipc_config(), notebook_kernels.ipc_config()
    assert first.KernelManager.transport == "ipc"
    assert first.KernelManager.ip != second.KernelManager.ip
    assert Path(first.KernelManager.ip).parent == own_tmpdir
    assert len(first.KernelManager.ip) + len("-5") < notebook_kernels.SUN_PATH["linux"]


@pytest.mark.parametrize("platform, longest", [("linux", 108), ("darwin", 104)])
def test_a_temporary_directory_too_long_for_a_socket_leaves_the_tcp_default(tmp_path, monkeypatch, platform,
                                                                             longest):
    def transport(length):  # the socket path's length: the directory, the 26-character prefix and "-5"
        monkeypatch.setattr(tempfile, "tempdir", "/" + "x" * (length - len("/distperf-kernel-0123456789-5") - 1))
        return notebook_kernels.ipc_config(platform).KernelManager.get("transport", "tcp")

    assert transport(longest - 1) == "ipc"
    assert transport(longest) == "tcp"


def test_windows_keeps_the_tcp_default(own_tmpdir):
    assert "transport" not in notebook_kernels.ipc_config("win32").KernelManager


def test_papermill_engine_runs_the_kernel_over_ipc_and_removes_its_sockets(own_tmpdir):
    source, out = own_tmpdir / "in.ipynb", own_tmpdir / "out.ipynb"
    nbformat.write(notebook(), source)
    papermill.execute_notebook(str(source), str(out), engine_name="distperf", kernel_name="python3", progress_bar=False)
    info = connection(nbformat.read(out, as_version=4))
    assert info["transport"] == "ipc"
    assert info["ip"].startswith(str(own_tmpdir / "distperf-kernel-"))
    assert leftovers(own_tmpdir) == []


def test_book_extension_makes_jupyter_cache_execute_over_ipc(own_tmpdir, monkeypatch):
    import jupyter_cache.executors.utils as executors

    monkeypatch.setattr(executors, "executenb", executors.executenb)  # the binding is undone after the test
    spec = importlib.util.spec_from_file_location("distperf_kernels", ROOT / "_ext" / "distperf_kernels.py")
    extension = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(extension)
    assert extension.setup(app=None)["parallel_read_safe"]
    nb = notebook()
    result = executors.single_nb_execution(nb, cwd=str(own_tmpdir), timeout=60, allow_errors=False)
    assert result.err is None, result.exc_string
    info = connection(nb)
    assert info["transport"] == "ipc"
    assert info["ip"].startswith(str(own_tmpdir / "distperf-kernel-"))
    assert leftovers(own_tmpdir) == []
