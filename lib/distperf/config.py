"""One description of an experiment, shared by the cost model and the trainers.

A configuration is a model (:class:`ModelSpec`), a parallel layout (:class:`Layout`), a training
setting (:class:`Training`) and the hardware (see :mod:`distperf.hardware`). The cost model and the
trainers both read these objects, so prediction and measurement always talk about the same shapes.

This module is pure Python (no torch import): the cost model sweeps 10^5 configurations with it.
Every rule a layout must obey lives in :func:`validate`, which raises :class:`ConfigError` naming
the field and the rule; command lines print that one line and exit with status 2.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

ARCHS = ("gpt", "bert")
ATTENTIONS = ("sdpa", "math")  # distperf.model.Attention: fused scaled_dot_product_attention, or unfused
SCHEDULES = ("none", "gpipe", "1f1b", "interleaved", "2bw", "2bw-flush", "pipedream")
# the schedules our hand-written engine runs (distperf.parallel.twobw): PipeDream-2BW, and PipeDream-Flush on the
# same code (a flush every step, one weight version), so that the two compare without an engine between them
TWOBW_ENGINE = ("2bw", "2bw-flush")
RECOMPUTE = ("none", "selective", "full")
PRECISIONS = ("fp32", "mixed")
OPTIMIZERS = ("adam", "sgd")
DATA_SOURCES = ("synthetic", "text")  # distperf.tokens
DEVICES = ("auto", "cpu", "cuda")
MESH_ORDERS = ("pp,dp,tp", "dp,pp,tp")  # distperf.parallel.mesh
# Memory by category, the same names in the cost model, the trainers, the measurement and the book:
MODEL_STATES = ("parameters", "gradients", "optimizer_states")
MEMORY_CATEGORIES = MODEL_STATES + ("activations",)
COMMUNICATION_KINDS = ("data_parallel", "tensor_parallel", "pipeline_parallel")
# what a measured step's time is split into (distperf.measure.breakdown)
TIME_CLASSES = ("matrix_products", "attention", "other_operators", "optimizer", "communication", "framework")
DDP_BUCKET_MB = 25  # torch DDP's bucket_cap_mb default (MiB): the default communication block size
# The largest sizes accepted. Model dimensions up to 2^24 keep every product the cost model forms (layers · hidden² ·
# seq · batch …) far inside a float's range; 2^20 devices (a million) is beyond any cluster and what the planner
# searches in well under a second; batches up to 2^30 samples. Bucket sizes from one byte to 1 TiB.
# Pipeline stages up to 2^14: deeper than any published model has layers (PipeDream-2BW's deepest GPT has 2,240),
# and what the planner prices per stage within a second.
MAX_DIMENSION = 2**24
MAX_DEVICES = 2**20
MAX_STAGES = 2**14
MAX_BATCH = 2**30
BUCKET_MB_RANGE = (2.0**-20, 2.0**20)


class ConfigError(ValueError):
    """A configuration that breaks a rule: ``field`` names the input, the message states the rule."""

    def __init__(self, field_name: str, rule: str):
        self.field = field_name
        self.rule = rule
        super().__init__(f"{field_name}: {rule}")


@dataclass(frozen=True)
class ModelSpec:
    """A Transformer: GPT (causal decoder) or BERT-style encoder.

    ``ffn`` defaults to 4·hidden; ``tied`` ties the output projection to the token embedding;
    positions are learned (s·h parameters), as in GPT-2, BERT and Megatron-LM. ``attention`` is how the
    attention core runs (one of :data:`ATTENTIONS`): ``sdpa``, torch's fused ``scaled_dot_product_attention``,
    which keeps no s×s scores for backward; ``math``, the explicit softmax(QKᵀ/√d)·V that Korthikanti et al.
    2022 count (:class:`distperf.model.Attention`).
    """

    name: str = "custom"
    arch: str = "gpt"
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    vocab: int = 256
    seq: int = 64
    ffn: int = 0  # 0 means 4 * hidden
    tied: bool = True
    dropout: float = 0.0
    attention: str = "sdpa"

    def __post_init__(self):
        if self.ffn == 0:
            object.__setattr__(self, "ffn", 4 * self.hidden)
        # the cost model keys its caches on the model: hash the fields once, not on every lookup
        object.__setattr__(self, "_hash", hash((self.name, self.arch, self.layers, self.hidden, self.heads, self.vocab,
                                                self.seq, self.ffn, self.tied, self.dropout, self.attention)))

    def __hash__(self) -> int:
        return self._hash

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


@dataclass(frozen=True)
class Layout:
    """How the model is spread over dp × tp × pp ranks and how a global batch is cut.

    global batch B = micro_batch · microbatches · dp.  ``partition`` lists the Transformer layers of
    each pipeline stage (pp · chunks entries; embedding on the first stage, head on the last); empty
    means uniform.
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    sequence_parallel: bool = False
    schedule: str = "none"
    chunks: int = 1
    micro_batch: int = 1
    microbatches: int = 1
    zero: int = 0
    recompute: str = "none"
    partition: tuple[int, ...] = ()

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.microbatches * self.dp

    @property
    def stages(self) -> int:
        """Pipeline stages (model chunks) in all: pp · chunks."""
        return self.pp * self.chunks


@dataclass(frozen=True)
class Training:
    precision: str = "fp32"
    optimizer: str = "adam"
    momentum: bool = True  # SGD only


@dataclass(frozen=True)
class Config:
    model: ModelSpec = field(default_factory=ModelSpec)
    layout: Layout = field(default_factory=Layout)
    training: Training = field(default_factory=Training)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        """The configuration :meth:`to_dict` wrote (JSON), validated."""
        layout = {**d["layout"], "partition": tuple(d["layout"]["partition"])}
        return validate(cls(model=ModelSpec(**d["model"]), layout=Layout(**layout), training=Training(**d["training"])))

    def replace(self, **sections) -> "Config":
        return replace(self, **sections)


def needs_distributed(cfg: Config) -> bool:
    """Whether the layout needs torch.distributed (the single-device reference does not)."""
    lay = cfg.layout
    return lay.world_size > 1 or lay.zero > 0


@dataclass(frozen=True)
class RunOptions:
    """What a run needs besides the configuration (``python -m distperf run``'s run flags)."""

    steps: int = 5
    seed: int = 0
    lr: float = 1e-3
    bucket_mb: float = float(DDP_BUCKET_MB)  # DDP gradient bucket (MiB): the "communication block size"
    data: str = "synthetic"  # one of DATA_SOURCES
    device: str = "auto"  # one of DEVICES
    warmup: int = 1  # steps left out of the timing statistics
    timeout_s: float = 300.0
    measure: bool = False  # memory and communication steps after the timed ones (distperf.measure.steps)
    breakdown: bool = False  # without measure, still the CPU step whose time is broken down by class (the same)
    mesh_order: str = "pp,dp,tp"  # placement of ranks on the mesh, slowest-varying first (one of MESH_ORDERS)
    eval_batches: int = 0  # held-out batches evaluated after training (distperf.parallel.held_out)
    trace: str | None = None  # where to write the first breakdown step's timeline (distperf.measure.timeline)


MAX_EVAL_BATCHES = 10_000


def uniform_partition(layers: int, stages: int) -> tuple[int, ...]:
    """Layers per stage, as equal as possible, the remainder on the earliest stages."""
    base, extra = divmod(layers, stages)
    return tuple(base + (1 if i < extra else 0) for i in range(stages))


def stage_layers(model: ModelSpec, layout: Layout) -> tuple[int, ...]:
    """Transformer layers held by each pipeline stage (the explicit partition, or uniform)."""
    return tuple(layout.partition) if layout.partition else uniform_partition(model.layers, layout.stages)


def _positive(names: tuple[str, ...], values: tuple, most: int) -> None:
    """Each value an int in [1, most]."""
    if set(map(type, values)) == {int} and min(values) >= 1 and max(values) <= most:  # the common case, at C speed
        return
    for name, value in zip(names, values):
        if type(value) is not int or value < 1:  # type(): a bool is not a size
            raise ConfigError(name, f"must be a positive integer, got {value!r}")
        if value > most:
            raise ConfigError(name, f"must be at most {most:,} (2^{most.bit_length() - 1}), got {value:,}")


def check_finite(name: str, value, low: float, high: float) -> float:
    """``value`` as a float in [low, high]: a number, finite; else ConfigError naming ``name``."""
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(name, f"must be a number, got {value!r}") from None
    if not low <= number <= high:  # NaN fails both comparisons
        raise ConfigError(name, f"must be a finite number from {low:g} to {high:g}, got {value!r}")
    return number


# the model objects whose own rules held, by identity (an equal spec may differ in type: True == 1), kept alive so
# that an id is not reused: a sweep checks a handful of models 10^5 times
_VALID_MODELS: dict = {}


def _check_model(m: ModelSpec) -> None:
    """The rules of the model alone (remembered once they hold)."""
    if _VALID_MODELS.get(id(m)) is m:
        return
    if m.arch not in ARCHS:
        raise ConfigError("arch", f"must be one of {', '.join(ARCHS)}, got {m.arch!r}")
    _positive(("layers", "hidden", "heads", "vocab", "seq", "ffn"),
              (m.layers, m.hidden, m.heads, m.vocab, m.seq, m.ffn), MAX_DIMENSION)
    if not 0.0 <= m.dropout < 1.0:
        raise ConfigError("dropout", f"must lie in [0, 1), got {m.dropout!r}")
    if m.attention not in ATTENTIONS:
        raise ConfigError("attention", f"must be one of {', '.join(ATTENTIONS)}, got {m.attention!r}")
    if m.hidden % m.heads:
        raise ConfigError("heads", f"hidden ({m.hidden}) must be divisible by heads ({m.heads})")
    if len(_VALID_MODELS) > 1024:
        _VALID_MODELS.clear()
    _VALID_MODELS[id(m)] = m


def validate(cfg: Config) -> Config:
    """Check every rule; raise ConfigError(field, rule) at the first one broken; return cfg."""
    m, lay, tr = cfg.model, cfg.layout, cfg.training
    _check_model(m)
    dp, tp, pp, chunks, schedule = lay.dp, lay.tp, lay.pp, lay.chunks, lay.schedule
    b, microbatches = lay.micro_batch, lay.microbatches
    # the six sizes in one test (the common case: plain comparisons, no calls); when one is wrong, the rules in
    # turn name it
    sizes_hold = (type(dp) is type(tp) is type(chunks) is type(pp) is type(b) is type(microbatches) is int
                  and 0 < dp <= MAX_DEVICES and 0 < tp <= MAX_DEVICES and 0 < chunks <= MAX_DEVICES
                  and 0 < pp <= MAX_STAGES and 0 < b <= MAX_BATCH and 0 < microbatches <= MAX_BATCH)
    if not sizes_hold:
        _positive(("dp", "tp", "chunks"), (dp, tp, chunks), MAX_DEVICES)
        _positive(("pp",), (pp,), MAX_STAGES)
    stages = pp * chunks
    if stages > MAX_STAGES:
        raise ConfigError("chunks", f"pp·chunks (stages) must be at most {MAX_STAGES:,}, got {stages:,}")
    if not sizes_hold:
        _positive(("micro_batch", "microbatches"), (b, microbatches), MAX_BATCH)
    if dp * tp * pp > MAX_DEVICES:
        raise ConfigError("dp", f"dp·tp·pp (devices) must be at most {MAX_DEVICES:,}, got {dp * tp * pp:,}")
    if schedule not in SCHEDULES:
        raise ConfigError("schedule", f"must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if lay.recompute not in RECOMPUTE:
        raise ConfigError("recompute", f"must be one of {', '.join(RECOMPUTE)}, got {lay.recompute!r}")
    if lay.zero not in (0, 1, 2, 3):
        raise ConfigError("zero", f"must be 0, 1, 2 or 3, got {lay.zero!r}")
    if tr.precision not in PRECISIONS:
        raise ConfigError("precision", f"must be one of {', '.join(PRECISIONS)}, got {tr.precision!r}")
    if tr.optimizer not in OPTIMIZERS:
        raise ConfigError("optimizer", f"must be one of {', '.join(OPTIMIZERS)}, got {tr.optimizer!r}")
    heads, hidden, ffn = m.heads, m.hidden, m.ffn
    if heads % tp:
        raise ConfigError("tp", f"heads ({heads}) must be divisible by tp ({tp})")
    if hidden % tp or ffn % tp:
        raise ConfigError("tp", f"hidden ({hidden}) and ffn ({ffn}) must be divisible by tp ({tp})")
    if lay.sequence_parallel:
        if tp == 1:
            raise ConfigError("sequence_parallel", "needs tp > 1")
        if m.seq % tp:
            raise ConfigError("sequence_parallel", f"seq ({m.seq}) must be divisible by tp ({tp})")
    if pp > 1:
        if schedule == "none":
            raise ConfigError("schedule", "pp > 1 needs a pipeline schedule (gpipe, 1f1b, interleaved, 2bw, 2bw-flush, "
                                          "pipedream)")
    elif schedule not in ("none", "gpipe", "1f1b"):
        raise ConfigError("schedule", f"{schedule} needs pp > 1")
    if chunks > 1 and schedule != "interleaved":
        raise ConfigError("chunks", "more than one chunk per rank needs the interleaved schedule")
    if schedule == "interleaved" and chunks < 2:
        raise ConfigError("chunks", "the interleaved schedule needs chunks >= 2")
    if schedule in TWOBW_ENGINE and microbatches < pp:
        raise ConfigError("microbatches", f"{schedule} needs microbatches >= pp (m={microbatches} < pp={pp})")
    partition = lay.partition
    if partition:
        if len(partition) != stages:
            raise ConfigError("partition", f"needs {stages} entries (pp·chunks), got {len(partition)}")
        if any(not isinstance(n, int) or n < 1 for n in partition):
            raise ConfigError("partition", "every stage needs at least one layer")
        if sum(partition) != m.layers:
            raise ConfigError("partition", f"layers per stage must sum to layers ({m.layers}), got {sum(partition)}")
    elif m.layers < stages:
        raise ConfigError("pp", f"layers ({m.layers}) must be at least the number of stages ({stages})")
    return cfg


def validate_model(m: ModelSpec) -> ModelSpec:
    """Check the model's own rules (dimensions, arch, dropout, attention, heads dividing hidden); return it."""
    _check_model(m)
    return m


def global_batch_to_microbatches(global_batch: int, micro_batch: int, dp: int) -> int:
    """m = B / (b · dp); the rule: b · dp must divide B."""
    if type(global_batch) is not int or global_batch < 1:
        raise ConfigError("global_batch", f"must be a positive integer, got {global_batch!r}")
    if global_batch > MAX_BATCH * MAX_DEVICES:
        raise ConfigError("global_batch", f"must be at most {MAX_BATCH * MAX_DEVICES:,}, got {global_batch:,}")
    if global_batch % (micro_batch * dp):
        raise ConfigError("global_batch", f"must be divisible by micro_batch·dp ({micro_batch}·{dp}), got {global_batch}")
    return global_batch // (micro_batch * dp)
