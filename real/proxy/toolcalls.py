"""Qwen-style output format: thinking, text and ``<tool_call>`` JSON blocks.

A Qwen-family model writes its output as::

    <think>reasoning</think>visible text
    <tool_call>
    {"name": "bash", "arguments": {"command": "ls"}}
    </tool_call>

``parse_output`` splits a finished output into thinking, text and tool calls;
``OutputSplitter`` does the same incrementally for streaming, emitting events
as soon as they are certain.

Invariants:
- the splitter never emits a byte twice and never emits text that could still
  turn out to be the start of a tag (it holds back a possible tag prefix);
- feeding any split of a string and then ``finish()`` yields the same events
  (after merging adjacent deltas of one kind) as ``parse_output`` on the whole;
- visible text is stripped: leading whitespace of the first text is dropped,
  and trailing whitespace is held back until more visible text follows it
  (dropped when a tool call or the end follows);
- a lone UTF-16 surrogate a tool call's JSON spells (``"\\ud800"``) is
  replaced by U+FFFD in the parsed name, argument keys and values (a pair
  stays the character it encodes): what the proxy returns is valid Unicode,
  so the SDKs parse it and a harness that echoes it is accepted back; the
  record keeps the model's tokens as sampled;
- a ``<tool_call>`` block whose body is not a JSON object with a string
  ``name`` (``NaN``/``Infinity`` are not JSON) is not a tool call: its raw text is emitted as visible text, so
  nothing the model wrote is lost;
- ``trim_stop`` / ``StopHoldback`` cut the output at the stop string the
  engine matched; streamed and whole results are equal;
- thinking is recognised only at the very start of the output (after optional
  whitespace), or when the chat template already opened ``<think>`` (then
  ``in_thinking=True``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
STOP_MARGIN = 32  # characters past a stop string that its last token may carry
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    """A parsed tool call: ``arguments`` is the decoded JSON object."""

    name: str
    arguments: dict[str, Any]
    raw: str  # the JSON text the model wrote between the tags

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True)
class OutputEvent:
    """One streaming event: kind is ``thinking``, ``text`` or ``tool_call``."""

    kind: str
    text: str = ""
    call: ToolCall | None = None


@dataclass(frozen=True)
class ParsedOutput:
    thinking: str
    text: str
    tool_calls: tuple[ToolCall, ...]


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _replace_surrogates(value: Any) -> Any:
    """``value`` with every lone surrogate in its strings (keys included) replaced by U+FFFD."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_replace_surrogates(k): _replace_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_surrogates(v) for v in value]
    return value


def parse_tool_call(body: str) -> ToolCall | None:
    """The tool call in a ``<tool_call>`` body, or None when it is not one."""
    try:
        data = json.loads(body, parse_constant=_not_json)
        if _SURROGATE_ESCAPE.search(body):  # only an escape can spell a lone surrogate
            data = _replace_surrogates(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = _replace_surrogates(json.loads(arguments, parse_constant=_not_json))
        except (ValueError, RecursionError):
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(data["name"], arguments, body.strip())


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The text a Qwen model writes for one tool call (what scripted engines emit)."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}"


def _partial_tag_len(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a tag."""
    best = 0
    for tag in tags:
        if text.find(tag[0], max(len(text) - len(tag) + 1, 0)) < 0:  # each prefix begins with the first character
            continue
        for size in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:size]):
                best = size
                break
    return best


class OutputSplitter:
    """Incremental parser of the Qwen output format; see module invariants."""

    def __init__(self, *, in_thinking: bool = False) -> None:
        self._buffer = ""
        self._mode = "thinking" if in_thinking else "start"
        self._call_text = ""
        self._text_started = False

    def feed(self, delta: str) -> list[OutputEvent]:
        self._buffer += delta
        events: list[OutputEvent] = []
        while self._step(events):
            pass
        return _merged(events)

    def finish(self) -> list[OutputEvent]:
        """Flush everything held back (an unclosed tool call becomes text)."""
        events: list[OutputEvent] = []
        while self._step(events):
            pass
        if self._mode == "call":
            events.append(OutputEvent("text", CALL_OPEN + self._call_text + self._buffer))
        else:
            self._emit("thinking" if self._mode == "thinking" else "text", self._buffer, events)
        self._buffer, self._call_text = "", ""
        self._mode = "text"
        return _merged(events)

    def _step(self, events: list[OutputEvent]) -> bool:
        """Consume what is certain in the buffer; True if the state changed."""
        if self._mode == "start":
            stripped = self._buffer.lstrip()
            if stripped.startswith(THINK_OPEN):
                self._buffer, self._mode = stripped[len(THINK_OPEN):], "thinking"
                return True
            if THINK_OPEN.startswith(stripped) and len(stripped) < len(THINK_OPEN):
                return False  # may still become <think>
            self._mode = "text"
            return True
        if self._mode == "thinking":
            return self._until(THINK_CLOSE, "thinking", events, next_mode="text")
        if self._mode == "text":
            return self._until(CALL_OPEN, "text", events, next_mode="call")
        return self._in_call(events)

    def _until(self, tag: str, kind: str, events: list[OutputEvent], *, next_mode: str) -> bool:
        index = self._buffer.find(tag)
        if index >= 0:
            self._emit(kind, self._buffer[:index], events)
            self._buffer, self._mode = self._buffer[index + len(tag):], next_mode
            return True
        keep = _partial_tag_len(self._buffer, (tag,))
        ready = self._buffer[: len(self._buffer) - keep]
        if kind == "text":
            ready = ready.rstrip()  # trailing whitespace waits for what follows it
        if ready:
            self._emit(kind, ready, events)
            self._buffer = self._buffer[len(ready):]
        return False

    def _emit(self, kind: str, text: str, events: list[OutputEvent]) -> None:
        if kind == "text":
            text = text.rstrip() if self._text_started else text.strip()
            self._text_started = self._text_started or bool(text)
        if text:
            events.append(OutputEvent(kind, text))

    def _in_call(self, events: list[OutputEvent]) -> bool:
        index = self._buffer.find(CALL_CLOSE)
        if index < 0:
            return False
        body = self._call_text + self._buffer[:index]
        self._buffer, self._call_text, self._mode = self._buffer[index + len(CALL_CLOSE):], "", "text"
        call = parse_tool_call(body)
        if call is None:
            events.append(OutputEvent("text", CALL_OPEN + body + CALL_CLOSE))
        else:
            events.append(OutputEvent("tool_call", call=call))
        return True


def _merged(events: list[OutputEvent]) -> list[OutputEvent]:
    out: list[OutputEvent] = []
    for event in events:
        if out and event.kind != "tool_call" and out[-1].kind == event.kind:
            out[-1] = OutputEvent(event.kind, out[-1].text + event.text)
        elif event.kind == "tool_call" or event.text:
            out.append(event)
    return out


def parse_output(text: str, *, in_thinking: bool = False) -> ParsedOutput:
    """Split a finished output into thinking, visible text and tool calls.

    An output with no ``<`` outside thinking holds no tag: it is its visible text, stripped (what
    ``OutputSplitter`` makes of it, without its steps: the recorder parses every answer's output)."""
    if not in_thinking and "<" not in text:
        return ParsedOutput("", text.strip(), ())
    splitter = OutputSplitter(in_thinking=in_thinking)
    events = splitter.feed(text) + splitter.finish()
    thinking = "".join(e.text for e in events if e.kind == "thinking")
    visible = "".join(e.text for e in events if e.kind == "text")
    calls = tuple(e.call for e in events if e.call is not None)
    return ParsedOutput(thinking.strip(), visible, calls)


# -- stop strings: the APIs never return the stop sequence itself --------------------------


def trim_stop(text: str, matched: str | None) -> str:
    """``text`` up to the stop string the engine matched (the APIs never return it)."""
    if not matched:
        return text
    index = text.rfind(matched, max(0, len(text) - len(matched) - STOP_MARGIN))
    return text[:index] if index >= 0 else text


class StopHoldback:
    """Stream text deltas, holding back a tail that may still be a stop string.

    The concatenation of ``push`` outputs and ``finish(matched)`` equals
    ``trim_stop(all text, matched)``.
    """

    def __init__(self, stops: list[str]) -> None:
        self.keep = max(map(len, stops)) + STOP_MARGIN if stops else 0
        self.tail = ""

    def push(self, delta: str) -> str:
        if not self.keep:
            return delta
        self.tail += delta
        ready = len(self.tail) - self.keep
        if ready <= 0:
            return ""
        out, self.tail = self.tail[:ready], self.tail[ready:]
        return out

    def finish(self, matched: str | None) -> str:
        if not self.keep:
            return ""
        index = self.tail.rfind(matched) if matched else -1
        out, self.tail = (self.tail[:index] if index >= 0 else self.tail), ""
        return out
