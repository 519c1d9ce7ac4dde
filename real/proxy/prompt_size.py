"""A lower bound on a text's token count from its size, so a prompt that cannot fit the context is
refused before it is tokenized (tokenizing 10 MB took ~7 s of CPU on a worker thread here).

The bound: every token a tokenizer emits stands for at most ``B`` bytes of its *normalized*
input, so a text whose normalized UTF-8 form has ``n`` bytes has at least ``ceil(n / B)``
tokens. ``B`` is derived from the tokenizer itself (``max_bytes_per_token``): the longest
vocabulary entry, added tokens included, in UTF-8 bytes. A vocabulary entry's own string is
never shorter than the bytes it stands for: byte-level BPE writes each byte as one character
of one or two UTF-8 bytes, SentencePiece writes a space as three-byte ``▁`` and a fallback
byte as six-character ``<0xAB>``; an unknown character (a BPE with an ``unk_token`` that does
not fuse) covers one character, at most 4 bytes. The text is normalized by the tokenizer's own
normalizer first (NFC, for one, can merge three Hangul jamo of 9 bytes into one syllable of 3).

The bound is only claimed where it holds, else ``max_bytes_per_token`` is ``None`` and every
prompt is tokenized as before: the model must be BPE (WordPiece's ``[UNK]`` covers a whole
word; Unigram is not checked); unknowns must not be fused (one ``unk`` for any run of them);
no pre-tokenizer may drop text (``Whitespace``, ``WhitespaceSplit``, ``BertPreTokenizer``,
``CharDelimiterSplit``, a ``Split`` or ``Punctuation`` that removes its matches: only those
in ``KEEPING_PRE_TOKENIZERS`` pass); and no added token may strip the spaces beside it.

Invariants (tests/real/proxy/test_proxy_prompt_size.py, with generated texts):
- ``PromptSize.at_least(text) <= len(tokenizer.encode(text))`` for every text, whenever
  ``max_bytes_per_token`` is not ``None``;
- ``at_least`` costs a normalization and a UTF-8 encoding: linear, and ~1/40 of tokenizing
  (``bench/bench_proxy.py`` prompt-bound case).
"""

from __future__ import annotations

import json
from typing import Any

# pre-tokenizers that keep every byte of their input (with their settings that would drop some)
KEEPING_PRE_TOKENIZERS = {"Sequence", "ByteLevel", "Metaspace", "Split", "Digits", "UnicodeScripts", "Punctuation"}
UNKNOWN_CHAR_BYTES = 4  # one unknown character: at most 4 UTF-8 bytes


def _keeps_every_byte(pre_tokenizer: dict[str, Any] | None) -> bool:
    if pre_tokenizer is None:
        return True
    kind = pre_tokenizer.get("type")
    if kind not in KEEPING_PRE_TOKENIZERS or pre_tokenizer.get("behavior") == "Removed":
        return False
    return all(_keeps_every_byte(inner) for inner in pre_tokenizer.get("pretokenizers") or ())


def max_bytes_per_token(tokenizer: Any) -> int | None:
    """``B`` of the module doc for a ``transformers`` fast tokenizer, or ``None`` where no bound is safe."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    model = backend.model
    if type(model).__name__ != "BPE" or (model.unk_token is not None and getattr(model, "fuse_unk", True)):
        return None
    pre = backend.pre_tokenizer
    if not _keeps_every_byte(json.loads(pre.__getstate__()) if pre is not None else None):
        return None
    if any(token.lstrip or token.rstrip for token in tokenizer.added_tokens_decoder.values()):
        return None
    longest = max(len(token.encode("utf-8")) for token in backend.get_vocab(with_added_tokens=True))
    return max(longest, UNKNOWN_CHAR_BYTES if model.unk_token is not None else 1)


class PromptSize:
    """``at_least(text)``: a lower bound on ``text``'s token count (0 when the tokenizer allows none)."""

    def __init__(self, tokenizer: Any) -> None:
        self.bytes_per_token = max_bytes_per_token(tokenizer)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._normalizer = backend.normalizer if backend is not None else None

    def at_least(self, text: str) -> int:
        if self.bytes_per_token is None:
            return 0
        if self._normalizer is not None:
            text = self._normalizer.normalize_str(text)
        return -(-len(text.encode("utf-8", "surrogatepass")) // self.bytes_per_token)
