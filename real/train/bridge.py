"""Hugging Face checkpoints in and out of the cells' Megatron GPT, through mbridge (0.15.1).

- ``model_config_from_hf(folder)``: the ``ModelConfig`` of a Qwen2 / Qwen2.5 /
  Qwen3 dense checkpoint (``checkpoint`` names the folder);
- ``load_hf_weights(model, folder, cfg)``: the folder's safetensors into a
  ``train.model.build_gpt`` model (mbridge's ``Bridge.load_weights``);
- ``export_hf(named, cfg)``: Megatron (name, tensor) pairs -> Hugging Face
  tensors, tensor by tensor through mbridge's converter (what publication
  writes); ``export_hf_model(model, cfg)`` is mbridge's own
  ``Bridge.export_weights`` over a model (collectives over Megatron's groups);
  the two agree exactly (tests);
- ``hf_config_dict(cfg)``: the ``config.json`` of an export.

The bridge is mbridge's ``Qwen2Bridge`` / ``Qwen3Bridge`` with three local
adaptations, all in ``_local_spec_bridge`` and nowhere else:

1. name mapping for the *local* layer spec the cells use (mbridge ships
   TransformerEngine names): ``decoder.layers.N.input_layernorm.weight`` <->
   ``model.layers.N.input_layernorm.weight`` and
   ``decoder.layers.N.pre_mlp_layernorm.weight`` <->
   ``model.layers.N.post_attention_layernorm.weight``;
2. the mapping tables are per instance: mbridge 0.15.1's
   ``_adjust_mapping_for_shared_weights`` writes the tied-embedding rule into
   the class-level ``Qwen2Bridge._DIRECT_MAPPING`` (shared with
   ``Qwen3Bridge``), so after one tied bridge every later untied bridge in the
   process would read and write ``lm_head.weight`` as the embedding;
3. the bridge's TransformerConfig is ``train.model.transformer_config(cfg)``
   (mbridge's would ask for fusions and TransformerEngine) and its parallel
   state is Megatron's (the cell's TP group; PP = 1); mbridge's ``get_model``
   is not used (TE spec, CUDA), the model is always ``build_gpt``.

With TP > 1 (a cell of several ranks, ``train.ranks``) loading is mbridge's:
the cell's rank 0 reads the folder and scatters each tensor's TP split (QKV
by query groups, gate and up halves separately) over the TP group; export is
mbridge's too (``export_hf_model``: all-gather over the TP group, merge, then
convert), collective over the cell's ranks.

Invariants: HF -> Megatron -> HF returns every tensor bit for bit in the
checkpoint's dtype (float32 or bfloat16; the model's dtype is ``cfg.dtype``,
float32 by default on CPU: mbridge's default bf16 would round float32
weights). A tied model holds one tensor (``embedding.word_embeddings.weight``)
and exports only ``model.embed_tokens.weight`` with ``tie_word_embeddings``.
Loading refuses a checkpoint with tensors the model does not consume, and a
config it cannot represent (rope scaling, sliding windows, other families).
mbridge is imported lazily: importing this module costs nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from gyre.real.train.model import ModelConfig, transformer_config

FAMILIES = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


class BridgeError(ValueError):
    """A checkpoint or config the bridge cannot carry; the message names the field or tensor."""


# -- configs --------------------------------------------------------------------------------------------

def _rope_theta(raw: dict) -> float:
    params = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or {}
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind != "default":
        raise BridgeError(f"rope type {kind!r} is not supported (only plain RoPE)")
    theta = params.get("rope_theta", raw.get("rope_theta", 10_000.0))
    return int(theta) if float(theta).is_integer() else float(theta)


def model_config_from_hf(folder: str | os.PathLike, *, dtype: str | None = None, init_seed: int = 1234,
                         max_sequence_length: int | None = None) -> ModelConfig:
    """The ``ModelConfig`` of the Hugging Face checkpoint in ``folder`` (its ``config.json``).

    ``dtype`` defaults to float32 (CPU); pass "bfloat16" to train in the checkpoint's bf16."""
    raw = json.loads((Path(folder) / "config.json").read_text())
    family = raw.get("model_type")
    if family not in FAMILIES:
        raise BridgeError(f"{folder}: model_type {family!r} is not supported; supported: {sorted(FAMILIES)}")
    if raw.get("use_sliding_window"):
        raise BridgeError(f"{folder}: sliding-window attention is not supported")
    if raw.get("hidden_act", "silu") != "silu":
        raise BridgeError(f"{folder}: hidden_act {raw['hidden_act']!r} is not supported (silu only)")
    heads, hidden = raw["num_attention_heads"], raw["hidden_size"]
    head_dim = raw.get("head_dim") or hidden // heads
    return ModelConfig(
        vocab_size=raw["vocab_size"], num_layers=raw["num_hidden_layers"], hidden_size=hidden,
        num_attention_heads=heads, num_query_groups=raw.get("num_key_value_heads") or heads,
        ffn_hidden_size=raw["intermediate_size"],
        max_sequence_length=max_sequence_length or raw.get("max_position_embeddings", 4096),
        rotary_base=_rope_theta(raw), norm_epsilon=raw.get("rms_norm_eps", 1e-6), init_seed=init_seed,
        family=family, kv_channels=None if head_dim * heads == hidden else head_dim,
        qkv_bias=True if family == "qwen2" else bool(raw.get("attention_bias", False)),
        qk_layernorm=family == "qwen3", tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
        dtype=dtype or "float32", checkpoint=str(folder))


def hf_config_dict(cfg: ModelConfig) -> dict:
    """``config.json`` of an export of ``cfg``: the source checkpoint's own config when ``cfg`` came
    from one (token ids, generation fields kept), with the dtype of the exported tensors."""
    if cfg.checkpoint is not None:
        raw = json.loads((Path(cfg.checkpoint) / "config.json").read_text())
        raw["torch_dtype"] = cfg.dtype
        if "dtype" in raw:  # transformers >= 5 writes "dtype"
            raw["dtype"] = cfg.dtype
        return raw
    out = {
        "architectures": [FAMILIES[cfg.family]], "model_type": cfg.family, "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.ffn_hidden_size,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_query_groups, "max_position_embeddings": cfg.max_sequence_length,
        "rms_norm_eps": cfg.norm_epsilon, "rope_theta": float(cfg.rotary_base), "hidden_act": "silu",
        "tie_word_embeddings": cfg.tie_embeddings, "torch_dtype": cfg.dtype, "use_sliding_window": False,
    }
    if cfg.family == "qwen3":
        out.update(head_dim=cfg.head_dim, attention_bias=cfg.qkv_bias)
    elif cfg.kv_channels is not None or not cfg.qkv_bias or cfg.qk_layernorm:
        raise BridgeError("a qwen2 export needs head_dim = hidden/heads, QKV bias and no qk-layernorm")
    return out


def _transformers_config(cfg: ModelConfig):
    from transformers import AutoConfig

    raw = hf_config_dict(cfg)
    return AutoConfig.for_model(raw.pop("model_type"), **raw)


# -- the bridge -----------------------------------------------------------------------------------------

def _parallel_states():
    """Megatron's groups when initialised (loading scatters over the TP group), else TP = PP = 1 without groups.

    PP > 1 is refused (the cells run PP = 1)."""
    from mbridge.core.parallel_states import ParallelStates
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        states = ParallelStates.get_default_parallel_states()
    else:
        states = ParallelStates()
    if states.pp_size != 1:
        raise BridgeError(f"the bridge runs at PP = 1, got PP {states.pp_size}")
    return states


def _local_spec_bridge(cfg: ModelConfig):
    """mbridge's bridge of ``cfg.family`` with the three adaptations of the module docstring."""
    import mbridge  # noqa: F401  (registers the model bridges)
    from mbridge.core.bridge import _MODEL_REGISTRY

    base = _MODEL_REGISTRY[cfg.family]
    layer = "model.layers.{layer_number}."

    class LocalSpecBridge(base):
        def __init__(self) -> None:
            # (2) per-instance tables, so the tied-embedding rule cannot leak into the class
            self._DIRECT_MAPPING = dict(base._DIRECT_MAPPING)
            self._DIRECT_MAPPING["output_layer.weight"] = "lm_head.weight"
            self._ATTENTION_MAPPING = dict(base._ATTENTION_MAPPING)
            # (1) the local spec's layer norms (matched before fc1/fc2: mbridge takes the first hit)
            self._MLP_MAPPING = {"pre_mlp_layernorm.weight": [layer + "post_attention_layernorm.weight"],
                                 **base._MLP_MAPPING}
            self._OTHER_MAPPING = {"input_layernorm.weight": [layer + "input_layernorm.weight"]}
            super().__init__(_transformers_config(cfg), dtype=cfg.torch_dtype, parallel_states=_parallel_states())

        def _build_config(self):  # (3)
            return transformer_config(cfg, torch.device("cpu"), self.mpu.tp_size)

    return LocalSpecBridge()


def load_hf_weights(model: torch.nn.Module, folder: str | os.PathLike, cfg: ModelConfig) -> None:
    """Copy the checkpoint in ``folder`` into ``model`` (built by ``build_gpt(cfg)``) in place.

    Needs Megatron's parallel state (any TP, PP = 1; collective over the TP group). Raises ``BridgeError`` when the checkpoint holds
    tensors the model does not consume (a tied checkpoint's redundant ``lm_head.weight`` excepted)."""
    from mbridge.core.safetensor_io import SafeTensorIO

    bridge = _local_spec_bridge(cfg)
    consumed = {hf for name in model.state_dict() if "_extra_state" not in name
                for hf in bridge._weight_name_mapping_mcore_to_hf(name)}
    present = set(SafeTensorIO(str(folder)).load_hf_weight_names())
    extra = present - consumed - ({"lm_head.weight"} if cfg.tie_embeddings else set())
    if extra:
        raise BridgeError(f"{folder}: tensors the Megatron model has no place for: {sorted(extra)[:8]}")
    missing = consumed - present
    if missing:
        raise BridgeError(f"{folder}: tensors missing from the checkpoint: {sorted(missing)[:8]}")
    with torch.no_grad():
        bridge.load_weights([model], str(folder))


def export_hf(named: list[tuple[str, torch.Tensor]], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Megatron (name, tensor) pairs (``FlatParameters.named_tensors`` of a ``build_gpt(cfg)`` model)
    under Hugging Face names, through mbridge's per-tensor converter (copies, contiguous, same dtype)."""
    bridge = _local_spec_bridge(cfg)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in named:
        for hf_name, hf_tensor in zip(*bridge._weight_to_hf_format(name, tensor.detach())):
            if hf_name in out:
                raise BridgeError(f"two Megatron tensors map to {hf_name!r}")
            out[hf_name] = hf_tensor.contiguous().clone()
    return out


def export_hf_model(model: torch.nn.Module, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """mbridge's own ``Bridge.export_weights`` over ``model`` (needs Megatron's parallel state)."""
    bridge = _local_spec_bridge(cfg)
    with torch.no_grad():
        return {name: tensor.detach().contiguous().clone() for name, tensor in bridge.export_weights([model])}


def save_hf_folder(folder: str | os.PathLike, tensors: dict[str, torch.Tensor], cfg: ModelConfig,
                   metadata: dict[str, str] | None = None) -> Path:
    """Write ``config.json`` + ``model.safetensors`` into ``folder`` (created; not atomic, see publish)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.to("cpu") for k, v in tensors.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt", **(metadata or {})})
    (folder / "config.json").write_text(json.dumps(hf_config_dict(cfg), indent=2))
    return folder
