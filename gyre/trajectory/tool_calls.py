"""Tool-call payload cache: undo harness re-serialization before matching.

Harnesses parse the model's tool calls and re-serialize them when they send the
history back (JSON arguments re-dumped with other spacing or key order, ids
rewritten). Serialized again, such a history no longer matches the tokens the
model produced, and the trajectory tree would branch for nothing. The proxy
therefore caches every tool-call block of a model output, keyed by call id,
and restores the cached raw block into later requests before serialization.

Message shapes understood (plain dicts, as the harness APIs send them):
- Anthropic Messages: ``{"role": "assistant", "content": [{"type": "tool_use", "id": ...}]}``;
- OpenAI Chat Completions: ``{"role": "assistant", "tool_calls": [{"id": ..., "function": ...}]}``;
- OpenAI Responses input items: ``{"type": "function_call", "call_id": ...}``.

Invariants:
- ``restore`` is pure: it returns a new list and never mutates its input;
  messages it does not change are passed through as the same objects, and a
  restored block is a shallow copy of the cached one (treat returned messages
  as read-only), so its cost is one scan of the messages;
- a restored block equals the cached block except for its id field, which
  keeps the *incoming* id (tool results are correlated by the incoming id);
- blocks whose id is not cached are left exactly as they came;
- ids are compared after ``normalize_id`` (identity by default), for harnesses
  that rewrite id prefixes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

Message = Mapping[str, Any]

_BLOCK_ID_FIELD = {"tool_use": "id", "function_call": "call_id", "custom_tool_call": "call_id"}


def _identity(call_id: str) -> str:
    return call_id


@dataclass(frozen=True)
class RestoreResult:
    messages: list[Message]
    restored: tuple[str, ...]  # incoming ids whose payload was restored
    unknown: tuple[str, ...]  # incoming ids with no cached payload


def _block_slots(message: Message) -> Iterator[tuple[str, Any, str]]:
    """Yield (container kind, index, id field) for every tool-call block of a message."""
    kind = message.get("type")
    if kind in _BLOCK_ID_FIELD:
        yield "item", None, _BLOCK_ID_FIELD[kind]
        return
    content = message.get("content")
    if isinstance(content, list):
        for index, block in enumerate(content):
            if isinstance(block, Mapping) and block.get("type") in _BLOCK_ID_FIELD:
                yield "content", index, _BLOCK_ID_FIELD[block["type"]]
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for index, call in enumerate(calls):
            if isinstance(call, Mapping) and "id" in call:
                yield "tool_calls", index, "id"


def _get_block(message: Message, kind: str, index: Any) -> Mapping[str, Any]:
    return message if kind == "item" else message[kind][index]


def tool_call_ids(message: Message) -> list[str]:
    """The call ids of every tool-call block in ``message``, in order."""
    return [str(_get_block(message, kind, index)[field]) for kind, index, field in _block_slots(message)]


class ToolCallCache:
    """Raw tool-call blocks of model outputs, keyed by (normalized) call id."""

    def __init__(self, normalize_id: Callable[[str], str] = _identity) -> None:
        self.normalize_id = normalize_id
        self._payloads: dict[str, dict[str, Any]] = {}

    def __len__(self) -> int:
        return len(self._payloads)

    def __contains__(self, call_id: object) -> bool:
        return isinstance(call_id, str) and self.normalize_id(call_id) in self._payloads

    def remember(self, output_message: Message) -> list[str]:
        """Cache every tool-call block of a model output; returns their ids.

        The first payload seen for an id wins: it is what the model produced.
        """
        if not isinstance(output_message, Mapping):
            raise TypeError(f"a model output message must be a dict, got {type(output_message).__name__}")
        ids = []
        for kind, index, field in _block_slots(output_message):
            block = _get_block(output_message, kind, index)
            call_id = block[field]
            if not isinstance(call_id, str) or not call_id:
                raise ValueError(f"tool-call block has no usable {field!r}: {call_id!r}")
            self._payloads.setdefault(self.normalize_id(call_id), copy.deepcopy(dict(block)))
            ids.append(call_id)
        return ids

    def restore(self, messages: Sequence[Message]) -> RestoreResult:
        """Put cached raw blocks back into a request's messages (pure)."""
        restored: list[str] = []
        unknown: list[str] = []
        out = []
        for message in messages:
            if not isinstance(message, Mapping):
                raise TypeError(f"request messages must be dicts, got {type(message).__name__}")
            out.append(self._restore_message(message, restored, unknown))
        return RestoreResult(out, tuple(restored), tuple(unknown))

    def _restore_message(self, message: Message, restored: list[str], unknown: list[str]) -> Message:
        result: Any = message  # unchanged messages are passed through, never mutated
        for kind, index, field in _block_slots(message):
            incoming = _get_block(message, kind, index)[field]
            cached = self._payloads.get(self.normalize_id(str(incoming)))
            if cached is None:
                unknown.append(str(incoming))
                continue
            block = {**cached, field: incoming}
            if kind == "item":
                result = block
            else:
                if result is message:
                    result = dict(message)
                if result[kind] is message[kind]:
                    result[kind] = list(message[kind])
                result[kind][index] = block
            restored.append(str(incoming))
        return result
