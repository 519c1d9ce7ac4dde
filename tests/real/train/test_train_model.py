"""The Megatron GPT of a cell, in this process: flat weights, padding, split-invariant accumulation,
offload/restore, and the Qwen2 export checked against an independent Qwen2 forward pass."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from gyre.real.train.cpu_compat import seed_model_rng
from gyre.real.train.model import (FlatParameters, LossConfig, ModelConfig, build_gpt, causal_mask,
                                   microstep_tensors, target_logprobs)
from gyre.real.train.publish import hf_state_dict
from gyre.real.train.state import OptimConfig, TrainingState
from gyre.real.toy.microsteps import toy_batch
from gyre.trajectory.packing import MicroStep

CFG = ModelConfig()
# Megatron-core warns at import that Apex / Transformer Engine are absent (expected on CPU).
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def new_state(setup, *, core=True, optim=OptimConfig(lr=1e-3)) -> TrainingState:
    seed_model_rng(CFG.init_seed, setup)
    model = build_gpt(CFG, setup.device)
    return TrainingState(model, FlatParameters(model), optim, LossConfig(), owns_optimizer=core)


def test_same_seed_same_weights_and_flat_views(megatron):
    a, b = new_state(megatron), new_state(megatron)
    assert torch.equal(a.flat.data, b.flat.data)
    assert a.flat.layout_digest() == b.flat.layout_digest()
    for p, view in zip(a.flat.params, a.flat.views(a.flat.data)):
        assert p.data.data_ptr() == view.data_ptr()
    a.flat.data.add_(1.0)  # writing the buffer writes the model
    assert torch.equal(a.flat.params[0].data, b.flat.params[0].data + 1.0)


def test_right_padding_does_not_change_log_probabilities(megatron):
    state = new_state(megatron)
    short = toy_batch(3, 0, 1, rows_per_microstep=1, length=10, targets=4)[0]
    long_row = toy_batch(4, 0, 1, rows_per_microstep=1, length=30, targets=6)[0].rows[0]
    batch = microstep_tensors(MicroStep(0, 0, (short.rows[0], long_row), 2), megatron.device)
    assert batch.input_ids.shape == (2, 30)
    alone = target_logprobs(state.model, microstep_tensors(short, megatron.device))[0]
    padded = target_logprobs(state.model, batch)[0, :9]
    assert torch.allclose(alone, padded, atol=1e-6)


def test_accumulated_gradient_does_not_depend_on_the_split(megatron):
    """Sum of per-micro-step gradients in float64, rounded to float32: equal for any split/order."""
    steps = toy_batch(11, 0, 6)
    sums = []
    for order in ([0, 1, 2, 3, 4, 5], [5, 3, 1, 0, 2, 4]):
        parts = []
        for part in (order[:2], order[2:]):  # two "cells"
            state = new_state(megatron, core=False)
            for i in part:
                state.accumulate(steps[i])
            parts.append(state.acc.clone())
        sums.append((parts[1] + parts[0]).to(torch.float32))
    one = new_state(megatron, core=False)
    for step in steps:
        one.accumulate(step)
    assert torch.equal(sums[0], sums[1]) and torch.equal(sums[0], one.acc.to(torch.float32))
    assert sums[0].abs().sum() > 0


def test_weights_frozen_during_accumulation_and_one_update(megatron):
    state = new_state(megatron)
    before = state.flat.data.clone()
    for step in toy_batch(5, 0, 3):
        state.accumulate(step)
    assert torch.equal(state.flat.data, before)
    stats = state.apply_update()
    assert stats.grad_norm > 0 and not torch.equal(state.flat.data, before)
    assert state.acc.abs().sum() == 0


def test_offload_frees_training_buffers_and_restore_brings_them_back(megatron):
    state = new_state(megatron)
    state.accumulate(toy_batch(5, 0, 1)[0])
    state.apply_update()
    moments = {k: v.clone() for k, v in state.optimizer.state[state.flat.params[0]].items()}
    held = state.resident_bytes()
    state.offload()
    assert state.resident_bytes() == 0 and state.flat.grad is None and state.acc is None
    with pytest.raises(RuntimeError, match="offloaded"):
        state.accumulate(toy_batch(5, 0, 1)[0])
    state.restore()
    assert state.resident_bytes() == held
    for k, v in state.optimizer.state[state.flat.params[0]].items():
        assert torch.equal(v, moments[k])


def qwen2_logits(sd: dict, cfg: ModelConfig, ids: torch.Tensor) -> torch.Tensor:
    """An independent Qwen2 forward pass (HF conventions) over one sequence, from HF-named tensors."""
    T, H, KV, hd = len(ids), cfg.num_attention_heads, cfg.num_query_groups, cfg.head_dim
    inv = 1.0 / (cfg.rotary_base ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    freqs = torch.outer(torch.arange(T, dtype=torch.float32), inv)
    cos, sin = torch.cat([freqs, freqs], -1).cos()[:, None], torch.cat([freqs, freqs], -1).sin()[:, None]
    rms = lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.norm_epsilon) * w  # noqa: E731
    rot = lambda x: torch.cat([-x[..., hd // 2:], x[..., :hd // 2]], -1)  # noqa: E731
    x = sd["model.embed_tokens.weight"][ids]
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        h = rms(x, sd[p + "input_layernorm.weight"])
        q, k, v = ((h @ sd[p + f"self_attn.{n}_proj.weight"].T + sd[p + f"self_attn.{n}_proj.bias"])
                   .view(T, -1, hd) for n in "qkv")
        q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
        k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
        scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(hd)
        scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        x = x + torch.einsum("hts,shd->thd", scores.softmax(-1), v).reshape(T, -1) @ sd[p + "self_attn.o_proj.weight"].T
        h = rms(x, sd[p + "post_attention_layernorm.weight"])
        gate, up = h @ sd[p + "mlp.gate_proj.weight"].T, h @ sd[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ sd[p + "mlp.down_proj.weight"].T
    return rms(x, sd["model.norm.weight"]) @ sd["lm_head.weight"].T


def test_qwen2_export_computes_the_same_logits(megatron):
    state = new_state(megatron)
    gen = torch.Generator().manual_seed(0)
    state.flat.data.add_(torch.randn(state.flat.numel, generator=gen) * 0.02)  # biases and norms non-trivial
    ids = torch.randint(0, CFG.vocab_size, (17,), generator=gen)
    with torch.no_grad():
        ours = state.model(ids[None], torch.arange(17)[None], attention_mask=causal_mask(17, megatron.device))[0]
        theirs = qwen2_logits(hf_state_dict(state.flat.named_tensors(), CFG), CFG, ids)
    assert torch.allclose(ours, theirs, atol=2e-5), (ours - theirs).abs().max()
    sd = hf_state_dict(state.flat.named_tensors(), CFG)
    assert sum(t.numel() for t in sd.values()) == state.flat.numel
    assert len([k for k in sd if k.startswith("model.layers.0.")]) == 12


def test_position_zero_target_is_rejected(megatron):
    step = toy_batch(3, 0, 1, rows_per_microstep=1)[0]
    row = step.rows[0]
    mask = row.target_mask.copy()
    mask[0] = True
    bad = MicroStep(0, 0, (dataclasses.replace(row, target_mask=mask),), 1)
    with pytest.raises(ValueError, match="position 0"):
        microstep_tensors(bad, megatron.device)
    assert np.isfinite(row.behavior_logprobs).all()
