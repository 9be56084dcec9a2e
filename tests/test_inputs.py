"""Small input rules shared by the commands: the fault hook's syntax, finite numbers, presets in any case, and
strict JSON."""
from __future__ import annotations

import json
import math

import pytest

from distperf import jsonout, presets
from distperf.config import ConfigError, check_finite
from distperf.emulation import like
from distperf.emulation import spec as netspec
from distperf.hardware import PRESETS, hardware, preset
from distperf.parallel.rules import parse_fault


@pytest.mark.parametrize("spec, parsed", [("", None), (None, None), ("raise:1:2", ("raise", 1, 2)),
                                          ("hang:0:0", ("hang", 0, 0)), ("exit:3:10", ("exit", 3, 10))])
def test_the_fault_hook_parses(spec, parsed):
    assert parse_fault(spec) == parsed


@pytest.mark.parametrize("spec", ["boom", "raise:1", "raise:a:1", "explode:0:1", "raise:-1:1", "raise:0:1:2", ":"])
def test_a_malformed_fault_hook_is_refused_naming_the_variable(spec):
    with pytest.raises(ConfigError, match="DISTPERF_FAULT: must be KIND:RANK:STEP"):
        parse_fault(spec)


def test_finite_numbers_within_bounds():
    assert check_finite("x", "2.5", 1, 3) == 2.5 and check_finite("x", 1, 1, 3) == 1.0
    for bad in ("nan", "inf", "-inf", "1e400", "0.5", "4", "abc", None, [1]):
        with pytest.raises(ConfigError, match="^x: must be"):
            check_finite("x", bad, 1, 3)


def test_presets_in_any_case():
    assert presets.model("GPT2") is presets.model("gpt2") and presets.model("Tiny").name == "tiny"
    assert preset("v100-16gb") is PRESETS["V100-16GB"] and hardware("h200") is PRESETS["H200"]
    assert preset("TPU") is None
    with pytest.raises(ConfigError, match="^model: unknown preset"):
        presets.model("gpt-5")
    resolved, _ = like.resolve(netspec.parse("nodes=2,ranks_per_node=1", inter_optional=True), "v100-16gb", 1e11)
    assert resolved.inter > 0


def test_strict_json_has_no_nan_or_infinity():
    data = {"a": math.nan, "b": [1.0, math.inf, -math.inf, (2, math.nan)], "c": {"d": 3}, "e": "nan"}
    text = jsonout.dumps(data)
    assert json.loads(text) == {"a": None, "b": [1.0, None, None, [2, None]], "c": {"d": 3}, "e": "nan"}
    assert "NaN" not in text and "Infinity" not in text
