"""The model the trainers run, the data it reads, and the pipeline partition policies (one process)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from distperf import presets
from distperf.config import Config, ConfigError, Layout, ModelSpec, validate
from distperf.tokens import SyntheticTokens, TextCorpus, decode, encode, make_source
from distperf.model import Attention, Block, build_model, build_stages, layer_input, lm_loss, set_recompute
from distperf.parallel.partition import balanced, flop_costs, parameter_costs, resolve

SPEC = ModelSpec(layers=4, hidden=32, heads=4, vocab=64, seq=8)


def _tokens(spec, batch=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(spec.vocab, (batch, spec.seq), generator=g)


# ---------------------------------------------------------------- shapes follow the conventions
def test_parameter_count_follows_the_conventions():
    h, f, V, s, L = SPEC.hidden, SPEC.ffn, SPEC.vocab, SPEC.seq, SPEC.layers
    layer = 4 * h * h + 2 * h * f + 9 * h + f
    assert layer == 12 * h * h + 13 * h
    assert sum(p.numel() for p in Block(SPEC).parameters()) == layer
    tied = build_model(SPEC)
    assert sum(p.numel() for p in tied.parameters()) == V * h + s * h + L * layer + 2 * h
    untied = build_model(replace(SPEC, tied=False))
    assert sum(p.numel() for p in untied.parameters()) == 2 * V * h + s * h + L * layer + 2 * h
    assert tied.head.weight is tied.tok.weight


def test_stages_hold_their_slice_with_the_whole_models_names_and_weights():
    whole = dict(build_model(SPEC, seed=3).named_parameters())
    stages = build_stages(SPEC, (1, 2, 1), seed=3)
    assert [s.layer_ids for s in stages] == [[0], [1, 2], [3]]
    assert hasattr(stages[0], "tok") and not hasattr(stages[1], "tok") and not hasattr(stages[0], "head")
    seen = set()
    for stage in stages:
        for name, p in stage.named_parameters():
            reference = whole["tok.weight"] if name == "head.weight" else whole[name]  # tied copy on the last stage
            assert torch.equal(p, reference), name
            seen.add(name)
    assert set(whole) <= seen


def test_chained_stages_compute_the_whole_model():
    whole, stages = build_model(SPEC, seed=1), build_stages(SPEC, (3, 1), seed=1)
    x = _tokens(SPEC)
    y = x
    for stage in stages:
        y = stage(y)
    torch.testing.assert_close(y, whole(x), rtol=1e-6, atol=1e-6)


def test_gpt_is_causal_and_bert_is_not():
    x = _tokens(SPEC)
    changed = x.clone()
    changed[:, -1] = (changed[:, -1] + 1) % SPEC.vocab
    gpt = build_model(SPEC)
    torch.testing.assert_close(gpt(x)[:, :-1], gpt(changed)[:, :-1])
    bert = build_model(replace(SPEC, arch="bert"))
    assert not torch.allclose(bert(x)[:, 0], bert(changed)[:, 0])


def test_qkv_is_head_major_so_a_column_shard_holds_whole_heads():
    """The first half of qkv's output rows computes the first half of the heads exactly."""
    attn = build_model(SPEC).layers["0"].attn
    x = layer_input(SPEC, 2, generator=torch.Generator().manual_seed(0))
    rows = 3 * SPEC.hidden // 2
    half = Attention(SPEC)
    half.qkv = torch.nn.Linear(SPEC.hidden, rows)
    with torch.no_grad():
        half.qkv.weight.copy_(attn.qkv.weight[:rows])
        half.qkv.bias.copy_(attn.qkv.bias[:rows])
    half.proj = torch.nn.Identity()
    full_heads = torch.nn.Identity()
    attn.proj, proj = full_heads, attn.proj
    torch.testing.assert_close(half(x), attn(x)[..., :SPEC.hidden // 2])
    attn.proj = proj


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_recomputation_keeps_fewer_activations_and_the_same_gradients(mode):
    x = _tokens(SPEC)

    def run(recompute):
        model = build_model(SPEC, seed=0)
        set_recompute(model, recompute)
        saved = []

        def pack(t):
            saved.append(t.numel() * t.element_size())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = lm_loss(model(x), x)
            kept = sum(saved)
        loss.backward()
        return kept, {n: p.grad for n, p in model.named_parameters()}

    base_bytes, base_grads = run("none")
    bytes_, grads = run(mode)
    assert bytes_ < base_bytes
    for name, g in grads.items():
        torch.testing.assert_close(g, base_grads[name], rtol=1e-5, atol=1e-7)


def test_recompute_modes_are_exclusive():
    model = build_model(SPEC)
    set_recompute(model, "full")
    assert all(b.recompute and not b.attn.recompute for b in model.layers.values())
    set_recompute(model, "selective")
    assert all(b.attn.recompute and not b.recompute for b in model.layers.values())
    with pytest.raises(ValueError):
        set_recompute(model, "sometimes")


# ---------------------------------------------------------------- data
def test_synthetic_stream_is_deterministic_and_follows_its_chain():
    src = SyntheticTokens(vocab=50, seq=12, seed=4)
    x, y = src.batch(7, 5)
    x2, y2 = SyntheticTokens(vocab=50, seq=12, seed=4).batch(7, 5)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert x.shape == y.shape == (5, 12) and torch.equal(x[:, 1:], y[:, :-1])
    assert not torch.equal(src.batch(8, 5)[0], x)
    for a, b in zip(x.flatten().tolist(), y.flatten().tolist()):
        assert b in src.successors[a].tolist()


def test_text_corpus_is_english_bytes_and_deterministic():
    corpus = TextCorpus(seq=32, seed=0)
    assert decode(encode("naïve text")) == "naïve text"
    assert corpus.describe()["licence"].startswith("PSF") and len(corpus.sha256) == 64
    x, y = corpus.batch(0, 4)
    assert x.shape == (4, 32) and int(x.max()) < 256
    assert torch.equal(x, TextCorpus(seq=32, seed=0).batch(0, 4)[0])
    assert "the" in decode(x.flatten()).lower()
    with pytest.raises(ValueError):
        make_source("text", vocab=64, seq=8)


# ---------------------------------------------------------------- partition policies
def test_balanced_partition_minimises_the_largest_stage():
    assert balanced([1.0] * 4, 0.0, 0.0, 2) == (2, 2)
    assert balanced([1.0] * 4, 2.0, 0.0, 2) == (1, 3)
    assert balanced([1.0] * 6, 0.0, 3.5, 3) == (2, 3, 1)  # costs 4.5, 3, 2; not (1, 4, 1): 4.5, 4, 1
    assert balanced([5.0, 1.0, 1.0, 1.0, 1.0], 0.0, 0.0, 2) == (1, 4)
    with pytest.raises(ValueError):
        balanced([1.0], 0.0, 0.0, 2)


def test_parameter_policy_moves_layers_off_the_embedding_stage():
    spec = presets.model("small")  # 4 layers of 12h²+13h, embeddings (V+s)·h, head copy V·h
    cfg = validate(Config(model=spec, layout=Layout(pp=2, schedule="1f1b", microbatches=2)))
    layer, embed, head = parameter_costs(spec, 2)
    assert embed == (spec.vocab + spec.seq) * spec.hidden and head == spec.vocab * spec.hidden + 2 * spec.hidden
    resolved = resolve(cfg, "params")
    parts = resolved.layout.partition
    assert sum(parts) == spec.layers
    costs = [embed + parts[0] * layer[0], head + parts[1] * layer[0]]
    for alternative in ((1, 3), (2, 2), (3, 1)):
        other = [embed + alternative[0] * layer[0], head + alternative[1] * layer[0]]
        assert max(costs) <= max(other)
    with pytest.raises(ValueError):
        resolve(cfg, "random")


def test_flop_policy_moves_layers_off_the_heads_stage():
    """A large vocabulary makes the head's logit product 2bshV weigh as much as layers: the last stage gets fewer
    (the embedding is a lookup, no FLOPs); a small one leaves the split uniform."""
    spec = replace(presets.model("small"), layers=6, vocab=4096)
    cfg = validate(Config(model=spec, layout=Layout(pp=2, schedule="1f1b", microbatches=2, micro_batch=2)))
    layer, embed, head = flop_costs(spec, 2)
    assert embed == 0.0 and head == 2 * 2 * spec.seq * spec.hidden * spec.vocab and head > layer[0]
    parts = resolve(cfg, "flops").layout.partition
    assert parts[0] > parts[1] and sum(parts) == 6
    assert max(parts[0] * layer[0], parts[1] * layer[0] + head) <= min(
        max(a * layer[0], (6 - a) * layer[0] + head) for a in range(1, 6))
    small_vocab = validate(Config(model=replace(spec, vocab=256), layout=cfg.layout))
    assert resolve(small_vocab, "flops").layout.partition == (3, 3)


def test_time_policy_gives_a_valid_partition():
    spec = replace(presets.model("tiny"), layers=4)
    cfg = validate(Config(model=spec, layout=Layout(pp=2, schedule="gpipe", microbatches=2)))
    parts = resolve(cfg, "time").layout.partition
    assert len(parts) == 2 and sum(parts) == 4 and min(parts) >= 1


@pytest.mark.parametrize("head, expected", [(10.0, (5, 1)), (0.0, (3, 3)), (-2.0, (2, 4))])
def test_time_policy_balances_the_times_it_measured(monkeypatch, head, expected):
    """The time policy follows its measurement (here a stand-in: one unit per layer, ``head`` units for the head
    and loss on the last stage, the embedding free), not the uniform split; a negative head stands for an embedding
    heavier than the head (first_extra = 2)."""
    from distperf.parallel import partition

    measured = []

    def costs(spec, micro_batch, device):
        measured.append((spec.layers, micro_batch, device))
        return [1.0] * spec.layers, max(-head, 0.0), max(head, 0.0)

    monkeypatch.setattr(partition, "time_costs", costs)
    spec = replace(presets.model("tiny"), layers=6)
    cfg = validate(Config(model=spec, layout=Layout(pp=2, schedule="gpipe", micro_batch=2, microbatches=2)))
    assert resolve(cfg, "time").layout.partition == expected
    assert measured == [(6, 2, "cpu")]


def test_explicit_partition_is_checked():
    spec = replace(presets.model("tiny"), layers=4)
    with pytest.raises(ConfigError, match="partition"):
        validate(Config(model=spec, layout=Layout(pp=2, schedule="gpipe", microbatches=2, partition=(4, 0))))


@pytest.mark.parametrize("arch", ["gpt", "bert"])
def test_fused_and_unfused_attention_compute_the_same_loss_and_gradients(arch):
    spec = replace(presets.model("tiny"), arch=arch)
    torch.manual_seed(0)
    x, y = torch.randint(0, spec.vocab, (3, spec.seq)), torch.randint(0, spec.vocab, (3, spec.seq))
    losses, grads = [], []
    for attention in ("sdpa", "math"):
        model = build_model(replace(spec, attention=attention))
        loss = lm_loss(model(x), y)
        loss.backward()
        losses.append(loss.item())
        grads.append([p.grad for p in model.parameters()])
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads))


def _saved(model, x) -> list[torch.Tensor]:
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        model(x)
    return saved


def test_attention_keeps_scores_only_when_unfused_and_dropout_keeps_one_byte_masks():
    """sdpa keeps no s×s tensor for backward, math keeps the softmax output; dropout keeps bool masks on CPU too
    (torch.native_dropout; F.dropout would keep a 4-byte noise tensor)."""
    spec = replace(presets.model("tiny"), layers=1, dropout=0.1)
    x = torch.randint(0, spec.vocab, (2, spec.seq))
    s, a = spec.seq, spec.heads
    for attention, scores in (("sdpa", False), ("math", True)):
        model = build_model(replace(spec, attention=attention, dropout=0.0))
        assert any(t.shape[-2:] == (s, s) for t in _saved(model, x)) == scores, attention
    saved = _saved(build_model(replace(spec, attention="math")), x)
    masks = [t for t in saved if t.dtype == torch.bool]
    assert len(masks) == 4  # the embedding's, the two residual dropouts' and the attention probabilities'
    assert sorted(t.numel() for t in masks) == sorted([2 * s * spec.hidden] * 3 + [2 * a * s * s])
    noise = [t for t in saved if t.is_floating_point() and not isinstance(t, torch.nn.Parameter)
             and ((t == 0) | (t == torch.tensor(1 / 0.9))).all()]
    assert not noise  # no float tensor of zeros and 1/(1 − p): F.dropout's noise on CPU


def test_attention_is_a_validated_configuration_field():
    with pytest.raises(ConfigError) as e:
        validate(Config(model=ModelSpec(attention="flash")))
    assert e.value.field == "attention"
