"""scripts/tp_drift.py, the experiment on whether collective probes follow the tensor-parallel step's drift: a short
run on two real gloo ranks writes a table the chapter's analysis reads, listed in its directory's manifest (its
command line: tests/test_reference_rounds.py)."""
import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

from distperf import reference
from distperf.analysis import tp_implied

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("tp_drift", ROOT / "scripts" / "tp_drift.py")
tp_drift = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tp_drift)


@pytest.mark.slow
def test_two_rounds_on_two_ranks_write_a_table_with_provenance_and_its_manifest_entry(tmp_path):
    (tmp_path / reference.MANIFEST).write_text(json.dumps({"machine": "m", "scale": "cpu", "tables": {}}))
    out = tmp_path / "tp_drift.csv"
    assert tp_drift.main(["--rounds", "2", "--out", str(out)]) == 0
    table = pd.read_csv(out)
    assert len(table) == 2 and {"commit", "torch", "date", "machine"} <= set(table.columns)
    assert (table[list(tp_implied.DRIFT_STEPS) + list(tp_implied.DRIFT_PROBES)] > 0).all().all()
    assert reference.check(tmp_path) == []
    assert "over 2 rounds" in tp_implied.drift_sentence(table)
