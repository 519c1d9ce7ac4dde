"""The GPU memory plan of a cell: what its training state and its engine need on each of its GPUs.

A cell's GPUs hold, in turn, its SGLang engine (rollout role) and its training
ranks (training role); ``plan_memory`` adds up both roles per GPU from the
model config and the layout, and ``MemoryPlan.problem`` names, with the
numbers, the role that does not fit (docs/gpu.md, "Memory plan"). Pure
arithmetic: no torch, no CUDA call.

Training, per rank of a TP ``tp`` cell (the core cell: it alone owns an optimizer):
- weights and gradients in the model dtype, the float64 gradient accumulator
  (``train.state``); for a non-float32 model also float32 masters and float32 main
  gradients (``train.precision``); Adam's two float32 moments;
- activations of one micro-step, no recomputation, estimated with Korthikanti et
  al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", TP
  without sequence parallelism): ``T * h * (10 + 24 / tp)`` bytes per layer for
  ``T`` tokens, plus ``5 * a * L * T / tp`` for the unfused attention scores
  (Megatron's local spec) when rows are at most ``L`` tokens long, plus the
  logits (``T * V / tp`` values: bf16 and two float32 copies in the loss);
- beside them the engine's residue: with SGLang's memory saver its weights and
  KV cache are released while the cell trains (``ENGINE_RESIDUE_GIB`` left: CUDA
  context, graphs; an assumption until ``make gpu-smoke`` measures it); without
  it the engine keeps its whole share.

Rollout, per GPU: the engine's share (``--mem-fraction-static`` x GPU memory),
which must hold its weights shard and a KV cache of at least one full row,
plus the training ranks' residue (``TRAINER_RESIDUE_GIB``: CUDA context; the
state itself is in host memory).

Invariants (tested): the parameter count equals the Megatron model's (TP 1);
each term scales as stated with ``tp``; a plan whose peak exceeds the GPU is
refused naming the role and every term.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30
ENGINE_RESIDUE_GIB = 2.0  # assumption: SGLang's CUDA context + graphs after release_memory_occupation
TRAINER_RESIDUE_GIB = 1.0  # assumption: torch's CUDA context + allocator slack of an offloaded rank
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ParameterCount:
    sharded: int  # split over the TP ranks
    replicated: int  # held whole by every rank (norms)

    @property
    def total(self) -> int:
        return self.sharded + self.replicated

    def per_rank(self, tp: int) -> int:
        return self.sharded // tp + self.replicated


def count_parameters(model) -> ParameterCount:
    """Parameters of the Qwen-family GPT of ``model`` (a ``train.model.ModelConfig``)."""
    h, d, f, v = model.hidden_size, model.head_dim, model.ffn_hidden_size, model.vocab_size
    q, kv = model.num_attention_heads * d, 2 * model.num_query_groups * d
    layer = h * (q + kv) + (q + kv if model.qkv_bias else 0) + q * h + 3 * h * f
    sharded = model.num_layers * layer + v * h * (1 if model.tie_embeddings else 2)
    replicated = model.num_layers * (2 * h + (2 * d if model.qk_layernorm else 0)) + h
    return ParameterCount(sharded, replicated)


@dataclass(frozen=True)
class MemoryPlan:
    gpu_gib: float
    training: dict[str, float]  # term -> GiB per GPU while the cell trains
    rollout: dict[str, float]  # term -> GiB per GPU while its engine serves
    kv_tokens: int  # tokens the engine's KV cache holds beside its weights
    row_tokens: int

    @property
    def training_gib(self) -> float:
        return sum(self.training.values())

    @property
    def rollout_gib(self) -> float:
        return sum(self.rollout.values())

    def problem(self) -> str | None:
        """None when both roles fit; else why not, with every term."""
        if self.training_gib > self.gpu_gib:
            return (f"training needs {self.training_gib:.1f} GiB per GPU, the GPU has {self.gpu_gib:.1f} "
                    f"({_terms(self.training)})")
        if self.rollout_gib > self.gpu_gib:
            return (f"rollout needs {self.rollout_gib:.1f} GiB per GPU, the GPU has {self.gpu_gib:.1f} "
                    f"({_terms(self.rollout)})")
        if self.kv_tokens < self.row_tokens:
            return (f"the engine's share leaves KV cache for {self.kv_tokens} tokens beside its weights, less "
                    f"than one row of {self.row_tokens} ({_terms(self.rollout)})")
        return None

    def lines(self) -> list[str]:
        return [f"memory per GPU ({self.gpu_gib:.0f} GiB): training {self.training_gib:.1f} GiB = "
                f"{_terms(self.training)}",
                f"memory per GPU ({self.gpu_gib:.0f} GiB): rollout {self.rollout_gib:.1f} GiB = "
                f"{_terms(self.rollout)}; KV cache {self.kv_tokens} tokens"]


def plan_memory(model, *, tp: int, engine_tp: int, engine_fraction: float, gpu_gib: float, tokens: int,
                row_tokens: int | None = None, memory_saver: bool = True, accumulate_bytes: int = 8) -> MemoryPlan:
    """The per-GPU plan of a cell (module docstring); ``tokens``: a micro-step's token budget."""
    params = count_parameters(model)
    n = params.per_rank(tp)
    width = DTYPE_BYTES[model.dtype]
    mixed = model.dtype != "float32"
    row = min(row_tokens or tokens, tokens, model.max_sequence_length)
    engine_share = engine_fraction * gpu_gib
    training = {
        "weights": n * width / GIB, "grads": n * width / GIB, "accumulator": n * accumulate_bytes / GIB,
        "masters": n * 4 * mixed / GIB, "main grads": n * 4 * mixed / GIB, "adam": n * 8 / GIB,
        "activations": activation_bytes(model, tp, tokens, row) / GIB,
        "engine": ENGINE_RESIDUE_GIB if memory_saver else engine_share,
    }
    engine_weights = params.total * 2 / engine_tp / GIB  # SGLang serves bf16
    kv_per_token = 2 * model.num_layers * model.num_query_groups * model.head_dim * 2 / engine_tp
    kv_tokens = int(max(engine_share - engine_weights, 0.0) * GIB / kv_per_token)
    rollout = {"engine share": engine_share, "trainer": TRAINER_RESIDUE_GIB}
    return MemoryPlan(gpu_gib, {k: v for k, v in training.items() if v}, rollout, kv_tokens, row)


def activation_bytes(model, tp: int, tokens: int, row: int) -> float:
    """One micro-step's activations kept for backward (module docstring: the estimate and its source)."""
    h, a = model.hidden_size, model.num_attention_heads
    per_layer = tokens * h * (10 + 24 / tp) + 5 * a * row * tokens / tp
    logits = tokens * model.vocab_size / tp * (2 + 4 + 4)
    return model.num_layers * per_layer + logits


def _terms(terms: dict[str, float]) -> str:
    return " + ".join(f"{name} {gib:.1f}" for name, gib in terms.items())
