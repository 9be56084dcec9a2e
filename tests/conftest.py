"""Fixtures shared by the test files."""
from __future__ import annotations

import pytest

from distperf import published


@pytest.fixture(autouse=True)
def no_build_settings(monkeypatch):
    """Every test starts outside a book build: `make test` exports the build's settings (at scale cpu,
    DISTPERF_LONG=archive, which makes the long studies read the archive), and a test sets what it needs."""
    for name in ("DISTPERF_LONG", "DISTPERF_FROM", "DISTPERF_REFERENCE"):
        monkeypatch.delenv(name, raising=False)


def published_row(source, where, item, quantity, value, unit) -> dict:
    """One row of the published table (data/published/values.csv), for a synthetic table."""
    return {"source": source, "where": where, "item": item, "quantity": quantity, "value": float(value),
            "unit": unit, "read": "text", "note": ""}


@pytest.fixture
def fake_published(monkeypatch):
    """``fake_published(rows)`` replaces the published table by ``rows`` (see :func:`published_row`)."""
    def use(rows):
        monkeypatch.setattr(published, "rows", lambda: tuple(rows))
    return use
