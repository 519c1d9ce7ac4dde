"""Published checkpoints a user can use as they are (``train.publish.save_hf_tensors``), in this process.

Checked: an export of a model loaded from a Hugging Face folder carries that
folder's tokenizer files and chat template, is 0755 / 0644 even under a 077
umask, loads with ``AutoTokenizer`` (the chat template renders the same text
as the source's) and ``AutoModelForCausalLM`` (the same logits as the source,
the weights having made the round trip through Megatron); the toy model's
export carries the tokenizer it names. Serving an export with an SGLang CPU
engine is in ``test_train_publish_sglang.py`` (slow).
"""

from __future__ import annotations

import os
import stat

import pytest
import torch

try:
    from proxy_fixtures import shared_tiny_dir
except ImportError:
    from .proxy_fixtures import shared_tiny_dir

from gyre.real.toy.tiny_model import build_tiny_qwen2
from gyre.real.train.bridge import load_hf_weights, model_config_from_hf
from gyre.real.train.cpu_compat import seed_model_rng
from gyre.real.train.model import FlatParameters, build_gpt
from gyre.real.train.publish import TOKENIZER_FILES, save_hf_checkpoint

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "print the value"}]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return build_tiny_qwen2(shared_tiny_dir(tmp_path_factory, "tiny-qwen2"))


def export_of(source, setup, directory, version=1):
    cfg = model_config_from_hf(source)
    seed_model_rng(cfg.init_seed, setup)
    model = build_gpt(cfg, setup.device)
    load_hf_weights(model, source, cfg)
    old = os.umask(0o077)  # a strict umask must not make the export private
    try:
        return save_hf_checkpoint(directory, FlatParameters(model).named_tensors(), cfg, version)
    finally:
        os.umask(old)


def test_an_export_carries_the_tokenizer_and_is_readable(megatron, source, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    export = export_of(source, megatron, tmp_path / "checkpoints")
    expected = {name for name in TOKENIZER_FILES if (source / name).is_file()}
    assert {"tokenizer.json", "tokenizer_config.json"} <= expected <= {p.name for p in export.iterdir()}
    assert stat.S_IMODE(export.stat().st_mode) == 0o755
    assert {stat.S_IMODE(p.stat().st_mode) for p in export.iterdir()} == {0o644}
    ours, theirs = AutoTokenizer.from_pretrained(str(export)), AutoTokenizer.from_pretrained(str(source))
    assert ours.chat_template and ours.apply_chat_template(CHAT, tokenize=False) == theirs.apply_chat_template(
        CHAT, tokenize=False)
    ids = torch.tensor([ours.encode("def value(self): return true")])
    with torch.no_grad():
        logits = [AutoModelForCausalLM.from_pretrained(str(folder), torch_dtype=torch.float32).eval()(ids).logits
                  for folder in (export, source)]
    assert torch.allclose(logits[0], logits[1], atol=1e-6)


def test_the_toy_models_export_carries_the_tokenizer_it_names(megatron, source, tmp_path):
    from gyre.real.train.model import ModelConfig

    cfg = ModelConfig(tokenizer=str(source))
    seed_model_rng(cfg.init_seed, megatron)
    export = save_hf_checkpoint(tmp_path, FlatParameters(build_gpt(cfg, megatron.device)).named_tensors(), cfg, 3)
    assert (export / "tokenizer_config.json").read_bytes() == (source / "tokenizer_config.json").read_bytes()
    untokenized = save_hf_checkpoint(tmp_path, FlatParameters(build_gpt(ModelConfig(), megatron.device))
                                     .named_tensors(), ModelConfig(), 4)
    assert {p.name for p in untokenized.iterdir()} == {"config.json", "model.safetensors"}
