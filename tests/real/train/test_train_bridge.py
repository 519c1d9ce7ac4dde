"""Hugging Face checkpoints in and out of the cells' Megatron GPT through mbridge (``train.bridge``).

Tiny checkpoints are built here from configs with seeded random weights (nothing
is downloaded): Qwen2 untied and tied, Qwen3 (qk-norm, head_dim 32 != hidden /
heads) untied and tied, and bf16 variants. For each: HF -> Megatron -> HF
returns every tensor bit for bit in the checkpoint's dtype, mbridge's own
model export agrees with the per-tensor export publication uses, and
Megatron's forward gives transformers' log-probabilities on the same tokens
(float32: within FP32_LOGPROB_TOL, measured <= 1e-6; bf16: within
BF16_LOGPROB_TOL, measured ~1e-2: the two frameworks round differently).
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from gyre.real.train import bridge as B
from gyre.real.train.cpu_compat import seed_model_rng
from gyre.real.train.model import FlatParameters, ModelConfig, build_gpt, causal_mask
from gyre.real.train.publish import save_hf_checkpoint

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

FP32_LOGPROB_TOL = 1e-5
BF16_LOGPROB_TOL = 6e-2
VOCAB = 300
VARIANTS = [("qwen2", False, "float32"), ("qwen2", True, "float32"), ("qwen3", False, "float32"),
            ("qwen3", True, "float32"), ("qwen2", False, "bfloat16"), ("qwen3", True, "bfloat16")]


def random_checkpoint(path, family: str, tied: bool, dtype: str, *, seed: int = 0):
    """A seeded random tiny HF checkpoint saved by transformers; returns (path, the HF model)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  tie_word_embeddings=tied, rope_theta=1_000_000.0, rms_norm_eps=1e-6)
    model = (Qwen2ForCausalLM(Qwen2Config(**common)) if family == "qwen2"
             else Qwen3ForCausalLM(Qwen3Config(head_dim=32, **common)))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            param.copy_(1.0 + 0.1 * noise if name.endswith("norm.weight") else 0.05 * noise)
    model = model.to(getattr(torch, dtype)).eval()
    model.save_pretrained(path, safe_serialization=True)
    return path, model


def loaded_megatron(setup, folder, dtype: str):
    cfg = B.model_config_from_hf(folder, dtype=dtype)
    seed_model_rng(cfg.init_seed, setup)
    model = build_gpt(cfg, setup.device)
    B.load_hf_weights(model, folder, cfg)
    return cfg, model, FlatParameters(model)


def variant_id(v) -> str:
    return f"{v[0]}-{'tied' if v[1] else 'untied'}-{v[2]}"


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_round_trip_is_exact_and_forward_matches_transformers(megatron, tmp_path, variant):
    family, tied, dtype = variant
    folder, hf = random_checkpoint(tmp_path / "src", family, tied, dtype)
    cfg, model, flat = loaded_megatron(megatron, folder, dtype)
    assert (cfg.family, cfg.tie_embeddings, cfg.qk_layernorm, cfg.head_dim) == (
        family, tied, family == "qwen3", 32 if family == "qwen3" else 16)
    assert {p.dtype for p in model.parameters()} == {getattr(torch, dtype)}
    assert ("output_layer.weight" in flat.names) is not tied  # tied: one tensor in Megatron

    source = load_file(str(folder / "model.safetensors"))
    exported = B.export_hf(flat.named_tensors(), cfg)
    assert exported.keys() == source.keys()
    assert all(exported[k].dtype == source[k].dtype and torch.equal(exported[k], source[k]) for k in source)
    assert ("lm_head.weight" in exported) is not tied
    whole = B.export_hf_model(model, cfg)  # mbridge's own export_weights: the same tensors
    assert whole.keys() == exported.keys() and all(torch.equal(whole[k], exported[k]) for k in whole)

    ids = torch.randint(0, VOCAB, (2, 29), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model(ids, torch.arange(29).expand(2, 29), attention_mask=causal_mask(29, megatron.device)).float()
        theirs = hf(ids).logits.float()
    target = ids[:, 1:, None]
    ours = torch.log_softmax(ours[:, :-1], -1).gather(-1, target)
    theirs = torch.log_softmax(theirs[:, :-1], -1).gather(-1, target)
    tol = FP32_LOGPROB_TOL if dtype == "float32" else BF16_LOGPROB_TOL
    assert (ours - theirs).abs().max() <= tol, (ours - theirs).abs().max()


def test_published_checkpoint_reloads_in_transformers(megatron, tmp_path):
    """A publication of a loaded Qwen3 is a checkpoint transformers loads to the same tensors and config."""
    from transformers import AutoModelForCausalLM

    folder, hf = random_checkpoint(tmp_path / "src", "qwen3", True, "float32")
    cfg, model, flat = loaded_megatron(megatron, folder, "float32")
    path = save_hf_checkpoint(tmp_path / "ckpt", flat.named_tensors(), cfg, 0)
    again = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert type(again).__name__ == "Qwen3ForCausalLM" and again.config.tie_word_embeddings
    assert again.config.head_dim == 32 and again.config.eos_token_id == hf.config.eos_token_id
    mine, theirs = again.state_dict(), hf.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


def test_tied_bridge_does_not_change_a_later_untied_export(megatron, tmp_path):
    """mbridge 0.15.1 writes the tied rule into a class-level table; the local bridge keeps it per instance."""
    tied, _ = random_checkpoint(tmp_path / "tied", "qwen2", True, "float32")
    untied, _ = random_checkpoint(tmp_path / "untied", "qwen2", False, "float32", seed=3)
    loaded_megatron(megatron, tied, "float32")
    cfg, _, flat = loaded_megatron(megatron, untied, "float32")
    exported = B.export_hf(flat.named_tensors(), cfg)
    source = load_file(str(untied / "model.safetensors"))
    assert torch.equal(exported["lm_head.weight"], source["lm_head.weight"])
    assert not torch.equal(exported["lm_head.weight"], exported["model.embed_tokens.weight"])


def test_unsupported_checkpoints_are_refused_by_name(megatron, tmp_path):
    folder, _ = random_checkpoint(tmp_path / "src", "qwen2", False, "float32")
    cfg = B.model_config_from_hf(folder)
    tensors = load_file(str(folder / "model.safetensors"))
    save_file({**tensors, "model.layers.0.extra.weight": torch.zeros(2)}, str(folder / "model.safetensors"))
    seed_model_rng(1, megatron)
    with pytest.raises(B.BridgeError, match="model.layers.0.extra.weight"):
        B.load_hf_weights(build_gpt(cfg, megatron.device), folder, cfg)
    del tensors["model.norm.weight"]
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(B.BridgeError, match="missing.*model.norm.weight"):
        B.load_hf_weights(build_gpt(cfg, megatron.device), folder, cfg)
    raw = json.loads((folder / "config.json").read_text())
    for change, message in (({"model_type": "llama"}, "model_type 'llama'"),
                            ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}}, "rope type 'yarn'"),
                            ({"use_sliding_window": True}, "sliding-window")):
        (folder / "config.json").write_text(json.dumps({**raw, **change}))
        with pytest.raises(B.BridgeError, match=message):
            B.model_config_from_hf(folder)


def test_default_toy_model_exports_as_qwen2():
    """The seeded toy model (no checkpoint) keeps its Qwen2 config.json and tensor names."""
    cfg = ModelConfig()
    raw = B.hf_config_dict(cfg)
    assert raw["model_type"] == "qwen2" and raw["tie_word_embeddings"] is False and raw["torch_dtype"] == "float32"
    with pytest.raises(B.BridgeError, match="qwen2 export"):
        B.hf_config_dict(ModelConfig(qk_layernorm=True))
    with pytest.raises(ValueError, match="family"):
        ModelConfig(family="llama")


@pytest.mark.timeout(180)
def test_cells_start_from_the_checkpoint_and_publish_it_back(megatron, tmp_path):
    """A plane whose ModelConfig names a checkpoint: every cell holds its weights, version 0 publishes
    them back bit for bit, and a trained version differs."""
    from gyre.real.toy.microsteps import feed, toy_batch
    from gyre.real.train.plane import PlaneConfig, TrainingPlane
    from gyre.real.train.state import OptimConfig

    folder, _ = random_checkpoint(tmp_path / "src", "qwen3", True, "float32")
    cfg, _, flat = loaded_megatron(megatron, folder, "float32")
    with TrainingPlane(PlaneConfig(cells=2, model=cfg, optim=OptimConfig(lr=1e-3)), tmp_path / "plane") as plane:
        dumps = [torch.load(plane.call(c, "dump", path=str(tmp_path / f"cell{c}.pt"))["path"]) for c in (0, 1)]
        plane.call(0, "enter_training")
        v0 = plane.call(0, "publish", version=0, endpoints=[], directory=str(tmp_path / "ckpt"))["path"]
        feed(plane.queues, toy_batch(9, 0, 2))
        plane.call(0, "step", version=0, final=True)
        v1 = plane.call(0, "publish", version=1, endpoints=[], directory=str(tmp_path / "ckpt"))["path"]
    assert all(d["names"] == flat.names and torch.equal(d["weights"], flat.data) for d in dumps)
    source, first, trained = (load_file(str(p)) for p in
                              (folder / "model.safetensors", f"{v0}/model.safetensors", f"{v1}/model.safetensors"))
    assert first.keys() == source.keys() and all(torch.equal(first[k], source[k]) for k in source)
    assert trained.keys() == source.keys()
    assert not torch.equal(trained["model.norm.weight"], source["model.norm.weight"])
    assert json.loads((tmp_path / "ckpt" / "v000001" / "config.json").read_text())["model_type"] == "qwen3"
