"""The analytical framework: parameters, FLOPs, memory, communication and time of distributed training.

Pure Python (no torch). One function per quantity, each stating the equation it implements and its
source; :func:`predict` assembles them for a :class:`~distperf.config.Config` on a
:class:`~distperf.hardware.Hardware`.
"""
from .predict import DDP_BUCKET_BYTES, clear_caches, predict

__all__ = ["DDP_BUCKET_BYTES", "clear_caches", "predict"]
