import pytest

from distperf.config import ConfigError
from distperf.measure.fsdp_overhead import fsdp_overhead, main


def test_the_probe_times_the_plain_and_the_sharded_layer_on_two_ranks():
    found = fsdp_overhead("tiny", zero=3, steps=2, top=40, timeout=120)
    for name in ("plain", "sharded"):
        run = found[name]
        assert len(run["steps_s"]) == 2 and run["median_s"] > 0 and 0 < len(run["ops"]) <= 40
        assert all(seconds >= 0 and calls > 0 for _, seconds, calls in run["ops"])
    # FSDP2's own work shows in the sharded step's profile, and only there
    assert any(op.startswith("FSDP::") for op, _, _ in found["sharded"]["ops"])
    assert not any(op.startswith("FSDP::") for op, _, _ in found["plain"]["ops"])


@pytest.mark.parametrize("kwargs, field", [({"model": "nope"}, "model"), ({"model": "gpt3-175b"}, "model"),
                                           ({"zero": 1}, "zero"), ({"steps": 0}, "steps"),
                                           ({"top": 0}, "top")])
def test_what_the_probe_cannot_run_is_refused_before_any_process_starts(kwargs, field):
    with pytest.raises(ConfigError) as e:
        fsdp_overhead(**kwargs)
    assert e.value.field == field


def test_the_command_names_the_bad_input_and_exits_non_zero(capsys):
    assert main(["--zero", "0"]) == 2
    assert "zero: FSDP2 runs ZeRO-2 or ZeRO-3" in capsys.readouterr().err
