"""The memory anatomy of one device, as an experiment measured in the calling process (notebook
``memory_anatomy``, chapter "Memory anatomy of one device").

:func:`points` lays out the configurations: each axis (model, micro-batch, sequence length, precision,
recomputation, attention implementation) varied alone around a base, then precision × recomputation and attention × recomputation in full. :func:`measure_point` runs
the single-device reference trainer (:mod:`distperf.parallel.single`) for one warm-up and one measured step under
:func:`distperf.measure.memory.measure_step_memory` and returns the peak bytes of each category with the model's
shape. :func:`distperf.runner.sweep.sweep_points` runs them resumably.
"""
from __future__ import annotations

import itertools
from dataclasses import replace

AXES = ("model", "batch", "seq", "precision", "recompute", "attention")


def points(base: dict, axes: dict) -> list[dict]:
    """Each axis of ``axes`` varied alone around ``base`` (a model other than the base's keeps its own sequence
    length), then every precision with every recomputation, then every attention implementation (where ``axes``
    has them) with every recomputation; without repeats, in that order."""
    from .. import presets

    seen = []
    for axis, values in axes.items():
        for v in values:
            own_seq = {"seq": presets.model(v).seq} if axis == "model" and v != base["model"] else {}
            seen.append({**base, axis: v, **own_seq})
    for p, r in itertools.product(axes["precision"], axes["recompute"]):
        seen.append({**base, "precision": p, "recompute": r})
    for a, r in itertools.product(axes.get("attention", ()), axes["recompute"]):
        seen.append({**base, "attention": a, "recompute": r})
    return [c for i, c in enumerate(seen) if c not in seen[:i]]


def measure_point(point: dict, device: str = "cpu", scale: str = "") -> dict:
    """Peak bytes by category of one training step of the single-device trainer at ``point`` (keys of
    :data:`AXES`), with the model's shape and its parameter count."""
    import time

    import torch

    from .. import presets
    from ..config import Config, Layout, RunOptions, Training, validate
    from ..measure.memory import measure_step_memory
    from ..parallel.single import SingleDeviceTrainer

    spec = replace(presets.model(point["model"]), seq=point["seq"], attention=point.get("attention", "sdpa"))
    cfg = validate(Config(model=spec, layout=Layout(micro_batch=point["batch"], recompute=point["recompute"]),
                          training=Training(precision=point["precision"])))
    torch.manual_seed(0)
    trainer = SingleDeviceTrainer(cfg, RunOptions(seed=0), torch.device(device))
    tokens = torch.randint(0, spec.vocab, (point["batch"], spec.seq + 1), device=device)
    x, y = tokens[:, :-1], tokens[:, 1:]
    start = time.perf_counter()
    mem = measure_step_memory(trainer.model, trainer.optimizer, lambda: trainer.step(x, y), warmup=1, steps=1)
    mem.pop("other_devices", None)
    mem.pop("device")
    return dict(layers=spec.layers, hidden=spec.hidden, heads=spec.heads, vocab=spec.vocab, ffn=spec.ffn,
                dropout=spec.dropout, tied=spec.tied, optimizer=cfg.training.optimizer,
                parameter_count=sum(p.numel() for p in trainer.model.parameters()), **mem,
                seconds=time.perf_counter() - start, scale=scale)
