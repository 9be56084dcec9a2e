"""scripts/tp_drift.py, the experiment on whether collective probes follow the tensor-parallel step's drift: bad
input is refused, an archived table is kept, and a short run on two real gloo ranks writes a table the chapter's
analysis reads, listed in its directory's manifest."""
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


@pytest.mark.parametrize("rounds", ["0", "-3", "two"])
def test_rounds_must_be_a_whole_number_of_at_least_1(rounds, capsys):
    with pytest.raises(SystemExit) as stop:
        tp_drift.main(["--rounds", rounds])
    assert stop.value.code == 2 and "--rounds: must be a whole number of at least 1" in capsys.readouterr().err


def test_an_existing_table_is_kept(tmp_path, capsys):
    out = tmp_path / "tp_drift.csv"
    out.write_text("kept\n")
    assert tp_drift.main(["--out", str(out)]) == 0
    assert out.read_text() == "kept\n" and "exists (--force measures again)" in capsys.readouterr().out


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
