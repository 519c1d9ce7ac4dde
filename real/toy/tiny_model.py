"""A tiny Qwen-style model and tokenizer, built locally (nothing is downloaded).

- ``build_tiny_tokenizer`` trains a byte-level BPE tokenizer in seconds with
  Qwen's special tokens and a Qwen2.5-style chat template (tools in the system
  turn, ``<tool_call>`` JSON blocks, tool results in ``<tool_response>``),
  saved so ``AutoTokenizer`` loads it offline;
- ``build_tiny_qwen2`` saves a seeded random 2-layer Qwen2 next to it;
- ``build_tiny_qwen3`` saves a seeded random 2-layer Qwen3 (qk-norm, a head
  dimension other than hidden/heads, optionally tied embeddings or bf16).
Used by the CPU demo job and by the tests; needs ``tokenizers``,
``transformers`` and ``torch`` (the ``real`` extra).

Invariant: both builders are deterministic in their seed and idempotent (an
existing build in ``path`` is reused, never overwritten).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>", "</tool_response>"]

CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "<tools>{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}\n</tools>\n\n"
    "For each function call, return a json object within <tool_call></tool_call> XML tags:\n"
    "<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% elif message.role == 'assistant' %}<|im_start|>assistant\n"
    "{% if message.content %}{{ message.content }}{% endif %}"
    "{% for tc in message.tool_calls or [] %}"
    "{% if tc.function is defined %}{% set tc = tc.function %}{% endif %}"
    "{% if loop.first and message.content %}{{ '\\n' }}{% endif %}"
    "<tool_call>\n{\"name\": \"{{ tc.name }}\", \"arguments\": "
    "{% if tc.arguments is string %}{{ tc.arguments }}{% else %}{{ tc.arguments | tojson }}{% endif %}"
    "}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif message.role == 'tool' %}"
    "{% if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n' }}<tool_response>\n{{ message.content }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CORPUS_WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this from have or by one had "
    "not but what all were when we there can an your which their said if do will each about how up out them "
    "then she many some so these would other into has more her two like him see time could no make than first "
    "been its who now people my made over did down only way find use may water long little very after words "
    "called just where most know file files list run command bash ls cat echo hello world done ok result error "
    "function name arguments description type object string properties required tool call response assistant "
    "user system model code python test tests pass fail print def return import class self value true false null"
).split()


def _corpus(seed: int = 0) -> list[str]:
    import random

    rng = random.Random(seed)
    lines = []
    for _ in range(3000):
        words = [rng.choice(_CORPUS_WORDS) for _ in range(rng.randint(3, 16))]
        lines.append(" ".join(words))
        lines.append(json.dumps({"name": rng.choice(_CORPUS_WORDS), "arguments": {"command": " ".join(words[:3])}}))
    lines.append("".join(chr(c) for c in range(32, 127)))
    return lines


def build_tiny_tokenizer(path: str | os.PathLike, *, vocab_size: int = 1024, seed: int = 0) -> Path:
    """Train and save a byte-level BPE tokenizer with Qwen-style tokens and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    path = Path(path)
    if (path / "tokenizer.json").exists():
        return path
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>"], clean_up_tokenization_spaces=False)
    fast.add_tokens(ADDED)
    fast.chat_template = CHAT_TEMPLATE
    path.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(path)
    return path


TINY_QWEN2 = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2}


def build_tiny_qwen2(path: str | os.PathLike, *, seed: int = 0, shape: dict | None = None) -> Path:
    """A seeded random Qwen2 beside the tiny tokenizer: 2 layers, hidden 64 unless ``shape`` says otherwise."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    build_tiny_tokenizer(path)
    if (path / "model.safetensors").exists():
        return path
    tokenizer = AutoTokenizer.from_pretrained(path)
    config = Qwen2Config(vocab_size=len(tokenizer), **{**TINY_QWEN2, **(shape or {})}, max_position_embeddings=4096,
                         eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
                         bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
                         tie_word_embeddings=True, torch_dtype="float32")
    generator = torch.Generator().manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    model.save_pretrained(path, safe_serialization=True)
    return path


def build_tiny_qwen3(path: str | os.PathLike, *, seed: int = 0, tie_word_embeddings: bool = False,
                     dtype: str = "float32") -> Path:
    """A seeded random 2-layer Qwen3 (hidden 64, 4 heads of 32, 2 KV heads) beside the tiny tokenizer.

    Norm weights (layer, final and per-head q/k norms) are 1 + noise, every other tensor small noise,
    so the qk-norm and the norms really shape the output."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    path = Path(path)
    build_tiny_tokenizer(path)
    if (path / "model.safetensors").exists():
        return path
    tokenizer = AutoTokenizer.from_pretrained(path)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
                         eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
                         bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
                         tie_word_embeddings=tie_word_embeddings, torch_dtype=dtype)
    generator = torch.Generator().manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1.0 + 0.1 * noise if name.endswith("norm.weight") else 0.02 * noise)
    model.to(getattr(torch, dtype)).save_pretrained(path, safe_serialization=True)
    return path
