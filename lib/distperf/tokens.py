"""Training data: a deterministic synthetic token stream and a small real English text corpus.

Every rank draws the whole global batch of a step from ``batch(step, size)`` (cheap at our sizes)
and keeps its own slice, so that all strategies see exactly the same tokens as the single-device
reference.

- ``synthetic``: sequences from a fixed random first-order Markov chain over the vocabulary, each
  token followed by one of ``branching`` successors chosen uniformly. The stream is learnable: the
  best possible loss is at most ln(branching) nats per token (less where successors repeat), which
  lets convergence runs see a floor. Drawn from (seed, step) alone, so any step can be reproduced.
- ``text``: the English documentation that CPython ships as ``pydoc_data.topics`` (the text behind
  ``help('topics')``; about 0.47 MB), under the PSF License Agreement (CPython's LICENSE). It is part
  of every Python installation, so it is available offline; its exact content depends on the Python
  release, hence :attr:`TextCorpus.sha256`. Tokenized as UTF-8 bytes (vocabulary 256). The first 90 %
  of the bytes are for training, the rest for validation (``held_out``); batches are random windows of
  seq + 1 bytes.
"""
from __future__ import annotations

import hashlib
import sys

import torch

from .config import DATA_SOURCES



def _generator(seed: int, *keys) -> torch.Generator:
    digest = hashlib.sha256(":".join(str(k) for k in (seed, *keys)).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


def encode(text: str) -> torch.Tensor:
    """Byte-level tokenizer: UTF-8 bytes as token ids 0…255."""
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()


def decode(tokens) -> str:
    return bytes(int(t) for t in tokens).decode("utf-8", errors="replace")


def split(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of next-token prediction from sequences of seq + 1 tokens."""
    return tokens[:, :-1], tokens[:, 1:]


class SyntheticTokens:
    """Deterministic Markov-chain token stream (see the module docstring)."""

    name = "synthetic"

    def __init__(self, vocab: int, seq: int, seed: int = 0, branching: int = 4):
        self.vocab, self.seq, self.seed, self.branching = vocab, seq, seed, branching
        self.successors = torch.randint(vocab, (vocab, branching), generator=_generator(seed, "chain"))

    def batch(self, step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = _generator(self.seed, "batch", step)
        tokens = torch.empty(size, self.seq + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(self.vocab, (size,), generator=g)
        choice = torch.randint(self.branching, (size, self.seq), generator=g)
        for t in range(self.seq):
            tokens[:, t + 1] = self.successors[tokens[:, t], choice[:, t]]
        return split(tokens)

    def held_out(self, index: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Held-out batch ``index``: drawn like a training batch from steps training never reaches (negative)."""
        return self.batch(-1 - index, size)

    def describe(self) -> dict:
        return {"source": self.name, "vocab": self.vocab, "branching": self.branching, "seed": self.seed}


class TextCorpus:
    """CPython's ``pydoc_data.topics`` as a byte stream (see the module docstring)."""

    name = "text"
    licence = "PSF License Agreement (CPython LICENSE)"

    def __init__(self, seq: int, seed: int = 0, part: str = "train"):
        from pydoc_data.topics import topics

        text = "\n\n".join(topics[k] for k in sorted(topics))
        data = encode(text)
        self.sha256 = hashlib.sha256(text.encode("utf-8")).hexdigest()
        cut = int(0.9 * len(data))
        self.tokens = data[:cut] if part == "train" else data[cut:]
        self.seq, self.seed, self.part = seq, seed, part
        if len(self.tokens) <= seq + 1:
            raise ValueError(f"the {part} text ({len(self.tokens)} bytes) is shorter than seq + 1 ({seq + 1})")

    def batch(self, step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = _generator(self.seed, "text", self.part, step)
        starts = torch.randint(len(self.tokens) - self.seq - 1, (size,), generator=g)
        offsets = torch.arange(self.seq + 1)
        return split(self.tokens[starts[:, None] + offsets])

    def held_out(self, index: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Held-out batch ``index``: random windows of the validation text (the last 10 %, never trained on)."""
        if self.part != "validation":
            if not hasattr(self, "_validation"):
                self._validation = TextCorpus(self.seq, self.seed, part="validation")
            return self._validation.held_out(index, size)
        return self.batch(index, size)

    def describe(self) -> dict:
        return {"source": self.name, "corpus": "pydoc_data.topics", "python": sys.version.split()[0],
                "bytes": len(self.tokens), "sha256": self.sha256, "licence": self.licence, "part": self.part}


def make_source(kind: str, vocab: int, seq: int, seed: int = 0):
    """The data source ``kind`` (``synthetic`` or ``text``) for a model with this vocabulary and length."""
    if kind == "synthetic":
        return SyntheticTokens(vocab, seq, seed)
    if kind == "text":
        if vocab < 256:
            raise ValueError(f"the byte-level text needs vocab >= 256, got {vocab}")
        return TextCorpus(seq, seed)
    raise ValueError(f"data must be one of {', '.join(DATA_SOURCES)}, got {kind!r}")
