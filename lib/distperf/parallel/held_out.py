"""The loss of a trained run on held-out data, whatever its layout (``run --eval-batches N``).

Every rank hands over the whole parameters it holds (:meth:`~distperf.parallel.common.Trainer.full_parameters`:
a pipeline stage its layers, a tensor-parallel rank its gathered shards), the ranks exchange them, and each
rank loads them into the whole single-device model (:func:`distperf.model.build_model`, the names are the same)
and evaluates the mean next-token cross-entropy over ``N`` held-out batches of the global batch size, in eval
mode, without gradients. PipeDream-2BW is evaluated after ``finish()``, with its newest weight version. The
exchange pickles the parameters (``all_gather_object``): meant for the small models trained to convergence here.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..model import build_model, lm_loss


def gathered_parameters(trainer, distributed: bool) -> dict[str, torch.Tensor]:
    """{name: whole parameter on the CPU} of the whole model, from every rank's share. Collective."""
    mine = {name: p.detach().float().cpu() for name, p in trainer.full_parameters().items()}
    if not distributed:
        return mine
    shares = [None] * dist.get_world_size()
    dist.all_gather_object(shares, mine)
    return {name: p for share in shares for name, p in share.items()}


def held_out_loss(spec, trainer, source, batches: int, batch_size: int, distributed: bool) -> float:
    """Mean held-out loss (nats per token) of the trained weights over ``batches`` batches of ``source.held_out``.
    Collective when ``distributed``."""
    params = gathered_parameters(trainer, distributed)
    model = build_model(spec).eval()
    names = dict(model.named_parameters())  # a tied head shares the token embedding: one name for both
    missing = sorted(set(names) - set(params))
    if missing:
        raise RuntimeError(f"held-out loss: no rank holds {', '.join(missing[:3])}")
    with torch.no_grad():
        for name, p in names.items():
            p.copy_(params[name])
        losses = [float(lm_loss(model(x), y)) for x, y in (source.held_out(i, batch_size) for i in range(batches))]
    return sum(losses) / len(losses)
