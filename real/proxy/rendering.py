"""Incremental chat-template rendering: render only what is new after a cached prefix.

A follow-up call of an execution sends the whole history again: the previous
call's messages plus a few new ones (the assistant's answer, tool results, a
user turn). Rendering the model's chat template over all of it (a 30 KB
system prompt, two dozen tool schemas through ``tojson``) costs milliseconds
per call; the text of the old part is already known.

``RenderCache`` (one per execution) keeps the last few renderings: the
template messages, tools and thinking flag, and the rendered text *without*
the generation prompt. ``IncrementalRenderer.extend`` finds an entry whose
messages are a prefix of the new history (same tools, same thinking flag)
and renders only the new messages ``A`` through a small *probe*: the first
message, the last user message and the last message of the cached history
(the context a chat template looks at: the system header, the last query,
the previous role), with a one-function stand-in for the tool list. With
``P`` the probe, ``render(P)`` must be a prefix of ``render(P + A)``
(else the template rewrites old text, e.g. a closing tag moves: full
rendering), and the new text is ``cached text + render(P + A)[len(render(P)):]``.

Most of those renderings repeat, so each is done once: the generation prompt
(``prompted`` minus ``after``) is learned once per thinking flag and tool
presence, and ``render(P)`` of a cached entry is kept on the entry. A follow-up
then costs one small rendering (``P + A`` with the prompt) plus, the first time
its base is extended, ``render(P)``; a repeated call of the same history costs
none.

The probe assumes a template renders a message from itself, that context and
whether tools exist, and that the generation prompt is a fixed suffix. To catch
a template that breaks this, the first ``verify_first`` incremental renderings
and then one in ``verify_every`` are compared with a full rendering; on the
first difference incremental rendering is switched off for good (a warning
names it) and full renderings are used.

Invariants:
- ``render`` returns exactly ``ChatTokenizer.render(messages, tools, thinking)``
  whenever the template renders messages locally (see above), and always
  when incremental rendering is off or the history is not an extension;
- a probe that fails to render, or whose texts are not prefixes of each
  other, falls back to a full rendering (never an error of its own);
- a full rendering that fails raises exactly what ``ChatTokenizer.render`` raises.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

log = logging.getLogger("gyre.proxy")
PROBE_TOOLS = [{"type": "function", "function": {"name": "probe", "description": "",
                                                 "parameters": {"type": "object"}}}]

# render(messages, tools, thinking, generation_prompt) -> text
RenderFn = Callable[[list[dict[str, Any]], "list[dict[str, Any]] | None", "bool | None", bool], str]


@dataclass
class Rendered:
    """One cached rendering: its inputs and its text without the generation prompt.
    ``probe_text`` holds ``render(probe_for(messages))`` (no prompt) once it is known."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    thinking: bool | None
    text: str
    probe_text: str | None = field(default=None, compare=False)


class RenderCache:
    """The last ``size`` renderings of one execution (newest last). Entries of one chain of
    follow-ups share their message objects, so memory grows with the history, not with ``size``."""

    def __init__(self, size: int = 2) -> None:  # a main thread and one subagent branch
        self._entries: deque[Rendered] = deque(maxlen=size)

    def remember(self, entry: Rendered) -> None:
        self._entries.append(entry)

    def base_for(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                 thinking: bool | None) -> Rendered | None:
        """The longest cached rendering whose messages start ``messages`` (same tools and thinking)."""
        best = None
        for entry in reversed(self._entries):
            n = len(entry.messages)
            if (n <= len(messages) and (best is None or n > len(best.messages)) and entry.thinking == thinking
                    and entry.tools == tools and messages[:n] == entry.messages):
                best = entry
        return best

    def __len__(self) -> int:
        return len(self._entries)


def probe_for(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """First message, last user message and last message of ``messages`` (each once, in order)."""
    picks = {0, len(messages) - 1}
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    if users:
        picks.add(users[-1])
    return [messages[i] for i in sorted(picks)]


class IncrementalRenderer:
    """Renders through a ``RenderCache``; see the module invariants. Shared by all executions."""

    def __init__(self, render: RenderFn, *, verify_first: int = 4, verify_every: int = 32) -> None:
        self._render = render
        self.verify_first = verify_first
        self.verify_every = verify_every
        self.enabled = True
        self.full = 0          # full renderings
        self.incremental = 0   # renderings of only the new messages
        self.verified = 0      # incremental renderings checked against a full one
        self._suffixes: dict[tuple[bool | None, bool], str | None] = {}  # generation prompts (see the docstring)

    def render(self, cache: RenderCache, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
               thinking: bool | None) -> str:
        text = self.extend(cache, messages, tools, thinking)
        return text if text is not None else self.render_full(cache, messages, tools, thinking)

    def extend(self, cache: RenderCache, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
               thinking: bool | None) -> str | None:
        """The prompt text rendered incrementally, or None when a full rendering is needed."""
        base = cache.base_for(messages, tools, thinking) if self.enabled and messages else None
        if base is None or not base.messages:
            return None
        probe = probe_for(base.messages)
        new = messages[len(base.messages):]
        stand_in = PROBE_TOOLS if tools else None
        try:
            if base.probe_text is None:
                base.probe_text = self._render(probe, stand_in, thinking, False)
            before = base.probe_text
            suffix = self._prompt_suffix(probe, stand_in, thinking, before)
            prompted = self._render(probe + new, stand_in, thinking, True) if new else before + (suffix or "")
        except Exception:  # noqa: BLE001 - the full rendering names the problem, if there is one
            return None
        if suffix is None or not (prompted.endswith(suffix) and prompted.startswith(before)
                                  and len(prompted) - len(suffix) >= len(before)):
            return None
        after = prompted[:len(prompted) - len(suffix)]
        text = base.text + prompted[len(before):]
        self.incremental += 1
        if self._due():
            self.verified += 1
            full = self._render(messages, tools or None, thinking, True)
            if full != text:
                self.enabled = False
                log.warning("chat template does not render messages locally (incremental rendering differs "
                            "after %d calls); rendering every call in full from now on", self.incremental)
                self._remember(cache, messages, tools, thinking, full)
                return full
        if new:  # the base's own message objects and tools: a chain of follow-ups shares one copy of its history
            cache.remember(Rendered(base.messages + new, base.tools, thinking, base.text + after[len(before):]))
        return text

    def render_full(self, cache: RenderCache, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                    thinking: bool | None) -> str:
        """A full rendering (safe on a worker thread); remembered for the next call of the execution."""
        text = self._render(messages, tools or None, thinking, True)
        self.full += 1
        if self.enabled and messages:
            self._remember(cache, messages, tools, thinking, text)
        return text

    def _remember(self, cache: RenderCache, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                  thinking: bool | None, prompted: str) -> None:
        """Cache ``prompted`` minus its generation prompt (found through the probe of ``messages``)."""
        probe = probe_for(messages)
        stand_in = PROBE_TOOLS if tools else None
        try:
            bare = self._render(probe, stand_in, thinking, False)
            suffix = self._prompt_suffix(probe, stand_in, thinking, bare)
        except Exception:  # noqa: BLE001 - nothing cached: the next call renders in full
            return
        if suffix is not None and prompted.endswith(suffix):
            cache.remember(Rendered(messages, tools, thinking, prompted[:len(prompted) - len(suffix)], bare))

    def _prompt_suffix(self, probe: list[dict[str, Any]], stand_in: list[dict[str, Any]] | None,
                       thinking: bool | None, bare: str) -> str | None:
        """The generation prompt the template appends (learned once per thinking flag and tool
        presence, from ``probe`` whose rendering without it is ``bare``); None when it is not a suffix."""
        key = (thinking, stand_in is not None)
        if key not in self._suffixes:
            with_prompt = self._render(probe, stand_in, thinking, True)
            self._suffixes[key] = with_prompt[len(bare):] if with_prompt.startswith(bare) else None
        return self._suffixes[key]

    def _due(self) -> bool:
        if self.incremental <= self.verify_first:
            return True
        return self.verify_every > 0 and self.incremental % self.verify_every == 0
