"""Strict JSON for what the commands print with ``--json``: RFC 8259 has no NaN or Infinity (Python's ``json``
writes them, and strict readers such as JavaScript's ``JSON.parse`` or ``jq`` reject the document), so a
non-finite number is written as ``null``."""
from __future__ import annotations

import json
import math


def finite(obj):
    """``obj`` with every non-finite float (NaN, ±inf) replaced by None, through dicts, lists and tuples."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def dumps(obj, **kwargs) -> str:
    """``json.dumps`` of :func:`finite` ``(obj)``, refusing anything still not strict JSON."""
    return json.dumps(finite(obj), allow_nan=False, **kwargs)
