"""scripts/allreduce_context.py and distperf.analysis.allreduce_context, the experiment on whether an all-reduce's
time depends on what runs before it: the rule comes out either way on synthetic rounds, and a short run on two real
gloo ranks writes a table the chapter's analysis reads, listed in its directory's manifest (its command line:
tests/test_reference_rounds.py)."""
import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

from distperf import reference
from distperf.analysis import allreduce_context as ac
from distperf.hardware import PRESETS

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("allreduce_context", ROOT / "scripts" / "allreduce_context.py")
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)


def rounds(step_over_issued: float, n: int = 5) -> pd.DataFrame:
    """Two ranks' rows of n rounds per preset: the issued all-reduce 2 ms (3 ms on the slower rank), the step's
    ``step_over_issued`` times that on the rank that ends the step (its own work the longest), 0 on the other."""
    rows = []
    for preset in ac.PRESETS:
        for i in range(n):
            for rank, (window, step) in enumerate(((0.1, 0.0), (0.2, 3e-3 * step_over_issued))):
                rows.append({"round": i, "time_s": 1000.0 + 10 * i, "preset": preset, "bytes": 1 << 20, "rank": rank,
                             "step": step, "window": window, "bare": 1e-3, "issued": 2e-3 + rank * 1e-3,
                             "after_copy": 4e-3})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("ratio, follows", [(1.05, True), (0.95, True), (1.3, False), (0.7, False)])
def test_the_step_follows_the_issued_all_reduce_only_within_the_band(ratio, follows):
    found = ac.contexts(rounds(ratio))
    step = found[found.way == "step"]
    assert step.over_issued.tolist() == pytest.approx([ratio] * 2)
    assert found[found.way == "issued"]["median"].tolist() == pytest.approx([3e-3] * 2)  # the slowest rank's
    assert ac.follows_size(found) == {p: follows for p in ac.PRESETS}
    text = ac.sentence(rounds(ratio), PRESETS["A100-80GB"])
    assert text.startswith("over 5 rounds in 40 s") and "`small` " + f"{ratio:.2f}" in text
    assert ("its time follows its size" in text) is follows and "The profile's fit gives" in text


def test_without_a_table_the_sentence_says_so():
    assert ac.sentence(None) == "the experiment has not been run on this machine (scripts/allreduce_context.py)"


@pytest.mark.slow
def test_two_rounds_on_two_ranks_write_a_table_with_provenance_and_its_manifest_entry(tmp_path):
    (tmp_path / reference.MANIFEST).write_text(json.dumps({"machine": "m", "scale": "cpu", "tables": {}}))
    out = tmp_path / "allreduce_context.csv.gz"
    assert script.main(["--rounds", "2", "--out", str(out)]) == 0
    table = pd.read_csv(out)
    assert len(table) == 2 * 2 * len(ac.PRESETS) and {"commit", "torch", "date", "machine"} <= set(table.columns)
    assert (table[list(ac.WAYS) + ["window"]] >= 0).all().all() and (table["issued"] > 0).all()
    assert set(table.bytes) == {3369984, 25798656}  # the presets' whole gradients, one DDP bucket each
    assert reference.check(tmp_path) == []
    assert "over 2 rounds" in ac.sentence(table)
