"""PipeDream-2BW's update rule in one process, without a pipeline: the reference the 2BW trainer is
tested against, and what the book runs to tell the rule's effect on convergence from the trainer's.

Batch t's gradient is taken at W(max(t−1, 0)) and applied to W(t) by the same optimizer:
W(t+1) = W(t) − ν∇f(W(t−1)) (Narayanan et al. 2021, §3.1); for Adam the moments are fed that stale gradient.
"""
from __future__ import annotations

import torch

from ..config import Config, RunOptions
from ..tokens import make_source
from ..model import build_model, lm_loss
from .common import make_optimizer, split_rows


def simulate_2bw(cfg: Config, opts: RunOptions) -> dict:
    """Losses of each step (the mean over the global batch, at the weights that batch used) and the final
    parameters of the 2BW rule, with the global batch cut into dp replicas × m microbatches as the trainer does."""
    model, stale = build_model(cfg.model, opts.seed), build_model(cfg.model, opts.seed)
    optimizer = make_optimizer(model.parameters(), cfg.training, opts.lr)
    source = make_source(opts.data, cfg.model.vocab, cfg.model.seq, opts.seed)
    losses, dp, m = [], cfg.layout.dp, cfg.layout.microbatches
    for t in range(opts.steps):
        x, y = source.batch(t, cfg.layout.global_batch)
        stale.zero_grad()
        total = 0.0
        for r in range(dp):  # each replica's microbatches, gradients averaged over all of them
            for xi, yi in zip(split_rows(x, r, dp).chunk(m), split_rows(y, r, dp).chunk(m)):
                loss = lm_loss(stale(xi), yi) / (m * dp)
                loss.backward()
                total += loss.item()
        losses.append(total)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        for p, q in zip(model.parameters(), stale.parameters()):
            p.grad = q.grad.clone()
        optimizer.step()
        with torch.no_grad():  # the next batch's gradient is taken at this update's starting point
            for n, q in stale.named_parameters():
                q.copy_(before[n])
    return {"losses": losses, "parameters": {n: p.detach() for n, p in model.named_parameters()}}


def simulation_row(point: dict, cfg: Config, opts: RunOptions) -> dict:
    """What the book keeps of a :func:`simulate_2bw` run (``point`` names it in the result table): the losses of
    each step, the last one, and the wall time."""
    import json
    import time

    start = time.perf_counter()
    losses = simulate_2bw(cfg, opts)["losses"]
    return {"losses": json.dumps(losses), "final_loss": losses[-1], "wall_s": time.perf_counter() - start}
