"""Where a step's time goes (distperf.measure.breakdown): the classification on synthetic profiler events, and a
real step of the tiny model."""
from types import SimpleNamespace

import pytest
import torch
from dist_harness import spawn

from distperf import presets
from distperf.config import Config, Layout, RunOptions, validate
from distperf.measure import breakdown as bd
from distperf.measure.intervals import intersect, length, subtract, union
from distperf.parallel.single import SingleDeviceTrainer

MAIN, GLOO = 1, 2


def event(name, start, end, parent=None, thread=MAIN):
    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end), cpu_parent=parent,
                           thread=thread)


def test_intervals():
    assert union([(0, 2), (1, 3), (5, 6), (7, 7)]) == [(0, 3), (5, 6)]
    assert length(union([(0, 2), (1, 3)])) == 3
    assert subtract([(0, 10)], [(2, 3), (5, 6)]) == [(0, 2), (3, 5), (6, 10)]
    assert intersect([(0, 10)], [(2, 3), (9, 12)]) == [(2, 3), (9, 10)]


def test_each_operator_counts_once_under_its_outermost_class():
    linear = event("aten::linear", 0, 10)
    step = event("Optimizer.step#Adam.step", 30, 40)
    backward = event("autograd::engine::evaluate_function: AddmmBackward0", 10, 20)
    assert bd.classify(linear) == "matrix_products"
    assert bd.classify(event("aten::addmm", 1, 9, parent=linear)) is None  # counted by aten::linear
    assert bd.classify(event("aten::mm", 11, 19, parent=backward)) == "matrix_products"  # under an annotation
    assert bd.classify(event("aten::_scaled_dot_product_flash_attention_for_cpu", 0, 1)) == "attention"
    assert bd.classify(event("aten::layer_norm", 0, 1)) == "other_operators"
    assert bd.classify(step) == "optimizer"
    assert bd.classify(event("aten::mul_", 31, 32, parent=step)) == "optimizer"
    assert bd.classify(event("aten::empty", 31, 31.5, parent=event("aten::mul_", 31, 32, parent=step))) is None
    assert bd.classify(event("c10d::allreduce_", 0, 1)) == "communication"
    assert bd.classify(event("distperf.comm#3", 0, 1)) == "communication"
    assert bd.classify(backward) is None  # an annotation, not an operator
    redistribute = event("aten::mm", 0, 10)
    assert bd.classify(event("_c10d_functional::all_reduce", 2, 4, parent=redistribute)) == "communication"
    assert bd.classify(event("c10d::broadcast_", 31, 32, parent=step)) == "communication"  # ZeroRedundancyOptimizer


def test_the_classes_fill_the_window_and_waiting_on_gloo_is_communication():
    linear = event("aten::linear", 0, 10)
    events = [linear, event("aten::addmm", 1, 9, parent=linear), event("aten::gelu", 12, 14),
              event("Optimizer.step#Adam.step", 30, 40), event("c10d::allreduce_", 14, 15),
              event("gloo:all_reduce", 15, 25, thread=GLOO),  # in flight while the main thread is idle 15 … 25
              event("aten::add", 25, 26), event("aten::mm", 40, 50, thread=GLOO)]  # another thread's compute
    out = bd.breakdown(events, MAIN)
    us = 1e-6
    assert out["matrix_products"] == pytest.approx(10 * us) and out["other_operators"] == pytest.approx(3 * us)
    assert out["optimizer"] == pytest.approx(10 * us)
    assert out["communication"] == pytest.approx((1 + 10) * us)  # the call and the idle time while gloo runs
    assert out["framework"] == pytest.approx((2 + 4) * us)  # 10 … 12 and 26 … 30
    assert out["window"] == pytest.approx(40 * us)
    assert sum(out[c] for c in bd.CLASSES) == pytest.approx(out["window"])
    assert bd.breakdown(events, MAIN, steps=2)["window"] == pytest.approx(20 * us)
    assert bd.breakdown([], MAIN) == {**dict.fromkeys(bd.CLASSES, 0.0), "window": 0.0}


def test_a_collective_inside_an_operator_is_communication_not_the_operators():
    mm = event("aten::mm", 0, 10)
    out = bd.breakdown([mm, event("_c10d_functional::all_reduce", 2, 6, parent=mm), event("aten::gelu", 10, 12)],
                       MAIN)
    assert out["matrix_products"] == pytest.approx(6e-6) and out["communication"] == pytest.approx(4e-6)
    assert sum(out[c] for c in bd.CLASSES) == pytest.approx(out["window"])


def _profiled_tiny_step() -> bd.StepBreakdown:
    """A second step of the tiny model on one device, profiled."""
    torch.manual_seed(0)
    spec = presets.model("tiny")
    trainer = SingleDeviceTrainer(validate(Config(model=spec, layout=Layout(micro_batch=2))), RunOptions(seed=0),
                                  torch.device("cpu"))
    tokens = torch.randint(0, spec.vocab, (2, spec.seq + 1))
    trainer.step(tokens[:, :-1], tokens[:, 1:])
    with bd.StepBreakdown() as tracked:
        trainer.step(tokens[:, :-1], tokens[:, 1:])
    return tracked


def test_a_real_step_of_the_tiny_model():
    out = _profiled_tiny_step().summary()
    assert all(out[c] >= 0 for c in bd.CLASSES) and out["window"] > 0
    assert sum(out[c] for c in bd.CLASSES) == pytest.approx(out["window"], rel=1e-6)
    for c in ("matrix_products", "attention", "other_operators", "optimizer"):
        assert out[c] > 0, c  # one device: every kind of work but communication
    assert out["communication"] == 0


def _nest(events) -> list[tuple]:
    """Each event's name, thread, times and its parent's name, sorted: what breakdown reads of an event list."""
    return sorted((e.name, e.thread, e.time_range.start, e.time_range.end,
                   e.cpu_parent.name if e.cpu_parent is not None else None) for e in events)


def test_the_profilers_events_are_read_as_torchs_own_list_gives_them():
    tracked = _profiled_tiny_step()
    ours, theirs = bd.profiler_events(tracked._profiler), list(tracked._profiler.events())
    assert len(ours) > 100 and _nest(ours) == _nest(theirs)
    assert any(e.cpu_parent is not None and e.cpu_parent.cpu_parent is not None for e in ours)  # nested deep
    marker = next(e for e in ours if e.name == bd._MARKER)
    assert bd.breakdown(ours, marker.thread) == bd.breakdown(theirs, marker.thread)


def _waiting_receiver():
    import time

    import torch.distributed as dist

    dist.init_process_group("gloo")
    buffer = torch.zeros(1000)
    dist.all_reduce(buffer)  # gloo's first collective sets up its pairs
    rank = dist.get_rank()
    if rank == 1:
        time.sleep(2.0)  # rank 1 enters the step seconds after rank 0
    with bd.StepBreakdown() as tracked:
        if rank == 0:
            time.sleep(0.5)  # busy elsewhere: the receiver waits for it
            dist.send(buffer, 1)
        else:
            dist.irecv(buffer, 0).wait()
    return rank, tracked.summary()


def test_a_receivers_wait_is_communication_and_a_late_neighbour_is_not():
    """Rank 1 blocks about 0.5 s in Work.wait for rank 0's message: that is communication (not Python between
    operators: the wait runs in no operator); rank 0, which entered the step 2 s before rank 1, does not count those
    2 s (the window starts at the barrier after every rank's profiler started)."""
    for rank, out in spawn(_waiting_receiver, 2, timeout=60):
        assert out["window"] < 1.5, (rank, out)
        if rank == 1:
            assert out["communication"] > 0.4 and out["framework"] < 0.1, out
