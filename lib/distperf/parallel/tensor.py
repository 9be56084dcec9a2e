"""Megatron-style tensor parallelism, and sequence parallelism, through DTensor ``parallelize_module``.

Per layer (Shoeybi et al. 2019, §3): ``attn.qkv`` and ``mlp.fc`` column-parallel (weights and biases
sharded by output column, each rank holding heads/t whole heads: see the head-major QKV layout in
:class:`distperf.model.Attention`), ``attn.proj`` and ``mlp.out`` row-parallel (weights sharded by
input row, biases replicated). Forward: one all-reduce after each row-parallel layer; backward: one
after each column-parallel layer. LayerNorms, embeddings and the head stay replicated (no
vocabulary parallelism).

Sequence parallelism (Korthikanti et al. 2022): the LayerNorm (and dropout) regions hold s/t of the
sequence: the column-parallel input is all-gathered along the sequence and the row-parallel output
reduce-scattered, instead of the two all-reduces. The residual stream between layers, and between
pipeline stages, is then a (b, s/t, h) shard; the embedding output is cut to the local positions before
the first layer, and gathered again before the head.
"""
from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                               SequenceParallel, parallelize_module)

from ..model import Transformer


def layer_plan(sequence_parallel: bool) -> dict:
    if not sequence_parallel:
        return {"attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel(),
                "mlp.fc": ColwiseParallel(), "mlp.out": RowwiseParallel()}
    return {"ln1": SequenceParallel(use_local_output=True),
            "attn.qkv": ColwiseParallel(input_layouts=Shard(1)),
            "attn.proj": RowwiseParallel(output_layouts=Shard(1)),
            "ln2": SequenceParallel(use_local_output=True),
            "mlp.fc": ColwiseParallel(input_layouts=Shard(1)),
            "mlp.out": RowwiseParallel(output_layouts=Shard(1))}


def apply_tensor_parallel(model: Transformer, tp_mesh: DeviceMesh, sequence_parallel: bool = False) -> Transformer:
    """Shard ``model`` (the whole model or one pipeline stage) over ``tp_mesh`` in place."""
    plan = {}
    for i in model.layers:
        plan.update({f"layers.{i}.{name}": style for name, style in layer_plan(sequence_parallel).items()})
    if sequence_parallel:
        if model.has_embed:
            first = next(iter(model.layers))
            plan[f"layers.{first}"] = PrepareModuleInput(input_layouts=(Replicate(),),
                                                         desired_input_layouts=(Shard(1),), use_local_output=True)
        if model.has_head:
            plan["ln_f"] = SequenceParallel(use_local_output=True)
            plan["head"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                              use_local_output=True)
    return parallelize_module(model, tp_mesh, plan)
