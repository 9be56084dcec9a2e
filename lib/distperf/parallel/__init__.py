"""Trainers on torch.distributed, one file per strategy family, all equal to a single-device reference.

- ``mesh``: process-group start-up and the ``pp × dp × tp`` DeviceMesh;
- ``parallelize``: the one place that applies a layout's parallelisms to a model part, in order: tensor
  parallelism → recomputation → precision → data parallelism / ZeRO;
- ``tensor``: Megatron tensor parallelism and sequence parallelism through DTensor ``parallelize_module``;
- ``data_parallel``: data parallelism — DDP (bucket size), ZeRO-1 (``ZeroRedundancyOptimizer``), ZeRO-2/3
  (FSDP2 ``fully_shard``);
- ``common``: the trainer interface (:class:`~distperf.parallel.common.Trainer`), the optimizer, full-parameter
  gathering and model-state accounting;
- the trainers, which differ only in their schedule: ``single`` (the single-device reference, no
  torch.distributed), ``spmd`` (layouts without pipelining: gradient accumulation over dp × tp ranks),
  ``pipeline`` (``torch.distributed.pipelining`` schedules: GPipe, 1F1B, interleaved 1F1B; and PipeDream-2BW,
  ``twobw`` with its schedule as data in ``twobw_schedule`` and a single-process reference in
  ``twobw_reference``);
- ``partition``: pipeline partition policies; ``rules``: what the trainers refuse before any process starts;
- ``loop``: the training loop that every rank runs and the measurements it returns.

:func:`distperf.parallel.loop.build_trainer` picks the trainer for a configuration.
"""
