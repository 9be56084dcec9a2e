"""Atomic writes: a file appears whole or not at all.

Each writer fills a temporary file beside the target (same directory, so the rename cannot cross file systems) and
renames it over the target; if anything fails on the way, the temporary file is removed and the target is untouched.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def replacing(path) -> Iterator[Path]:
    """Yield a temporary path to write; on a clean exit it replaces ``path``, on an error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_bytes(path, data: bytes) -> Path:
    with replacing(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text(path, text: str) -> Path:
    return write_bytes(path, text.encode())
