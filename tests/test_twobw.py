"""PipeDream-2BW: the schedule as data, and the runtime on real gloo process groups.

The runtime runs once in a module fixture: 4 spawned ranks play several pipelines in turn (d = 1…4,
m = d and m > d, SGD, SGD with momentum, Adam, a flush in the middle of training, 2 replicas × 2 stages,
full and selective activation recomputation). Each rank saves its newest weights and its action log; the
tests compare them with a single-process simulation of W(t+1) = W(t) − ν·∇f(W(t−1)) and with the schedule generator.
"""
from __future__ import annotations

import datetime
import os
import time
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

from distperf.config import ConfigError, ModelSpec, uniform_partition
from distperf.model import Block, init_weights, set_recompute
from distperf.parallel import twobw_schedule as sched
from distperf.parallel.twobw import TwoBWPipeline

SPEC = ModelSpec(layers=4, hidden=16, heads=2, vocab=32, seq=8, dropout=0.0)
MICRO_BATCH = 2
TOL = dict(atol=1e-6, rtol=1e-6)


# ---------------------------------------------------------------- model, data, optimizers, reference
class Stage(nn.Module):
    """Blocks of a tiny GPT; the first stage embeds token ids, the last returns logits."""

    def __init__(self, blocks: int, first: bool, last: bool):
        super().__init__()
        self.first, self.last = first, last
        if first:
            self.tok, self.pos = nn.Embedding(SPEC.vocab, SPEC.hidden), nn.Embedding(SPEC.seq, SPEC.hidden)
        self.blocks = nn.Sequential(*[Block(SPEC) for _ in range(blocks)])
        if last:
            self.ln, self.head = nn.LayerNorm(SPEC.hidden), nn.Linear(SPEC.hidden, SPEC.vocab, bias=False)

    def forward(self, x):
        if self.first:
            x = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        x = self.blocks(x)
        return self.head(self.ln(x)) if self.last else x


def build_stages(d: int, seed: int = 0) -> list[Stage]:
    torch.manual_seed(seed)
    parts = uniform_partition(SPEC.layers, d)
    stages = [Stage(n, i == 0, i == d - 1) for i, n in enumerate(parts)]
    for s in stages:
        init_weights(s, std=0.2)  # large enough that one step of staleness is visible
    return stages


def loss_fn(logits, targets):
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def make_data(batches: int, rows: int, seed: int):
    g = torch.Generator().manual_seed(1000 + seed)
    ids = torch.randint(SPEC.vocab, (batches, rows, SPEC.seq), generator=g)
    return ids, torch.randint(SPEC.vocab, (batches, rows, SPEC.seq), generator=g)


def optimizer_factory(spec):
    kind, lr, momentum = spec
    if kind == "adam":
        # eps = 1e-3: the attention's key biases have an exactly zero gradient (softmax is
        # shift-invariant); with the default eps = 1e-8 Adam turns their rounding noise (~1e-9) into
        # full-size steps that differ between any two summation orders. The other gradients here are
        # 1e-2…1, so the moments still dominate the update.
        return lambda params: torch.optim.Adam(params, lr=lr, eps=1e-3)
    return lambda params: torch.optim.SGD(params, lr=lr, momentum=momentum)


def simulate(d, m, ids, targets, opt_spec, stale=True):
    """Single process: batch t's gradient is taken at W(max(t−1, 0)) (2BW) or W(t) (vanilla) and
    applied to W(t) by the optimizer. Returns per-stage newest parameters and the batch losses."""
    stages = build_stages(d)
    params = [p for s in stages for p in s.parameters()]
    opt = optimizer_factory(opt_spec)(params)
    model = nn.Sequential(*stages)
    previous = [p.detach().clone() for p in params]
    losses = []
    for t in range(ids.shape[0]):
        current = [p.detach().clone() for p in params]
        with torch.no_grad():
            for p, w in zip(params, previous if stale else current):
                p.copy_(w)
        opt.zero_grad(set_to_none=True)
        batch_loss = 0.0
        for x, y in zip(ids[t].chunk(m), targets[t].chunk(m)):
            loss = loss_fn(model(x), y)
            (loss / m).backward()
            batch_loss += loss.item() / m
        losses.append(batch_loss)
        with torch.no_grad():
            for p, w in zip(params, current):
                p.copy_(w)
        opt.step()
        previous = current
    return [{n: p.detach().clone() for n, p in s.named_parameters()} for s in stages], losses


# ---------------------------------------------------------------- process harness
def spawn(fn, world: int, args: tuple, wait_for=None, timeout: float = 90.0) -> list[int | None]:
    """Start ``world`` processes, wait for ``wait_for`` ranks (all by default) within ``timeout``,
    then kill every process still running. Returns exit codes (None: had to be killed)."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=fn, args=(rank, world, *args), daemon=True) for rank in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    for rank in (range(world) if wait_for is None else wait_for):
        procs[rank].join(max(0.0, deadline - time.monotonic()))
    codes = []
    for p in procs:
        codes.append(p.exitcode)
        if p.is_alive():
            p.kill()
            p.join(5)
    return codes


def _init(rank, world, store, seconds):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=seconds))


# Rounds of scenarios on disjoint ranks: (name, pipelines as lists of ranks, m, batches, optimizer, flush_after)
ROUNDS = [
    [("d2_m2_sgd", [[0, 1]], 2, 4, ("sgd", 0.5, 0.0), None),
     ("d2_m5_adam", [[2, 3]], 5, 3, ("adam", 0.02, 0.0), None)],
    [("d4_m4_sgd", [[0, 1, 2, 3]], 4, 4, ("sgd", 0.5, 0.0), None)],
    [("d3_m4_momentum", [[0, 1, 2]], 4, 4, ("sgd", 0.2, 0.9), None),
     ("d1_m2_sgd", [[3]], 2, 3, ("sgd", 0.5, 0.0), None)],
    [("d2_m3_flush", [[0, 1]], 3, 4, ("sgd", 0.5, 0.0), 2),
     ("d2_m2_adam", [[2, 3]], 2, 4, ("adam", 0.02, 0.0), None)],
    [("dp2_d2_m2_sgd", [[0, 1], [2, 3]], 2, 3, ("sgd", 0.5, 0.0), None)],
    [("d2_m3_full_recompute_adam", [[0, 1]], 3, 4, ("adam", 0.02, 0.0), None),
     ("d2_m2_selective_recompute_sgd", [[2, 3]], 2, 4, ("sgd", 0.5, 0.0), None)],
]
# activation recomputation: the recomputed forward must use the version the microbatch's forward used
RECOMPUTE = {"d2_m3_full_recompute_adam": "full", "d2_m2_selective_recompute_sgd": "selective"}
SCENARIOS = {s[0]: s for round_ in ROUNDS for s in round_}


def _runtime_worker(rank, world, store, out_dir):
    try:
        _init(rank, world, store, 60)
        for round_ in ROUNDS:
            mine = None
            for name, pipelines, m, batches, opt_spec, flush_after in round_:
                groups = [dist.new_group(ranks) for ranks in pipelines]
                dp_groups = ([dist.new_group([p[i] for p in pipelines]) for i in range(len(pipelines[0]))]
                             if len(pipelines) > 1 else None)
                for replica, ranks in enumerate(pipelines):
                    if rank in ranks:
                        stage = ranks.index(rank)
                        mine = (name, len(ranks), stage, replica, groups[replica],
                                dp_groups[stage] if dp_groups else None, m, batches, opt_spec, flush_after)
            if mine is not None:
                _run_scenario(rank, out_dir, *mine)
            dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        with open(os.path.join(out_dir, f"error_rank{rank}.txt"), "w") as f:
            f.write(traceback.format_exc())
        raise


def _run_scenario(rank, out_dir, name, d, stage, replica, group, dp_group, m, batches, opt_spec, flush_after):
    module = build_stages(d)[stage]
    set_recompute(module, RECOMPUTE.get(name, "none"))
    pipe = TwoBWPipeline(module, stage, d, group, m, loss_fn, optimizer_factory(opt_spec), dp_group=dp_group)
    ids, targets = make_data(batches, m * MICRO_BATCH, seed=replica)
    hook_calls = []
    pipe.before_update = lambda params: hook_calls.append(
        (pipe.newest_version, sum(p.grad is not None for p in params.values()), len(params)))
    losses = []
    for t in range(batches):
        losses.append(pipe.step(ids[t] if stage == 0 else None, targets[t] if stage == d - 1 else None))
        if flush_after is not None and t + 1 == flush_after:
            pipe.flush()
    pipe.flush()
    misuse = []
    if d == 1:  # wrong calls are refused with a message, before anything is sent
        for call in (lambda: pipe.step(ids[0][:3], targets[0][:3]), lambda: pipe.step(None, targets[0])):
            try:
                call()
            except (ConfigError, ValueError) as e:
                misuse.append(f"{type(e).__name__}: {e}")
    torch.save({"misuse": misuse, "params": {n: p.detach().clone() for n, p in pipe.newest_parameters().items()},
                "log": [tuple(a) for a in pipe.log], "losses": losses, "hook_calls": hook_calls,
                "max_in_flight": pipe.max_in_flight, "max_versions_alive": pipe.max_versions_alive,
                "newest_version": pipe.newest_version, "stage": stage, "replica": replica},
               os.path.join(out_dir, f"{name}_r{replica}_s{stage}.pt"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("twobw")
    codes = spawn(_runtime_worker, 4, (str(out / "store"), str(out)), timeout=240)  # under pytest-timeout (300 s)
    errors = "".join(p.read_text() for p in out.glob("error_rank*.txt"))
    assert codes == [0] * 4, f"exit codes {codes}\n{errors}"
    return {f.stem: torch.load(f) for f in out.glob("*_r*_s*.pt")}


def _results(runs, name):
    _, pipelines, *_ = SCENARIOS[name]
    return [[runs[f"{name}_r{r}_s{s}"] for s in range(len(pipelines[0]))] for r in range(len(pipelines))]


# ---------------------------------------------------------------- runtime tests
@pytest.mark.parametrize("name", [n for n in SCENARIOS if not n.startswith("dp")])
def test_parameters_follow_the_2bw_update_rule(runs, name):
    _, pipelines, m, batches, opt_spec, flush_after = SCENARIOS[name]
    (result,) = _results(runs, name)
    d = len(pipelines[0])
    ids, targets = make_data(batches, m * MICRO_BATCH, seed=0)
    expected, expected_losses = simulate(d, m, ids, targets, opt_spec)
    vanilla, _ = simulate(d, m, ids, targets, opt_spec, stale=False)
    gap = 0.0
    for stage in range(d):
        got = result[stage]["params"]
        assert got.keys() == expected[stage].keys()
        for n in got:
            torch.testing.assert_close(got[n], expected[stage][n], **TOL,
                                       msg=lambda s: f"{name} stage {stage} {n}: {s}")
            gap = max(gap, (vanilla[stage][n] - expected[stage][n]).abs().max().item())
        assert result[stage]["newest_version"] == batches
        # before_update ran once per update, before it, with every parameter holding its gradient
        n = len(got)
        assert result[stage]["hook_calls"] == [(t, n, n) for t in range(batches)]
    # The comparison can tell the stale rule from vanilla SGD/Adam on this model.
    assert gap > 1e3 * TOL["atol"], f"{name}: 2BW and vanilla differ by only {gap}"
    torch.testing.assert_close(result[-1]["losses"], expected_losses, **TOL)


def test_data_parallel_replicas_average_gradients(runs):
    name = "dp2_d2_m2_sgd"
    _, pipelines, m, batches, opt_spec, _ = SCENARIOS[name]
    results = _results(runs, name)
    data = [make_data(batches, m * MICRO_BATCH, seed=r) for r in range(2)]
    ids = torch.cat([data[0][0], data[1][0]], dim=1)
    targets = torch.cat([data[0][1], data[1][1]], dim=1)
    expected, losses = simulate(2, 2 * m, ids, targets, opt_spec)
    for replica in results:
        for stage, result in enumerate(replica):
            for n, p in result["params"].items():
                torch.testing.assert_close(p, expected[stage][n], **TOL)
    mean_loss = [(a + b) / 2 for a, b in zip(results[0][-1]["losses"], results[1][-1]["losses"])]
    torch.testing.assert_close(mean_loss, losses, **TOL)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_each_microbatch_uses_one_version_everywhere(runs, name):
    _, _, m, _, _, _ = SCENARIOS[name]
    for replica in _results(runs, name):
        seen = {}
        for result in replica:
            for kind, k, version in result["log"]:
                if kind in "FB":
                    seen.setdefault(k, set()).add(version)
                    assert version == max(k // m - 1, 0), f"{kind}{k} on stage {result['stage']} used v{version}"
        assert all(len(v) == 1 for v in seen.values())
        for result in replica:  # one forward and one backward of every microbatch on every stage
            kinds = sorted((k, kind) for kind, k, _ in result["log"] if kind in "FB")
            assert kinds == sorted((k, kind) for k in seen for kind in "FB")


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_runtime_runs_the_generated_schedule(runs, name):
    _, pipelines, m, batches, _, flush_after = SCENARIOS[name]
    d = len(pipelines[0])
    for replica in _results(runs, name):
        for stage, result in enumerate(replica):
            expected, empty = [], True
            for t in range(batches):
                expected += sched.step_actions(stage, d, m, t, empty)
                empty = False
                if flush_after is not None and t + 1 == flush_after:
                    expected += sched.flush_actions(stage, d, m, t + 1)
                    empty = True
            expected += sched.flush_actions(stage, d, m, batches) if not empty else []
            assert result["log"] == [tuple(a) for a in expected]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_at_most_two_versions_and_d_minus_r_microbatches_in_flight(runs, name):
    _, pipelines, _, batches, _, _ = SCENARIOS[name]
    d = len(pipelines[0])
    for replica in _results(runs, name):
        for stage, result in enumerate(replica):
            in_flight, newest, most = {}, 0, 1
            for kind, k, version in result["log"]:  # replay the log independently of the runtime's counters
                if kind == "F":
                    in_flight[k] = version
                elif kind == "B":
                    del in_flight[k]
                else:
                    newest = version
                most = max(most, len({newest, *in_flight.values()}))
                assert len(in_flight) <= d - stage
            assert most == result["max_versions_alive"] <= 2
            assert result["max_in_flight"] == d - stage
            if batches >= 2:  # a new version while older microbatches are still in flight
                assert most == 2


def test_bad_calls_are_refused(runs):
    (result,) = _results(runs, "d1_m2_sgd")
    assert result[0]["misuse"] == [
        "ConfigError: microbatches: must divide the batch size of inputs (3 rows, m=2)",
        "ValueError: inputs: the first pipeline stage must pass inputs to step()"]


def test_fewer_microbatches_than_stages_is_refused():
    with pytest.raises(ConfigError) as err:
        TwoBWPipeline(nn.Linear(2, 2), 0, 4, None, 3, loss_fn, optimizer_factory(("sgd", 0.1, 0.0)))
    assert err.value.field == "microbatches" and "m=3 < d=4" in str(err.value)


def _failing_peer_worker(rank, world, store, out_dir, mode):
    _init(rank, world, store, 3)
    pipe = TwoBWPipeline(build_stages(2)[rank], rank, 2, None, 2, loss_fn, optimizer_factory(("sgd", 0.1, 0.0)))
    ids, targets = make_data(3, 2 * MICRO_BATCH, seed=0)
    dist.barrier()
    if rank == 1:
        if mode == "dies":
            os._exit(7)
        time.sleep(120)  # hangs; the harness kills it
    start = time.monotonic()
    try:
        for t in range(3):
            pipe.step(ids[t], None)
        pipe.flush()
        outcome = "returned"
    except RuntimeError as e:
        outcome = f"raised after {time.monotonic() - start:.1f} s: {e}"
    with open(os.path.join(out_dir, "outcome.txt"), "w") as f:
        f.write(outcome)


@pytest.mark.parametrize("mode", ["dies", "hangs"])
def test_a_failing_peer_makes_step_raise(tmp_path, mode):
    codes = spawn(_failing_peer_worker, 2, (str(tmp_path / "store"), str(tmp_path), mode),
                  wait_for=[0], timeout=120)
    assert codes[0] == 0, "stage 0 did not finish: it hung or crashed"
    outcome = (tmp_path / "outcome.txt").read_text()
    assert outcome.startswith("raised") and "2BW stage 0" in outcome, outcome
    print(mode, outcome)


def test_a_peer_gone_before_an_operation_is_posted_is_reported_with_the_stage(monkeypatch):
    """gloo can fail the posting of a send or receive itself (a peer already gone: connection reset), not only the
    wait; that error too names the stage and what it was doing."""
    pipe = TwoBWPipeline.__new__(TwoBWPipeline)  # only what posting reads: no process group needed
    pipe.stage_index, pipe.group, pipe.timeout, pipe._sends = 0, None, None, []

    def gone(*args, **kwargs):
        raise RuntimeError("Connection reset by peer")

    monkeypatch.setattr(dist, "isend", gone)
    monkeypatch.setattr(dist, "irecv", gone)
    with pytest.raises(RuntimeError, match="^2BW stage 0: failed while sending to stage 1: Connection reset"):
        pipe._isend(torch.zeros(1), 1)
    with pytest.raises(RuntimeError, match="^2BW stage 0: failed while receiving it: Connection reset"):
        pipe._complete("receiving it", dist.irecv, torch.zeros(1), group=None, group_src=1)
    assert pipe._sends == []


# ---------------------------------------------------------------- schedule generator
CASES = [(1, 1), (1, 3), (2, 2), (2, 5), (3, 3), (4, 4), (4, 8), (8, 8), (4, 6)]


@pytest.mark.parametrize("d,m", CASES)
def test_schedule_is_1f1b_with_warmup_and_executable(d, m):
    per_stage = sched.schedule(d, m, batches=3)
    sched.timeline(per_stage)  # raises on deadlock
    for r, actions in enumerate(per_stage):
        fb = [a.kind for a in actions if a.kind != "U"]
        w = d - r - 1
        assert fb[:w] == ["F"] * w and fb[w:w + 2] == ["F", "B"]
        steady = fb[w:len(fb) - w]
        assert steady == ["F", "B"] * (len(steady) // 2), f"stage {r} is not 1F1B"
        assert fb[len(fb) - w:] == ["B"] * w
        for a in actions:
            if a.kind in "FB":
                assert a.version == max(a.index // m - 1, 0)
        updates = [(i, a) for i, a in enumerate(actions) if a.kind == "U"]
        assert [a.index for _, a in updates] == [0, 1, 2] and [a.version for _, a in updates] == [1, 2, 3]
        for i, a in updates:  # each update follows the backward of its batch's last microbatch
            assert actions[i - 1] == ("B", a.index * m + m - 1, max(a.index - 1, 0))


def test_schedule_matches_figure_2_of_the_paper():
    """d = m = 4 (paper Fig. 2, inputs 1-indexed there): the new version appears after the backward
    of input 4 and is first used by the forward of input 9; inputs 5–8 still use W(0)."""
    stage0 = sched.schedule(4, 4, batches=3)[0]
    u0 = stage0.index(("U", 0, 1))
    assert stage0[u0 - 1] == ("B", 3, 0)
    first_v1 = next(a for a in stage0 if a.kind == "F" and a.version == 1)
    assert first_v1.index == 8
    assert all(a.version == 0 for a in stage0 if a.kind == "F" and 4 <= a.index < 8)


def test_steady_state_has_no_flush_bubble():
    """Without flushes, with equal stage times, every stage completes one batch per m·(t_F + t_B)
    once the pipeline is full."""
    d, m, f, b = 4, 4, 1.0, 2.0
    per_stage = sched.timeline(sched.schedule(d, m, batches=6), forward=f, backward=b)
    for r, timed in enumerate(per_stage):
        updates = [end for a, _, end in timed if a.kind == "U"]
        gaps = [later - earlier for earlier, later in zip(updates, updates[1:])][1:-1]
        assert gaps == [m * (f + b)] * len(gaps), f"stage {r}: {gaps}"


def test_schedule_refuses_fewer_microbatches_than_stages():
    with pytest.raises(ConfigError, match="microbatches"):
        sched.schedule(4, 3, batches=1)


# ---------------------------------------------------------------- PipeDream-Flush on the same engine
@pytest.mark.parametrize("d,m", [(2, 2), (2, 5), (4, 4), (4, 9)])
def test_flush_schedule_drains_every_batch_and_keeps_one_version(d, m):
    per_stage = sched.flush_schedule(d, m, batches=3)
    sched.timeline(per_stage)  # executable: raises on a deadlock
    for r, actions in enumerate(per_stage):
        updates = [i for i, a in enumerate(actions) if a.kind == "U"]
        assert [actions[i].index for i in updates] == [0, 1, 2]
        for t, end in enumerate(updates):  # every microbatch of batch t is done before update t, none of t + 1
            done = {a.index for a in actions[:end] if a.kind == "B"}
            assert set(range(t * m, t * m + m)) <= done and not done & set(range((t + 1) * m, (t + 2) * m))
        assert all(a.version == a.index // m for a in actions if a.kind != "U")  # batch t on version t


@pytest.mark.parametrize("d,m", [(2, 2), (2, 8), (4, 4), (4, 16), (8, 8)])
def test_batch_times_of_2bw_and_flush_with_equal_stages(d, m):
    """Equal stages, free communication: 2BW's steady batch takes m·(f + b), Flush's (m + d − 1)·(f + b)."""
    f, b = 1.0, 2.0
    assert sched.batch_time(sched.schedule(d, m, 5), f, b) == pytest.approx(m * (f + b))
    assert sched.batch_time(sched.flush_schedule(d, m, 5), f, b) == pytest.approx((m + d - 1) * (f + b))


@pytest.mark.parametrize("d,m", [(2, 2), (2, 8), (4, 4), (4, 16)])
def test_a_tied_embedding_makes_2bw_wait_for_the_first_stages_update_and_leaves_flush_as_it_was(d, m):
    """The first and last stage all-reduce the tied embedding's gradient at each update: under 2BW the last stage
    then waits each batch for the batch's last gradient to cross stages d − 2 … 0, (d − 1)·b; Flush already waits."""
    f, b, u = 1.0, 2.0, 0.25
    untied, tied = (sched.batch_time(sched.schedule(d, m, 6), f, b, u, tied=t) for t in (False, True))
    assert untied == pytest.approx(m * (f + b) + u) and tied == pytest.approx(untied + (d - 1) * b)
    flush = [sched.batch_time(sched.flush_schedule(d, m, 6), f, b, u, tied=t) for t in (False, True)]
    assert flush[0] == pytest.approx(flush[1]) == pytest.approx((m + d - 1) * (f + b) + u)


def test_batch_time_takes_per_stage_times_and_needs_three_batches():
    slow_last = sched.batch_time(sched.flush_schedule(2, 4, 4), [1.0, 2.0], [2.0, 4.0])
    assert slow_last == pytest.approx(4 * 6.0 + 3.0)  # m·t_max + the other stage's fill and drain
    with pytest.raises(ValueError):
        sched.batch_time(sched.flush_schedule(2, 4, 2))
