"""The command line the round-based reference experiments share (``distperf.reference.rounds_main``:
scripts/tp_drift.py, scripts/allreduce_context.py, scripts/allocator_context.py): bad input is refused and an
archived table is kept."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ("tp_drift", "allreduce_context", "allocator_context")


def script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("rounds", ["0", "-3", "two"])
def test_rounds_must_be_a_whole_number_of_at_least_1(name, rounds, capsys):
    with pytest.raises(SystemExit) as stop:
        script(name).main(["--rounds", rounds])
    assert stop.value.code == 2 and "--rounds: must be a whole number of at least 1" in capsys.readouterr().err


@pytest.mark.parametrize("name", SCRIPTS)
def test_an_existing_table_is_kept(name, tmp_path, capsys):
    out = tmp_path / f"{name}.csv"
    out.write_text("kept\n")
    assert script(name).main(["--out", str(out)]) == 0
    assert out.read_text() == "kept\n" and "exists (--force measures again)" in capsys.readouterr().out
