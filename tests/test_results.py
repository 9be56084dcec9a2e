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
