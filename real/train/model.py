"""A Megatron-core GPT for the training cells, its flat weight buffer and its micro-step loss.

The model is a dense Qwen-family decoder so that published weights load into a
Qwen rollout engine: RMSNorm, SwiGLU MLP, rotary positions, grouped-query
attention, no bias except (Qwen2) on the QKV projection, optionally (Qwen3)
RMSNorm on queries and keys per head, optionally an output layer tied to the
embedding. ``ModelConfig``'s defaults are the toy Qwen2 (untied, float32);
``train.bridge.model_config_from_hf`` derives one from a Hugging Face
checkpoint folder and names it in ``checkpoint``, whose weights then replace
the seeded initialisation (``train.context``). ``build_gpt`` needs Megatron's
parallel state initialised (TP = the cell's ranks, PP = 1; with TP > 1 each rank
holds its shard and the logits are gathered over the TP group) and the RNG seeded
(``train.cpu_compat.seed_model_rng``); the same seed gives the same weights in
every cell. Every parameter has the config's ``dtype`` (float32 on CPU unless
asked otherwise).

``FlatParameters`` makes every parameter a view into one contiguous buffer: the
snapshot a joining satellite pulls, the tensor the core broadcasts, and the
region Mooncake registers. Gradients get the same layout in a second buffer.

Micro-step rows follow ``gyre.trajectory.rows``: ``target_mask[t]`` means token
``t`` is predicted from tokens ``< t``. Rows are right-padded to the longest row
of the micro-step (pad id 0, never a target); with a causal mask padding never
changes a real token's log-probability.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch

from gyre.real.train.loss import CLIP_HIGH, CLIP_LOW, RATIO_CAP, TOKEN_LOSS_CAP, LossStats, execution_level_loss
from gyre.trajectory.packing import MicroStep


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    vocab_size: int = 256
    num_layers: int = 2
    hidden_size: int = 64
    num_attention_heads: int = 4
    num_query_groups: int = 2
    ffn_hidden_size: int = 128
    max_sequence_length: int = 256
    rotary_base: float = 10_000  # rope theta (an int when integral)
    norm_epsilon: float = 1e-6
    init_seed: int = 1234
    family: str = "qwen2"  # Hugging Face model_type of the export: "qwen2" or "qwen3"
    kv_channels: int | None = None  # head dimension when not hidden_size // num_attention_heads (Qwen3)
    qkv_bias: bool = True
    qk_layernorm: bool = False
    tie_embeddings: bool = False
    dtype: str = "float32"  # parameter dtype: "float32" or "bfloat16"
    checkpoint: str | None = None  # Hugging Face folder whose weights replace the seeded initialisation
    tokenizer: str | None = None  # folder whose tokenizer and chat template every export carries (default: checkpoint)

    def __post_init__(self) -> None:
        if self.family not in ("qwen2", "qwen3"):
            raise ValueError(f"family must be 'qwen2' or 'qwen3', got {self.family!r}")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


@dataclass(frozen=True, kw_only=True)
class LossConfig:
    """Knobs of docs/trajectories.md#execution-level-loss; the defaults are the spec's."""

    ratio_cap: float = RATIO_CAP
    token_loss_cap: float = TOKEN_LOSS_CAP
    clip_low: float = CLIP_LOW
    clip_high: float = CLIP_HIGH


def transformer_config(cfg: ModelConfig, device: torch.device, tp: int = 1):
    """Megatron's TransformerConfig of ``cfg``: local spec, no fusions, no dropout, ``cfg.dtype`` parameters,
    ``tp`` tensor-parallel ranks (no sequence parallelism)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        tensor_model_parallel_size=tp,
        num_layers=cfg.num_layers, hidden_size=cfg.hidden_size, num_attention_heads=cfg.num_attention_heads,
        num_query_groups=cfg.num_query_groups, ffn_hidden_size=cfg.ffn_hidden_size, kv_channels=cfg.head_dim,
        normalization="RMSNorm", layernorm_epsilon=cfg.norm_epsilon, gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, add_bias_linear=False, add_qkv_bias=cfg.qkv_bias,
        qk_layernorm=cfg.qk_layernorm, hidden_dropout=0.0, attention_dropout=0.0, params_dtype=cfg.torch_dtype,
        use_cpu_initialization=device.type == "cpu", gradient_accumulation_fusion=False,
        bias_activation_fusion=False, masked_softmax_fusion=False, bias_dropout_fusion=False,
        apply_rope_fusion=False, persist_layer_norm=False)


def build_gpt(cfg: ModelConfig, device: torch.device):
    """The Megatron-core GPTModel of ``cfg``: local (non-TE) layer spec, no fusions, no dropout.

    Its weights are the seeded initialisation; ``train.bridge.load_hf_weights`` replaces them
    with ``cfg.checkpoint``'s (``train.context`` does so in every cell)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(qk_layernorm=cfg.qk_layernorm, normalization="RMSNorm")
    # parallel_output=False: the logits are gathered over the TP group, so the loss sees the whole
    # vocabulary on every rank (the backward of the gather hands each rank its shard's gradient).
    model = GPTModel(transformer_config(cfg, device, tensor_parallel_size()), spec, vocab_size=cfg.vocab_size,
                     max_sequence_length=cfg.max_sequence_length, position_embedding_type="rope",
                     rotary_base=cfg.rotary_base, share_embeddings_and_output_weights=cfg.tie_embeddings,
                     parallel_output=False)
    # The local spec's norms (torch RMSNorm) ignore params_dtype; cast like Megatron's Float16Module does.
    return model.to(device=device, dtype=cfg.torch_dtype)


def tensor_parallel_size() -> int:
    """Megatron's TP world size when its parallel state is initialised, else 1."""
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return 1
    return parallel_state.get_tensor_model_parallel_world_size()


class FlatParameters:
    """Every parameter of ``module`` as a view into one contiguous buffer ``data``.

    Invariants: the order is ``named_parameters()`` order (identical in every cell
    built from the same config); ``param.data`` is always a view of ``data``;
    while gradients are attached, ``param.grad`` is a view of ``grad`` and
    autograd accumulates into it in place.
    """

    def __init__(self, module: torch.nn.Module) -> None:
        self.params = [p for _, p in module.named_parameters()]
        self.names = [n for n, _ in module.named_parameters()]
        self.shapes = [tuple(p.shape) for p in self.params]
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) != 1:
            raise ValueError(f"FlatParameters needs one dtype, got {sorted(map(str, dtypes))}")
        self.dtype = dtypes.pop()
        self.offsets = np.cumsum([0] + [p.numel() for p in self.params]).tolist()
        self.data = torch.empty(self.offsets[-1], dtype=self.dtype, device=self.params[0].device)
        for p, view in zip(self.params, self.views(self.data)):
            view.copy_(p.data)
            p.data = view
        self.grad: torch.Tensor | None = None

    @property
    def numel(self) -> int:
        return self.offsets[-1]

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def layout_digest(self) -> str:
        """Hash of names, shapes and dtype: two cells may exchange buffers only when equal."""
        text = ";".join(f"{n}:{s}" for n, s in zip(self.names, self.shapes)) + f"|{self.dtype}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        return [flat[a:b].view(s) for a, b, s in zip(self.offsets, self.offsets[1:], self.shapes)]

    def named_tensors(self) -> list[tuple[str, torch.Tensor]]:
        return list(zip(self.names, self.views(self.data)))

    def rebind(self, flat: torch.Tensor) -> None:
        """Make ``flat`` (same numel and dtype) the parameter storage, e.g. after an offload round trip."""
        if flat.numel() != self.numel or flat.dtype != self.dtype:
            raise ValueError(f"buffer of {flat.numel()} {flat.dtype} cannot hold {self.numel} {self.dtype}")
        self.data = flat
        for p, view in zip(self.params, self.views(flat)):
            p.data = view
        if self.grad is not None:
            self.attach_grads()

    def attach_grads(self) -> None:
        if self.grad is None or self.grad.device != self.data.device:
            self.grad = torch.zeros_like(self.data)
        for p, view in zip(self.params, self.views(self.grad)):
            p.grad = view

    def release_grads(self) -> None:
        for p in self.params:
            p.grad = None
        self.grad = None


@dataclass(frozen=True)
class MicroStepTensors:
    input_ids: torch.Tensor  # [rows, T] int64, right-padded with 0
    target_mask: torch.Tensor  # [rows, T] bool
    behavior: torch.Tensor  # [rows, T] float64
    execution_index: torch.Tensor  # [rows, T] int64, local execution index
    advantages: torch.Tensor  # [executions] float64
    target_counts: torch.Tensor  # [executions] float64, L_i of the whole execution
    batch_executions: int


def microstep_tensors(step: MicroStep, device: torch.device) -> MicroStepTensors:
    """Pad the rows of a micro-step into a batch; executions get local indices in first-seen order."""
    if not step.rows:
        raise ValueError(f"micro-step {step.name} has no rows")
    local: dict[str, int] = {}
    for row in step.rows:
        local.setdefault(row.execution_id, len(local))
    width = max(row.num_tokens for row in step.rows)
    shape = (len(step.rows), width)
    ids, mask = np.zeros(shape, np.int64), np.zeros(shape, bool)
    behavior, index = np.zeros(shape, np.float64), np.zeros(shape, np.int64)
    advantages, counts = np.zeros(len(local)), np.zeros(len(local))
    for r, row in enumerate(step.rows):
        n, e = row.num_tokens, local[row.execution_id]
        if n and row.target_mask[0]:
            raise ValueError(f"micro-step {step.name}: position 0 of a row cannot be a target")
        ids[r, :n], mask[r, :n], behavior[r, :n], index[r, :n] = (
            row.input_ids, row.target_mask, row.behavior_logprobs, e)
        advantages[e], counts[e] = row.advantage, row.execution_targets
    ids, mask, behavior, index, advantages, counts = (torch.from_numpy(a).to(device) for a in
                                                      (ids, mask, behavior, index, advantages, counts))
    return MicroStepTensors(ids, mask, behavior, index, advantages, counts, step.batch_executions)


def causal_mask(length: int, device: torch.device) -> torch.Tensor:
    """Megatron's mask convention: True = masked out; shape [1, 1, T, T]."""
    return torch.triu(torch.ones(length, length, dtype=torch.bool, device=device), diagonal=1)[None, None]


def target_logprobs(model, batch: MicroStepTensors) -> torch.Tensor:
    """log pi(token_t | tokens_<t) for t >= 1, shape [rows, T - 1] (float32, with grad)."""
    rows, width = batch.input_ids.shape
    positions = torch.arange(width, device=batch.input_ids.device).expand(rows, width)
    logits = model(batch.input_ids, positions, attention_mask=causal_mask(width, batch.input_ids.device))
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)


def microstep_loss(model, batch: MicroStepTensors, cfg: LossConfig = LossConfig()) -> tuple[torch.Tensor, LossStats, float]:
    """the execution-level loss (docs/trajectories.md#execution-level-loss) of one micro-step (already divided by the
    batch's B*N), its stats, and the
    mean target negative log-likelihood (monitoring)."""
    logp = target_logprobs(model, batch)
    mask = batch.target_mask[:, 1:]
    loss, stats = execution_level_loss(
        logp, batch.behavior[:, 1:], mask, batch.execution_index[:, 1:], batch.advantages,
        num_executions=batch.batch_executions, target_counts=batch.target_counts,
        ratio_cap=cfg.ratio_cap, token_loss_cap=cfg.token_loss_cap, clip_low=cfg.clip_low,
        clip_high=cfg.clip_high)
    nll = float(-logp.detach()[mask].mean()) if mask.any() else 0.0
    return loss, stats, nll
