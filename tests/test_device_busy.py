"""distperf.measure.device_busy: a one-device step's wall time beside the time its device was busy. Here, without a
GPU, the same code runs on the CPU, where no device event exists; the busy intervals are the union of the device
events alone."""
from types import SimpleNamespace

import pytest
import torch

from distperf.config import Config, Layout
from distperf.measure import device_busy
from distperf.presets import model

CUDA, CPU = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU


def event(start, end, kind):
    return SimpleNamespace(time_range=SimpleNamespace(start=start, end=end), device_type=kind)


def test_busy_intervals_are_the_union_of_device_events_alone():
    events = [event(0, 10, CUDA), event(5, 20, CUDA), event(30, 35, CUDA), event(0, 100, CPU)]
    assert device_busy.busy_intervals(events) == [(0, 20), (30, 35)]
    assert device_busy.device_events(events) == 3


def test_a_cpu_step_is_timed_and_has_no_device_time():
    cfg = Config(model=model("tiny"), layout=Layout(micro_batch=2, microbatches=1))
    out = device_busy.step_profile(cfg, steps=2, warmup=1, device="cpu")
    assert out["wall_s"] > 0 and out["busy_s"] == 0 and out["device_events"] == 0 and out["steps"] == 2


def test_more_than_one_device_or_no_cuda_is_refused_with_the_field():
    with pytest.raises(ValueError, match="layout"):
        device_busy.step_profile(Config(model=model("tiny"), layout=Layout(dp=2)), device="cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device"):
            device_busy.step_profile(Config(model=model("tiny")))
