"""Tool-call payload cache (tool_calls.py)."""

from __future__ import annotations

import copy

import pytest

from gyre.trajectory.tool_calls import ToolCallCache, tool_call_ids


def anthropic_output():
    return {"role": "assistant", "content": [
        {"type": "text", "text": "let me look"},
        {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "a.py", "limit": 10},
         "raw": '{"path":"a.py",  "limit":10}'},
    ]}


def test_anthropic_tool_use_is_restored_keeping_the_incoming_id():
    cache = ToolCallCache()
    assert cache.remember(anthropic_output()) == ["toolu_1"]
    reformatted = {"role": "assistant", "content": [
        {"type": "text", "text": "let me look"},
        {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"limit": 10, "path": "a.py"}},
    ]}
    history = [{"role": "user", "content": "hi"}, reformatted,
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "x"}]}]
    before = copy.deepcopy(history)
    result = cache.restore(history)
    assert history == before  # pure
    assert result.restored == ("toolu_1",) and result.unknown == ()
    assert result.messages[1]["content"][1] == anthropic_output()["content"][1]
    assert result.messages[2] == history[2]


def test_openai_chat_and_responses_shapes():
    cache = ToolCallCache()
    chat_out = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"  }'}}]}
    item_out = {"type": "function_call", "call_id": "call_b", "name": "bash", "arguments": '{ "cmd":"pwd"}'}
    cache.remember(chat_out)
    cache.remember(item_out)
    chat_in = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}]}
    item_in = {"type": "function_call", "call_id": "call_b", "name": "bash", "arguments": '{"cmd": "pwd"}'}
    result = cache.restore([chat_in, item_in, {"role": "user", "content": "ok"}])
    assert result.messages[0] == chat_out and result.messages[1] == item_out
    assert tool_call_ids(item_in) == ["call_b"]


def test_rewritten_ids_match_after_normalization_and_keep_the_incoming_id():
    cache = ToolCallCache(normalize_id=lambda i: i.split("_", 1)[-1])
    cache.remember({"type": "function_call", "call_id": "call_42", "name": "f", "arguments": "{ }"})
    restored = cache.restore([{"type": "function_call", "call_id": "fc_42", "name": "f", "arguments": "{}"}])
    assert restored.messages[0] == {"type": "function_call", "call_id": "fc_42", "name": "f", "arguments": "{ }"}
    assert "fc_42" in cache and "zzz" not in cache


def test_unknown_ids_are_left_alone_and_first_payload_wins():
    cache = ToolCallCache()
    cache.remember({"type": "function_call", "call_id": "c1", "name": "f", "arguments": "A"})
    cache.remember({"type": "function_call", "call_id": "c1", "name": "f", "arguments": "B"})
    assert len(cache) == 1
    unknown = {"type": "function_call", "call_id": "c9", "name": "g", "arguments": "{}"}
    result = cache.restore([unknown, {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "?"}])
    assert result.messages[0] == unknown and result.unknown == ("c9",)
    assert result.messages[1]["arguments"] == "A"


def test_bad_input_raises():
    cache = ToolCallCache()
    with pytest.raises(TypeError, match="must be a dict"):
        cache.remember(["not", "a", "message"])
    with pytest.raises(ValueError, match="no usable 'id'"):
        cache.remember({"role": "assistant", "content": [{"type": "tool_use", "id": "", "name": "x"}]})
    with pytest.raises(TypeError, match="request messages must be dicts"):
        cache.restore(["oops"])
