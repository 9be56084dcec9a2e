"""scripts/allocator_context.py and distperf.analysis.allocator_context, the experiment on whether glibc's allocator
makes a one-device step take longer than its composed parts: the rule comes out either way on synthetic rounds, the
parts compose as the profiled mode composes them, and a one-round run in real processes writes a table the chapter's
analysis reads, listed in its directory's manifest (its command line: tests/test_reference_rounds.py)."""
import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

from distperf import reference
from distperf.analysis import allocator_context as alloc

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("allocator_context", ROOT / "scripts" / "allocator_context.py")
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)


def rounds(default: float, held: float, n: int = 5) -> pd.DataFrame:
    """n rounds per variant and configuration: composed parts of 40 ms, the step ``default`` or ``held`` times that
    (± 1 % from round to round)."""
    rows = []
    for i in range(n):
        for variant, ratio in (("default", default), ("held", held)):
            for m in alloc.MICROBATCHES:
                wobble = 1 + 0.01 * (i - n // 2) / n
                rows.append({"round": i, "variant": variant, "microbatches": m, "step_s": 0.04 * ratio * wobble,
                             "composed_s": 0.04, "steps_rsd": 0.02, "faults_per_step": 700 if variant == "default"
                             else 20})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("default, held, explained", [(1.12, 1.01, True), (1.12, 1.09, False),
                                                      (1.03, 1.01, False), (1.12, 0.90, False)])
def test_the_allocator_explains_the_excess_only_when_keeping_memory_closes_it(default, held, explained):
    found = alloc.ratios(rounds(default, held))
    by = found.set_index(["microbatches", "variant"])["over_composed"]
    assert by.loc[(2, "default")] == pytest.approx(default) and by.loc[(8, "held")] == pytest.approx(held)
    assert alloc.explains(found) == dict.fromkeys(alloc.MICROBATCHES, explained)
    text = alloc.sentence(rounds(default, held))
    assert text.startswith("at 2 microbatches (") and f"under glibc's default allocator {default:.2f}" in text
    assert ("the allocator explains it" in text) is explained and "700 page faults per step" in text


def test_without_a_table_the_sentence_says_so():
    assert alloc.sentence(None) == "the experiment has not been run on this machine (scripts/allocator_context.py)"


def test_the_parts_compose_as_the_profiled_mode_composes_a_one_device_step():
    parts = {"layer": {"forward_s": 1.0, "backward_s": 2.0}, "embedding": {"forward_s": 0.1, "backward_s": 0.2},
             "head": {"forward_s": 0.3, "backward_s": 0.4}, "optimizer": {"layer_s": 0.5, "first_s": 0.6,
                                                                          "last_s": 0.7}}
    assert script.composed(parts, 4, 2) == pytest.approx(2 * (4 * 3.0 + 0.3 + 0.7) + 4 * 0.5 + 0.6 + 0.7)


@pytest.mark.slow
def test_one_round_in_fresh_processes_writes_a_table_with_provenance_and_its_manifest_entry(tmp_path):
    (tmp_path / reference.MANIFEST).write_text(json.dumps({"machine": "m", "scale": "cpu", "tables": {}}))
    out = tmp_path / "allocator_context.csv"
    assert script.main(["--rounds", "1", "--out", str(out)]) == 0
    table = pd.read_csv(out)
    assert len(table) == len(alloc.VARIANTS) * len(alloc.MICROBATCHES)
    assert {"commit", "torch", "date", "machine"} <= set(table.columns)
    assert set(table.variant) == set(alloc.VARIANTS) and set(table.microbatches) == set(alloc.MICROBATCHES)
    assert (table[["step_s", "composed_s"]] > 0).all().all() and (table["faults_per_step"] >= 0).all()
    assert reference.check(tmp_path) == []
    assert "at 8 microbatches" in alloc.sentence(table)
