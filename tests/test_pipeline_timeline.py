"""A pipeline step action by action (distperf.measure.timeline, .pipeline_replay, distperf.analysis.pipeline_timeline): the trace a run
writes with --trace, what each wait waited for, and the replay that splits the step's excess over the cost model's
formula into stalls, variation and the schedule; scripts/pipeline_timeline.py and distperf.measure.busy_sender."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from distperf.analysis import pipeline_timeline as pt
from distperf.measure import pipeline_replay as pr
from distperf.measure import timeline as tl

ROOT = Path(__file__).resolve().parents[1]


def _timeline(rank: int, actions: list, communication: list, origin_us: float = 1e9, optimizer=()) -> dict:
    """A rank's timeline as rank_timeline keeps it: actions (kind, stage, microbatch, start, end) and spans, in µs
    from its window's start at origin_us."""
    return {"rank": rank, "stage": rank, "origin_us": origin_us, "actions": [list(a) for a in actions],
            "optimizer": [list(s) for s in optimizer], "communication": [list(s) for s in communication]}


def _gpipe(f: tuple, b: tuple, m: int, hop: float = 0.0, stall: dict | None = None) -> list[dict]:
    """Two stages running GPipe with forward f[r] and backward b[r] µs on rank r, each input arriving ``hop`` after
    its sender's action ended (plus ``stall[(kind, i)]`` for that action), the waits recorded as communication."""
    stall = stall or {}
    out = [[], []]
    comm = [[], []]
    ends = {}
    free = [0.0, 0.0]
    order = [("F", i) for i in range(m)] + [("B", i) for i in reversed(range(m))]
    for kind, i in order:
        ranks = (0, 1) if kind == "F" else (1, 0)
        for r in ranks:
            dep = ends.get((kind, ranks[0], i)) if r == ranks[1] else None
            ready = free[r] if dep is None else max(free[r], dep + hop + stall.get((kind, i), 0.0))
            if ready > free[r]:
                comm[r].append((free[r], ready))
            end = ready + (f[r] if kind == "F" else b[r])
            out[r].append((kind, r, i, ready, end))
            ends[(kind, r, i)], free[r] = end, end
    return pr.align([_timeline(r, out[r], comm[r]) for r in range(2)])


def test_action_names_round_trip_and_other_spans_are_not_actions():
    assert tl.parse_action(tl.action_name("B", 3, 12)) == ("B", 3, 12)
    assert tl.parse_action("Forward 1") is None and tl.parse_action("distperf.pp#U:0:1") is None


def test_the_chrome_trace_has_a_process_per_rank_on_one_clock():
    ranks = [_timeline(0, [("F", 0, 0, 10.0, 20.0)], [(0.0, 10.0)], origin_us=1000.0),
             _timeline(1, [("F", 1, 0, 5.0, 15.0)], [], origin_us=1020.0)]
    trace = tl.chrome_trace(ranks, {"config": {"x": 1}})
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert names == {0: "rank 0 (stage 0)", 1: "rank 1 (stage 1)"}
    forwards = {e["pid"]: e["ts"] for e in trace["traceEvents"] if e.get("cat") == "compute"}
    assert forwards == {0: 10.0, 1: 25.0}  # rank 1's window started 20 µs later
    assert trace["distperf.timelines"] == ranks and trace["distperf.about"] == {"config": {"x": 1}}


def test_load_lines_the_ranks_up_and_names_a_bad_file(tmp_path):
    path = tmp_path / "t.json"
    tl.write_trace(path, [_timeline(1, [("F", 1, 0, 5.0, 6.0)], [], origin_us=130.0),
                          _timeline(0, [("F", 0, 0, 1.0, 2.0)], [], origin_us=100.0)])
    ranks, about = pr.load(path)
    assert [t["rank"] for t in ranks] == [0, 1] and [t["shift_us"] for t in ranks] == [0.0, 30.0]
    assert ranks[1]["actions"][0][3:] == [35.0, 36.0] and about == {}
    (tmp_path / "bad.json").write_text("{}")
    (tmp_path / "empty.json").write_text('{"distperf.timelines": []}')
    for name, rule in (("bad.json", "not a trace"), ("none.json", "no such file"), ("empty.json", "no rank")):
        with pytest.raises(ValueError, match=rule):
            pr.load(tmp_path / name)


def test_waits_split_at_the_moment_the_neighbour_finished():
    # rank 1 waits for F0 from 0 to 1100 µs: 1000 while rank 0 computes, then a 100 µs hop
    ranks = _gpipe((1000.0, 1000.0), (2000.0, 2000.0), m=2, hop=100.0)
    table = pr.actions(ranks)
    first = table[(table["rank"] == 1) & (table.kind == "F") & (table.microbatch == 0)].iloc[0]
    assert first.bound and first.waited_neighbour == pytest.approx(1000) and first.waited_after == pytest.approx(100)
    assert first.hop == pytest.approx(100)
    second = table[(table["rank"] == 1) & (table.kind == "F") & (table.microbatch == 1)].iloc[0]
    assert not second.bound and second.waited == 0  # its input was there when rank 1 was free
    last = table[(table["rank"] == 1) & (table.kind == "B")]
    assert last.dependency_rank.eq(1).all() and last.hop.isna().all()  # the last stage's backward needs its forward


def test_stalls_are_waits_for_an_input_that_was_ready():
    ranks = _gpipe((1000.0, 1000.0), (2000.0, 2000.0), m=4, hop=100.0, stall={("F", 2): 3000.0})
    table = pr.actions(ranks)
    rows = pr.per_rank(ranks, table).set_index("rank")
    assert rows.loc[1, "stalls"] == 1 and rows.loc[1, "stalled_ms"] == pytest.approx(3.0, abs=0.15)
    assert rows.loc[0, "stalls"] == 0
    # each stage runs its forwards (rank 0) or backwards (rank 1) back to back: every input but the last is ready
    # while its sender computes the next; after its last forward rank 0 waits for a gradient, after its last
    # backward rank 1 has nothing left
    forwards = table[(table["rank"] == 1) & (table.kind == "F")].sender.tolist()
    backwards = table[(table["rank"] == 0) & (table.kind == "B")].sender.tolist()
    assert forwards == ["computing"] * 3 + ["waiting"] and backwards == ["computing"] * 3 + ["other"]
    assert pr.stalls_by_sender(table) == {"computing": [6, 1], "waiting": [1, 0], "other": [1, 0]}


def test_the_replay_removes_stalls_and_at_the_medians_variation():
    steady = _gpipe((1000.0, 1000.0), (2000.0, 2000.0), m=4, hop=100.0)
    table = pr.actions(steady)
    span = pr.measured_span(table)
    assert pr.replay(table) == pytest.approx(span) and pr.replay(table, own_compute=False) == pytest.approx(span)
    stalled = pr.actions(_gpipe((1000.0, 1000.0), (2000.0, 2000.0), m=4, hop=100.0, stall={("F", 1): 3000.0}))
    assert pr.measured_span(stalled) == pytest.approx(span + 3000)  # rank 1 is the bottleneck: the stall delays all
    assert pr.replay(stalled) == pytest.approx(span)
    slow = steady[1]["actions"][2]  # variation: one forward on rank 1 takes longer
    varied = _gpipe((1000.0, 1000.0), (2000.0, 2000.0), m=4, hop=100.0)
    varied[1]["actions"] = [a if a[:3] != slow[:3] else [*a[:4], a[4] + 500.0] for a in varied[1]["actions"]]
    later = [a if a[0] != "F" or a[2] <= slow[2] else [*a[:3], a[3] + 500.0, a[4] + 500.0]
             for a in varied[1]["actions"]]
    varied[1]["actions"] = later
    table = pr.actions(varied)
    assert pr.replay(table) > pr.replay(table, own_compute=False)


@pytest.mark.parametrize("f, b, expected", [((1000.0, 1000.0), (2000.0, 2000.0), "equal"),
                                            ((1500.0, 1000.0), (2000.0, 2500.0), "longer")])
def test_the_closed_form_prices_one_sum_per_rank_and_misses_a_phase_bottleneck(f, b, expected):
    """GPipe's forwards run at the slower forward and its backwards at the slower backward: where one rank is slower
    forward and the other backward, the formula over forward + backward per rank is short of the schedule."""
    table = pr.actions(_gpipe(f, b, m=4))
    closed, medians = pr.closed_form(table, "gpipe", 4), pr.replay(table, own_compute=False)
    assert closed == pytest.approx(4 * max(x + y for x, y in zip(f, b)) + min(x + y for x, y in zip(f, b)))
    assert (medians == pytest.approx(closed)) if expected == "equal" else medians > closed + 1000


def test_a_run_with_trace_writes_it_and_keeps_its_numbers(tmp_path):
    path = tmp_path / "trace.json"
    proc = subprocess.run([sys.executable, "-m", "distperf", "run", "--model", "tiny", "--pp", "2", "--schedule",
                           "gpipe", "--microbatches", "2", "--steps", "2", "--device", "cpu", "--no-measure",
                           "--hardware", "none", "--trace", str(path), "--json"],
                          capture_output=True, text=True, timeout=180, env={**__import__("os").environ,
                                                                            "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    ranks, about = pr.load(path)
    assert about["config"]["layout"]["schedule"] == "gpipe" and [t["stage"] for t in ranks] == [0, 1]
    for t in ranks:
        assert sorted((a[0], a[2]) for a in t["actions"]) == [("B", 0), ("B", 1), ("F", 0), ("F", 1)]
        assert all(a[1] == t["stage"] and a[4] > a[3] for a in t["actions"])
        assert t["optimizer"] and t["communication"]
    numbers = result["timeline"]
    table = pr.actions(ranks)
    assert numbers["span_ms"] == pytest.approx(pr.measured_span(table) / 1e3)
    assert len(numbers["per_rank"]) == 2 and numbers["per_rank"][1]["communication_ms"] > 0
    first_forward_on_1 = table[(table["rank"] == 1) & (table.kind == "F")].start.min()
    assert first_forward_on_1 >= table[(table["rank"] == 0) & (table.kind == "F")].end.min()  # one clock


@pytest.mark.parametrize("flags, rule", [(["--no-measure", "--no-breakdown"], "needs the time-breakdown step"),
                                         (["--trace-dir"], "must be a file")])
def test_a_trace_without_its_step_or_to_a_directory_is_refused(tmp_path, flags, rule):
    target = str(tmp_path) if flags == ["--trace-dir"] else str(tmp_path / "t.json")
    extra = [] if flags == ["--trace-dir"] else flags
    proc = subprocess.run([sys.executable, "-m", "distperf", "run", "--model", "tiny", "--pp", "2", "--steps", "1",
                           "--hardware", "none", "--trace", target, *extra],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and rule in proc.stderr and "Traceback" not in proc.stderr


def test_the_experiment_reads_its_runs_and_says_what_it_found():
    per = {"span_ms": 110.0, "replay_ms": 104.0, "replay_medians_ms": 103.0, "closed_form_ms": 100.0,
           "per_rank": json.dumps([{"stage": 0, "communication_ms": 20.0, "stalls": 1, "stalled_ms": 2.0},
                                   {"stage": 1, "communication_ms": 15.0, "stalls": 2, "stalled_ms": 5.0}]),
           **{f"stalls_by_sender.{state}": json.dumps(v) for state, v in (("computing", [4, 2]), ("waiting", [3, 2]),
                                                                           ("other", [1, 0]))}}
    table = pd.DataFrame([{"status": "ok", "config.layout.schedule": s, "config.layout.microbatches": m,
                           "repeat": k, "iteration_time_s.median": 0.1,
                           **{f"timeline.{key}": value for key, value in per.items()}}
                          for s in ("gpipe", "1f1b") for m in (4, 8) for k in range(2)])
    runs = pt.runs(table)
    assert len(runs) == 8 and runs.stalls_ms.eq(6.0).all() and runs.variation_ms.eq(1.0).all()
    assert runs.schedule_ms.eq(3.0).all() and runs.excess_ms.eq(10.0).all() and runs.stalls.eq(3).all()
    compared = pt.compare(runs)
    assert compared.excess_of_first.eq(0.5).all() and compared.runs.eq(2).all()
    text = pt.sentence(compared)
    assert "gpipe at m = 8" in text and "the largest part is stalls" in text and "+50% of the first stage" in text
    assert "computing 4 of 8, waiting 4 of 6, other 0 of 2" in text  # summed over a configuration's two runs
    assert pt.sentence(pt.compare(pt.runs(None))) == "No run kept its timeline."
    assert pt.sender_sentence(runs).endswith("(50% of those whose sender computed, 67% of those whose sender waited on "
                                             "its own communication): a computing sender is not their only cause")
    fits = runs.assign(waiting_stalls=0)
    assert pt.sender_sentence(fits).endswith("the stalls fit a computing sender as their cause")
    assert pt.sender_sentence(pt.runs(None)) == "no run kept what the senders were doing"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_experiment_script_traces_each_run_beside_its_table(tmp_path, monkeypatch):
    script = _script("pipeline_timeline")
    seen = {}
    monkeypatch.setattr(script.reference, "experiment_main",
                        lambda experiment, *args: seen.update(experiment) or 0)
    assert script.main(["--repeats", "2", "--out", str(tmp_path / "t.csv")]) == 0
    assert seen["name"] == pt.NAME and seen["base"]["trace"] == str(tmp_path.resolve() / pt.TRACE)
    assert seen["base"]["measure"] is False and "trace" not in script.EXPERIMENT["base"]


def test_the_chapter_draws_a_trace_with_its_stalls(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = _gpipe((1000.0, 1000.0), (2000.0, 2000.0), m=4, hop=100.0, stall={("F", 2): 3000.0})
    fig, ax = plt.subplots()
    pt.draw(ax, ranks, {"config": {"layout": {"schedule": "gpipe", "microbatches": 4}}})
    reds = [p for p in ax.patches if p.get_facecolor()[:3] == matplotlib.colors.to_rgb("#c44e52")]
    assert len(reds) == 1 and reds[0].get_width() == pytest.approx(3.0, abs=0.15)  # the stall, in ms
    assert len([t for t in ax.texts]) == 16 and "gpipe, m = 4" in ax.get_title()
    plt.close(fig)
    assert pt.trace_provenance({}) == "a trace without provenance"
    assert pt.trace_provenance({"provenance": {"device_name": "cpu", "machine": "m", "date": "d",
                                               "commit": "0123456789", "torch": "2.13"}}) == (
        "cpu (m), d, commit 0123456, torch 2.13")


def test_the_busy_sender_probe_runs_and_refuses_bad_input():
    proc = subprocess.run([sys.executable, "-m", "distperf.measure.busy_sender", "--trials", "3", "--timeout", "120"],
                          capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert all(f"{label}: receive median" in proc.stdout for label in ("sender computing", "sender sleeping",
                                                                        "both posting at once"))
    assert "expected stall" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "distperf.measure.busy_sender", "--trials", "0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--trials must be at least 1" in proc.stderr
    from distperf.measure.busy_sender import summary

    found = summary({"busy": [1e-4, 2e-4, 4e-3, 1e-4], "idle": [1e-4, 1e-4, 2e-4], "together": [3e-3, 1e-4]})
    assert found["busy"]["stalled"] == 0.25 and found["idle"]["stalled"] == 0 and found["together"]["stalled"] == 0.5
    assert found["stall_s"] == pytest.approx((1e-4 + 2e-4 + 4e-3 + 1e-4) / 4 - 1e-4)
