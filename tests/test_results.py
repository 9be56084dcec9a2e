"""Results tables: atomic writes, and the signed error."""

import pandas as pd

import numpy as np

from distperf.results import signed_error, write_csv_atomic


def test_a_table_is_written_whole_without_a_temporary_file(tmp_path):
    path = write_csv_atomic(pd.DataFrame({"a": [1, 2]}), tmp_path / "runs.csv")
    assert pd.read_csv(path)["a"].tolist() == [1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["runs.csv"]


def test_signed_error_is_relative_to_the_measurement():
    assert signed_error(90.0, 100.0) == -0.1
    assert signed_error(150.0, 100.0) == 0.5
    assert signed_error(0, 0) == 0.0 and signed_error(1.0, 0) is None and signed_error(None, 1.0) is None
    errors = signed_error(pd.Series([90.0, 110.0]), pd.Series([100.0, 100.0]))
    assert np.allclose(errors, [-0.1, 0.1])


def test_load_joins_fresh_and_reference_tables_without_a_warning(tmp_path, monkeypatch):
    import warnings

    from distperf import results

    monkeypatch.setattr(results, "DATA", tmp_path)
    wide = pd.DataFrame({f"c{k}": [1.5, float("nan")] for k in range(300)})  # a sweep table: hundreds of columns
    write_csv_atomic(wide, tmp_path / "fresh" / "cpu" / "exp.csv")
    write_csv_atomic(wide.iloc[:1], tmp_path / "reference" / "gpu" / "exp.csv")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # pandas warns when a column is inserted into a fragmented frame
        frame = results.load("exp", "cpu")
    assert frame.source.tolist() == ["fresh", "fresh", "reference"] and frame.shape == (3, 301)


def test_an_archived_experiment_is_read_from_the_reference_tables_alone(tmp_path, monkeypatch):
    import pytest

    from distperf import results

    monkeypatch.setattr(results, "DATA", tmp_path)
    monkeypatch.setattr(results, "fresh_dir", lambda scale: tmp_path / "fresh" / scale)
    with pytest.raises(FileNotFoundError, match="make data"):
        results.load("long", "cpu")
    with pytest.raises(FileNotFoundError, match="no table of long"):
        results.load("long", "cpu", archived=True)
    write_csv_atomic(pd.DataFrame({"x": [1, 2]}), tmp_path / "reference" / "cpu-2c" / "long.csv")
    assert results.load("long", "cpu", archived=True).source.tolist() == ["reference", "reference"]
    with pytest.raises(FileNotFoundError):
        results.load("long", "cpu")  # an experiment of the build still needs its fresh table
    write_csv_atomic(pd.DataFrame({"x": [3]}), tmp_path / "fresh" / "cpu" / "long.csv")
    assert results.load("long", "cpu", archived=True).source.tolist() == ["fresh", "reference", "reference"]
