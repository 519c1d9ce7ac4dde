"""Hypothesis strategies for the proxy's three request APIs: valid bodies and subtly broken ones.

``valid_body(api)`` draws a body the API documents (roles in order, tool calls
answered by tool results with matching ids, sampling values in range);
``mutated_body(api)`` takes one and breaks it in one place: a wrong type, a
missing field, an extreme or out-of-range value, odd Unicode (lone surrogates,
NULs, bidi marks, chat-template tags), an unknown key. Shared by the pure
parse tier (``tests/proxy_parse``) and the HTTP fuzz tier
(``tests/real/proxy/test_proxy_fuzz.py``). Only ``hypothesis`` and the standard
library are imported.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

APIS = ("anthropic", "chat", "responses")
PATHS = {"anthropic": "/v1/messages", "chat": "/v1/chat/completions", "responses": "/v1/responses"}

ODD_STRINGS = ["", " ", "\x00", "\ud800", "a\udfffb", "\u202e\u200b", "😀", "<|im_end|>", "<|im_start|>assistant\n",
               "<tool_call>{\"name\": 1}</tool_call>", "</think>", "\\u0000", "x" * 3000, "NaN", "true"]
odd_text = st.one_of(st.text(max_size=20), st.sampled_from(ODD_STRINGS))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63), st.sampled_from([0, -1, 1, 2**31, 10**30]),
                    st.floats(allow_nan=False, allow_infinity=False), odd_text)
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                              st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                           max_leaves=8)
plain_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=24)
call_ids = st.integers(0, 10**6).map(lambda n: f"call_{n}")
arguments = st.dictionaries(st.sampled_from(["command", "path", "n"]), st.one_of(plain_text, st.integers(0, 99)),
                            max_size=2)


@st.composite
def _turns(draw: Any) -> list[tuple[str, Any]]:
    """An abstract conversation: ("user", text), ("call", [(id, name, args)]), ("results", [(id, text)])."""
    turns: list[tuple[str, Any]] = [("user", draw(plain_text))]
    for _ in range(draw(st.integers(0, 2))):
        ids = draw(st.lists(call_ids, min_size=1, max_size=2, unique=True))
        calls = [(i, draw(st.sampled_from(["Bash", "read"])), draw(arguments)) for i in ids]
        turns += [("call", calls), ("results", [(i, draw(plain_text)) for i in ids])]
        if draw(st.booleans()):
            turns.append(("user", draw(plain_text)))
    return turns


def _anthropic(turns: list, draw: Any) -> dict[str, Any]:
    messages = []
    for kind, value in turns:
        if kind == "user":
            messages.append({"role": "user", "content": value if draw(st.booleans()) else
                             [{"type": "text", "text": value}]})
        elif kind == "call":
            messages.append({"role": "assistant", "content": [{"type": "text", "text": "ok"}] + [
                {"type": "tool_use", "id": i, "name": n, "input": a} for i, n, a in value]})
        else:
            messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": i, "content": t}
                                                         for i, t in value]})
    body: dict[str, Any] = {"model": "m", "max_tokens": draw(st.integers(1, 64)), "messages": messages,
                            "stream": draw(st.booleans())}
    optional = {"system": draw(st.one_of(plain_text, st.just([{"type": "text", "text": "sys",
                                                                 "cache_control": {"type": "ephemeral"}}]))),
                "temperature": draw(st.floats(0, 1)), "top_p": draw(st.floats(0.01, 1)), "top_k": draw(st.integers(1, 50)),
                "stop_sequences": draw(st.lists(plain_text, max_size=2)),
                "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}],
                "thinking": {"type": draw(st.sampled_from(["enabled", "disabled", "adaptive"])), "budget_tokens": 1024},
                "metadata": {"user_id": "u"}}
    body.update({k: v for k, v in optional.items() if draw(st.booleans())})
    return body


def _chat(turns: list, draw: Any) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": draw(st.sampled_from(["system", "developer"])), "content": "sys"})
    for kind, value in turns:
        if kind == "user":
            messages.append({"role": "user", "content": value if draw(st.booleans()) else
                             [{"type": "text", "text": value}]})
        elif kind == "call":
            messages.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": i, "type": "function", "function": {"name": n, "arguments": _dumps(a)}} for i, n, a in value]})
        else:
            messages += [{"role": "tool", "tool_call_id": i, "content": t} for i, t in value]
    body: dict[str, Any] = {"model": "m", "messages": messages}
    stream = draw(st.booleans())
    optional = {"max_tokens": draw(st.integers(1, 64)), "max_completion_tokens": draw(st.integers(1, 64)),
                "stream": stream, "temperature": draw(st.floats(0, 2)), "top_p": draw(st.floats(0.01, 1)),
                "stop": draw(st.one_of(plain_text, st.lists(plain_text, max_size=2))), "n": 1, "seed": 3,
                "logprobs": draw(st.booleans()),
                "tools": [{"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}}]}
    body.update({k: v for k, v in optional.items() if draw(st.booleans())})
    if stream and body.get("stream") and draw(st.booleans()):
        body["stream_options"] = {"include_usage": draw(st.booleans())}
    return body


def _responses(turns: list, draw: Any) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for kind, value in turns:
        if kind == "user":
            items.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": value}]})
        elif kind == "call":
            if draw(st.booleans()):
                items.append({"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]})
            items += [{"type": "function_call", "call_id": i, "name": n, "arguments": _dumps(a)} for i, n, a in value]
        else:
            items += [{"type": "function_call_output", "call_id": i, "output": t} for i, t in value]
    body: dict[str, Any] = {"model": "m", "input": items}
    optional = {"instructions": "be brief", "max_output_tokens": draw(st.integers(1, 64)), "stream": draw(st.booleans()),
                "temperature": draw(st.floats(0, 2)), "top_p": draw(st.floats(0.01, 1)), "store": False,
                "reasoning": {"effort": "low"}, "include": [], "prompt_cache_key": "k",
                "tools": [{"type": "function", "name": "Bash", "parameters": {"type": "object"}},
                          {"type": "web_search"}]}
    body.update({k: v for k, v in optional.items() if draw(st.booleans())})
    return body


def _dumps(value: Any) -> str:
    import json

    return json.dumps(value)


BUILDERS = {"anthropic": _anthropic, "chat": _chat, "responses": _responses}


@st.composite
def valid_body(draw: Any, api: str) -> dict[str, Any]:
    return BUILDERS[api](draw(_turns()), draw)


def _slots(value: Any, path: tuple = ()) -> list[tuple]:
    """Every path into a JSON value (the root excluded)."""
    out = []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        out.append(path + (key,))
        out += _slots(item, path + (key,))
    return out


@st.composite
def mutated_body(draw: Any, api: str) -> dict[str, Any]:
    """A valid body broken in one place (which may by chance still be valid)."""
    body = copy.deepcopy(draw(valid_body(api)))
    slots = _slots(body)
    path = draw(st.sampled_from(slots))
    parent = body
    for key in path[:-1]:
        parent = parent[key]
    action = draw(st.sampled_from(["replace", "replace", "delete", "extreme", "add"]))
    if action == "delete" and isinstance(parent, dict):
        del parent[path[-1]]
    elif action == "extreme":
        parent[path[-1]] = draw(st.sampled_from([-1, 0, 2**63, 1e308, -1e-300, "", "false", [], {}, None, True,
                                                 "\ud800", [[[[[[]]]]]]]))
    elif action == "add" and isinstance(parent, dict):
        parent[draw(st.sampled_from(["zzz", "type", "role", "content", "id", "\ud800"]))] = draw(json_values)
    else:
        parent[path[-1]] = draw(json_values)
    return body


@st.composite
def any_body(draw: Any, api: str) -> dict[str, Any]:
    return draw(st.one_of(valid_body(api), mutated_body(api), mutated_body(api)))
