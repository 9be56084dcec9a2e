"""Thousands of random and extreme flag combinations thrown at ``predict`` and ``plan``: each must end with exit
status 0 (and strict JSON with ``--json``) or 2 (one line naming the field and the rule) within a time limit —
never a traceback, an unhandled exception or a hang. Seeded, so a failure reproduces; the cases run in this
process through :func:`distperf.cli.main`, as the command line does."""
from __future__ import annotations

import contextlib
import io
import json
import random
import time

import pytest

from distperf import cli
from distperf.config import PRECISIONS, RECOMPUTE, SCHEDULES
from distperf.hardware import PRESETS

CASES = 1000  # per command
SECONDS_PER_CASE = 5.0
INTS = ["-1", "0", "1", "2", "3", "4", "8", "64", "1000", str(2**20), str(2**20 + 1), str(2**24), str(2**24 + 1),
        str(10**12), "1" + "0" * 400, "1.5", "x", "", "nan", "inf"]
FLOATS = ["0", "-1", "1e-320", "1e-6", "0.5", "25", "1e6", "1e400", "inf", "-inf", "nan", "abc", "1"]
SIZES = ["16GiB", "1e400", "-1", "0B", "abc", "1B", "80GB", "1e30GiB", "500MiB", ""]
SMALL_MODELS = ["tiny", "small", "gpt2", "bert-tiny", "2bw-gpt-355m"]


def _case_of(name: str, rng: random.Random) -> str:
    return "".join(c.upper() if rng.random() < 0.3 else c for c in name)


def _valid_predict(rng: random.Random) -> dict:
    """A configuration predict accepts, most of the time: small degrees, a schedule that fits them."""
    pp = rng.choice([1, 1, 2, 4])
    flags = {"--model": _case_of(rng.choice(SMALL_MODELS), rng), "--dp": str(rng.choice([1, 2, 4])),
             "--tp": str(rng.choice([1, 1, 2])), "--pp": str(pp), "--micro-batch": str(rng.choice([1, 2, 4])),
             "--microbatches": str(pp * rng.choice([1, 2, 4])), "--zero": str(rng.choice([0, 1, 2, 3])),
             "--recompute": rng.choice(RECOMPUTE), "--precision": rng.choice(PRECISIONS),
             "--bucket-mb": rng.choice(["25", "1", "0.1"]), "--hardware": _case_of(rng.choice(list(PRESETS)), rng)}
    if pp > 1:
        flags["--schedule"] = rng.choice(["gpipe", "1f1b", "2bw", "2bw-flush", "pipedream"])
    return flags


ODD_PREDICT = {"--model": ["nope", "", "GPT-2"], "--layers": INTS, "--hidden": INTS, "--heads": INTS, "--ffn": INTS,
               "--vocab": INTS, "--seq": INTS, "--dp": INTS, "--tp": INTS, "--pp": INTS, "--chunks": INTS,
               "--micro-batch": INTS, "--microbatches": INTS, "--global-batch": INTS, "--zero": INTS,
               "--schedule": [*SCHEDULES, "bogus", ""], "--recompute": ["bogus", ""], "--precision": ["bogus"],
               "--partition": ["3,1", "1,1", "a,b", "0,4", "", "2", "1,-1"], "--bucket-mb": FLOATS,
               "--hardware": ["nope", "/no/such", "BAD_PROFILE"]}


def _valid_plan(rng: random.Random) -> dict:
    return {"--model": _case_of(rng.choice(SMALL_MODELS + ["2bw-gpt-1.3b"]), rng),
            "--gpus": str(rng.choice([1, 2, 4, 8, 16, 64])), "--global-batch": str(rng.choice([8, 16, 64, 512])),
            "--hardware": _case_of(rng.choice(list(PRESETS)), rng), "--precision": rng.choice(PRECISIONS),
            "--top": str(rng.choice([1, 3, 10]))}


ODD_PLAN = {"--model": ["nope", ""], "--layers": INTS, "--hidden": INTS, "--heads": INTS, "--vocab": INTS,
            "--seq": INTS, "--gpus": INTS, "--gpus-per-node": INTS, "--global-batch": INTS, "--memory-limit": SIZES,
            "--node-gbit": FLOATS, "--max-micro-batch": INTS, "--top": INTS,
            "--schedules": ["2bw,1f1b", "gpipe", "bogus", "", "2bw,,"], "--recompute": ["none,full", "bogus", ""],
            "--hardware": ["nope", "BAD_PROFILE"], "--precision": ["bogus"]}


def _argv(command: str, valid: dict, odd: dict, rng: random.Random, bad_profile: str) -> list[str]:
    """A valid configuration with none, one or two flags replaced by an extreme or malformed value."""
    flags = dict(valid)
    for name in rng.sample(sorted(odd), rng.choice([0, 1, 1, 2])):
        value = rng.choice(odd[name])
        flags[name] = bad_profile if value == "BAD_PROFILE" else value
    if "--global-batch" in flags and command == "predict":
        flags.pop("--microbatches", None)  # the two are exclusive; a global batch replaces the count
    argv = [command] + [x for pair in flags.items() for x in pair]
    if command == "predict" and rng.random() < 0.2:
        argv.append("--sequence-parallel")
    if rng.random() < 0.5:
        argv.append("--json")
    return argv


def _predict_argv(rng: random.Random, bad_profile: str) -> list[str]:
    return _argv("predict", _valid_predict(rng), ODD_PREDICT, rng, bad_profile)


def _plan_argv(rng: random.Random, bad_profile: str) -> list[str]:
    return _argv("plan", _valid_plan(rng), ODD_PLAN, rng, bad_profile)


def _strict(text: str):
    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def _run(argv: list[str]) -> tuple[int, str, str, float]:
    out, err = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as e:  # argparse ends a bad flag with exit(2)
            code = e.code
    return code, out.getvalue(), err.getvalue(), time.perf_counter() - start


@pytest.mark.parametrize("make", [_predict_argv, _plan_argv], ids=["predict", "plan"])
def test_random_and_extreme_flags_end_with_0_or_2_and_one_line(make, tmp_path):
    bad_profile = tmp_path / "hw.json"
    bad_profile.write_text(json.dumps({**{k: 1.0 for k in ("flops_fp32", "flops_16bit", "memory_bandwidth",
                                                            "memory_capacity", "intra_bandwidth", "intra_latency",
                                                            "inter_bandwidth", "inter_latency")},
                                       "devices_per_node": 8, "name": {"an": "object"}}))
    rng = random.Random(20261201)
    codes, distinct, slowest = {0: 0, 2: 0}, set(), 0.0
    for _ in range(CASES):
        argv = make(rng, str(bad_profile))
        code, out, err, seconds = _run(argv)  # an exception escaping main fails the test with its argv
        slowest = max(slowest, seconds)
        assert code in (0, 2), (argv, code, err[-500:])
        assert seconds < SECONDS_PER_CASE, (argv, seconds)
        codes[code] += 1
        if code == 2:
            lines = err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith(f"distperf {argv[0]}: error: "), (argv, err[-500:])
            assert "Traceback" not in err
            distinct.add(lines[0])
        elif "--json" in argv:
            _strict(out)
    # both outcomes happen often, so the generator reaches the computations and their checks
    assert codes[0] > CASES // 20 and codes[2] > CASES // 4, codes
    assert len(distinct) > 75, len(distinct)  # many different rules reached
