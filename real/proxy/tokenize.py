"""Messages to token ids through the served model's own tokenizer and template.

``ChatTokenizer`` loads a tokenizer from a local path (``HF_HUB_OFFLINE=1``:
nothing is downloaded), renders canonical chat messages with the model's chat
template and encodes them. ``PrefixCache`` remembers (as text lengths and
hashes) the last calls of one execution so a new request reuses the exact
token ids already recorded, fetched from the trajectory tree.

TITO prefix reuse: a request's prompt text usually starts with an earlier
request's prompt text followed by that request's output text (the proxy splices
its raw output back in, see ``proxy.model_call``). When it does, the earlier input and
output ids are reused verbatim and only the remaining suffix text is encoded.
So tokens the engine sampled reappear in later inputs as the *same* ids, never
re-tokenized, and the trajectory tree sees one path.

Invariants:
- a prompt's ids (a cached prefix's ids joined with the encoded suffix:
  ``PrefixCache.best_prefix``, ``join_ids``; ``proxy.model_call.ChatService.encode``)
  decode to the rendered prompt text whenever the tokenizer round-trips text
  (byte-level BPE does);
- reuse is exact-prefix only: a candidate is used only if its text is a prefix
  of the new prompt text (equal 64-bit hashes of equal-length prefixes);
  otherwise the prompt is encoded from scratch;
- ``IncrementalDecoder`` never emits a partial UTF-8 character and the
  concatenation of its deltas equals ``decode(all ids)`` at ``finish``.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from gyre.real.proxy.prompt_size import PromptSize

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@dataclass(frozen=True)
class CachedCall:
    """What the prefix cache keeps of one recorded call: lengths and hashes of its
    prompt text and of prompt + output text, and how to get its token ids back."""

    prompt_len: int
    prompt_hash: int
    full_len: int
    full_hash: int
    input_len: int
    key: int  # passed to ``sequence_of`` to get input ids + output ids


class PrefixCache:
    """The last ``size`` calls of one execution, matched by exact text prefix.

    Only lengths and hashes of texts are kept, and ids are fetched on a hit
    through ``sequence_of(key)`` (the trajectory tree stores them once), so
    a long window costs almost no memory. A hit compares the hash of the new
    text's prefix of the same length (64-bit SipHash, computed once per
    distinct length); newer calls win ties.
    """

    def __init__(self, sequence_of: Callable[[int], Sequence[int]], size: int = 32) -> None:
        self.sequence_of = sequence_of
        self._items: deque[CachedCall] = deque(maxlen=size)

    def add(self, prompt_text: str, output_text: str, input_len: int, key: int) -> None:
        full = prompt_text + output_text
        self._items.append(CachedCall(len(prompt_text), hash(prompt_text), len(full), hash(full), input_len, key))

    def best_prefix(self, text: str) -> tuple[int, np.ndarray]:
        """(characters covered, int32 ids) of the longest cached text prefix of ``text``. The ids are a view
        of the tree's, never a Python list: a 30k-id list costs ~0.4 ms to build and ~0.7 ms to turn back
        into the record's array."""
        hashes: dict[int, int] = {}

        def prefix_hash(length: int) -> int:
            if length not in hashes:
                hashes[length] = hash(text[:length])
            return hashes[length]

        best_chars, best, size = 0, None, len(text)
        for item in reversed(self._items):  # newest first: ties go to the newer call
            if best_chars < item.full_len <= size and prefix_hash(item.full_len) == item.full_hash:
                best_chars, best = item.full_len, (item, True)
            elif best_chars < item.prompt_len <= size and prefix_hash(item.prompt_len) == item.prompt_hash:
                best_chars, best = item.prompt_len, (item, False)
            if best_chars == size:
                break  # the whole text: no older call can cover more
        if best is None:
            return 0, np.zeros(0, dtype=np.int32)
        item, full = best
        ids = np.asarray(self.sequence_of(item.key), dtype=np.int32)
        return best_chars, ids if full else ids[: item.input_len]

    def __len__(self) -> int:
        return len(self._items)


def join_ids(prefix: np.ndarray, suffix: Sequence[int]) -> np.ndarray:
    """``prefix`` followed by ``suffix``, as one new int32 array."""
    return np.concatenate([prefix, np.asarray(suffix, dtype=np.int32)]) if len(suffix) else prefix.copy()


class ChatTokenizer:
    """A local tokenizer with its chat template; thread-safe for encode/decode."""

    def __init__(self, model_path: str, *, stop_tokens: Sequence[str] = ("<|im_end|>", "<|endoftext|>")) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"tokenizer at {model_path} has no chat template")
        self._backend = getattr(self.tokenizer, "backend_tokenizer", None) if getattr(
            self.tokenizer, "is_fast", False) else None
        self.size = PromptSize(self.tokenizer)  # a token count's lower bound from a text's size
        vocab = self.tokenizer.get_vocab()
        self.stop_token_ids = tuple(vocab[t] for t in stop_tokens if t in vocab)
        if not self.stop_token_ids and self.tokenizer.eos_token_id is not None:
            self.stop_token_ids = (int(self.tokenizer.eos_token_id),)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
               *, thinking: bool | None = None, generation_prompt: bool = True) -> str:
        """The prompt text: messages through the chat template, generation prompt added (unless told)."""
        kwargs: dict[str, Any] = {}
        if thinking is not None:
            kwargs["enable_thinking"] = thinking
        return self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                  add_generation_prompt=generation_prompt, **kwargs)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False) if text else []

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        if self._backend is not None:  # the Rust tokenizer directly: what the wrapper does, minus its overhead
            return self._backend.decode([int(i) for i in ids], skip_special_tokens=skip_special)
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special,
                                     clean_up_tokenization_spaces=False)

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def decoder(self) -> IncrementalDecoder:
        return IncrementalDecoder(self)


class IncrementalDecoder:
    """Turn a growing list of output ids into text deltas (special tokens skipped).

    Decodes a small window (the ids of the previous delta plus the new ones)
    and emits the part past the previous delta's text, holding back a trailing
    U+FFFD (an incomplete UTF-8 sequence). Cost per push is O(window).
    """

    def __init__(self, chat: ChatTokenizer) -> None:
        self.chat = chat
        self.ids: list[int] = []
        self._prefix = 0  # start of the decode window
        self._read = 0  # ids whose text has been emitted

    def push(self, new_ids: Sequence[int]) -> str:
        self.ids.extend(int(i) for i in new_ids)
        return self._delta(final=False)

    def finish(self) -> str:
        return self._delta(final=True)

    def _delta(self, *, final: bool) -> str:
        decode = self.chat.decode
        prefix_text = decode(self.ids[self._prefix:self._read], skip_special=True)
        full_text = decode(self.ids[self._prefix:], skip_special=True)
        if not final and full_text.endswith("\ufffd"):
            return ""
        if len(full_text) <= len(prefix_text):
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        return full_text[len(prefix_text):]
