"""Named models: the papers' models and the small ones our CPU experiments train.

Sources: BERT (Devlin et al. 2019); GPT-2 (Radford et al. 2019); GPT-3 (Brown et al. 2020, Table 2.1);
Megatron-LM scaling table (Narayanan et al. 2021, Table 1: vocabulary 51,200, sequence 2,048);
PipeDream-2BW GPT models (Narayanan et al. 2021, arXiv 2006.09503, §5 and scripts/driver_sweep.py:
sequence 512, GPT-2 vocabulary).
"""
from __future__ import annotations

from .config import ConfigError, ModelSpec

GPT2_VOCAB = 50257
BERT_VOCAB = 30522
MEGATRON_VOCAB = 51200


def _gpt(name, layers, hidden, heads, vocab=GPT2_VOCAB, seq=1024, **kw):
    return ModelSpec(name=name, arch="gpt", layers=layers, hidden=hidden, heads=heads, vocab=vocab, seq=seq, **kw)


def _bert(name, layers, hidden, heads):
    return ModelSpec(name=name, arch="bert", layers=layers, hidden=hidden, heads=heads, vocab=BERT_VOCAB, seq=512)


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        _bert("bert-base", 12, 768, 12),
        _bert("bert-large", 24, 1024, 16),
        _gpt("gpt2", 12, 768, 12),
        _gpt("gpt2-medium", 24, 1024, 16),
        _gpt("gpt2-large", 36, 1280, 20),
        _gpt("gpt2-xl", 48, 1600, 25),
        _gpt("gpt3-175b", 96, 12288, 96, seq=2048),
        # Megatron-LM (Narayanan et al. 2021), Table 1.
        _gpt("megatron-1.7b", 24, 2304, 24, MEGATRON_VOCAB, 2048),
        _gpt("megatron-3.6b", 30, 3072, 32, MEGATRON_VOCAB, 2048),
        _gpt("megatron-7.5b", 36, 4096, 32, MEGATRON_VOCAB, 2048),
        _gpt("megatron-18.4b", 40, 6144, 48, MEGATRON_VOCAB, 2048),
        _gpt("megatron-39.1b", 48, 8192, 64, MEGATRON_VOCAB, 2048),
        _gpt("megatron-76.1b", 60, 10240, 80, MEGATRON_VOCAB, 2048),
        _gpt("megatron-145.6b", 80, 12288, 96, MEGATRON_VOCAB, 2048),
        _gpt("megatron-310.1b", 96, 16384, 128, MEGATRON_VOCAB, 2048),
        _gpt("megatron-529.6b", 105, 20480, 128, MEGATRON_VOCAB, 2048),
        _gpt("megatron-1t", 128, 25600, 160, MEGATRON_VOCAB, 2048),
        # PipeDream-2BW GPT models (sequence 512).
        _gpt("2bw-gpt-355m", 24, 1024, 16, seq=512),
        _gpt("2bw-gpt-1.3b", 24, 2048, 16, seq=512),
        _gpt("2bw-gpt-2.2b", 32, 2304, 32, seq=512),
        _gpt("2bw-gpt-3.8b", 32, 3072, 32, seq=512),
        _gpt("2bw-gpt-28.3b", 2240, 1024, 16, seq=512),
        # Small models for CPU experiments: byte-level vocabulary (256).
        _gpt("tiny", 2, 32, 4, vocab=256, seq=16),
        _gpt("small", 4, 128, 4, vocab=256, seq=128),
        _gpt("medium", 8, 256, 8, vocab=256, seq=256),
        # Wide enough that matrix products, not each operator's fixed cost, fill most of a step on a CPU core
        # (the regime of the papers' GPU runs); the presets above are dominated by per-operator costs.
        _gpt("wide", 2, 1024, 16, vocab=256, seq=256),
        ModelSpec(name="bert-tiny", arch="bert", layers=2, hidden=32, heads=4, vocab=256, seq=16),
    ]
}


_BY_LOWER = {name.lower(): spec for name, spec in MODELS.items()}


def model(name: str) -> ModelSpec:
    """A preset by name, in any case (``GPT2`` is ``gpt2``)."""
    spec = MODELS.get(name) or (_BY_LOWER.get(name.lower()) if isinstance(name, str) else None)
    if spec is None:
        raise ConfigError("model", f"unknown preset {name!r}; known: {', '.join(MODELS)}")
    return spec
