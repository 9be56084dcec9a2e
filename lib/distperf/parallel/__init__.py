"""Trainers on torch.distributed, one file per strategy family, all equal to a single-device reference.

- ``common``: the trainer interface (:class:`~distperf.parallel.common.Trainer`), run options, the
  optimizer, full-parameter gathering and model-state accounting;
- ``single``: the single-device reference (no torch.distributed);
- ``mesh``: process-group start-up and the ``pp × dp × tp`` DeviceMesh, and the order in which the
  parallelisms are applied;
- ``data``: data parallelism — DDP (bucket size), ZeRO-1 (``ZeroRedundancyOptimizer``), ZeRO-2/3
  (FSDP2 ``fully_shard``);
- ``tensor``: Megatron tensor parallelism and sequence parallelism through DTensor ``parallelize_module``;
- ``spmd``: the trainer for layouts without pipelining (dp × tp, any ZeRO stage);
- ``pipeline``: ``torch.distributed.pipelining`` schedules (GPipe, 1F1B, interleaved 1F1B) and
  PipeDream-2BW (``twobw``), each stage with its own tp and dp;
- ``partition``: pipeline partition policies;
- ``loop``: the training loop that every rank runs and the measurements it returns.

:func:`distperf.parallel.loop.build_trainer` picks the trainer for a configuration.
"""
