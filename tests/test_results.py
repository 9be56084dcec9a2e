"""Results tables: atomic writes and configurations rebuilt from a sweep's flattened columns."""

import pandas as pd

from distperf import presets
from distperf.config import Config, Layout, Training, validate
from distperf.results import config_of_row, signed_error, write_csv_atomic
from distperf.runner.sweep import flatten


def test_a_configuration_survives_a_csv_round_trip(tmp_path):
    configs = [
        validate(Config(model=presets.model("tiny"), layout=Layout(pp=2, schedule="1f1b", microbatches=4, partition=(1, 1)))),
        validate(Config(model=presets.model("bert-tiny"), layout=Layout(dp=2, tp=2, sequence_parallel=True, zero=3),
                        training=Training(precision="mixed", optimizer="sgd", momentum=False))),
    ]
    rows = [{"status": "ok", **flatten({"config": c.to_dict()})} for c in configs]
    rows.append({"status": "failed"})  # a failed row has no result: integer columns become floats
    path = write_csv_atomic(pd.DataFrame(rows), tmp_path / "runs.csv")
    table = pd.read_csv(path)
    rebuilt = [config_of_row(row) for _, row in table[table.status == "ok"].iterrows()]
    assert rebuilt == configs
    assert [p.name for p in tmp_path.iterdir()] == ["runs.csv"]  # no temporary file left


def test_signed_error_is_relative_to_the_measurement():
    assert signed_error(90.0, 100.0) == -0.1
    assert signed_error(150.0, 100.0) == 0.5
