"""Incremental chat-template rendering (proxy.rendering) equals full rendering, token for token.

Histories are generated (seeded): system prompts, user turns, assistant text
and tool calls, runs of tool results, branches (an earlier turn edited, the
history cut back), tool lists and thinking flags that change. Each call of an
execution is rendered through its ``RenderCache`` with verification off, so
every incremental rendering stands on its own, and compared with a full
rendering by the real tiny tokenizer's Qwen-style chat template.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

try:
    from proxy_fixtures import (ScriptedEngine, ServerThread, build_tiny_tokenizer, echo_script, proxy_config,
                                shared_tiny_dir, start_proxy)
except ImportError:
    from .proxy_fixtures import (ScriptedEngine, ServerThread, build_tiny_tokenizer, echo_script, proxy_config,
                                 shared_tiny_dir, start_proxy)

from gyre.real.proxy.rendering import IncrementalRenderer, RenderCache, probe_for

WORDS = "the file tests run fix build error value 42 é 漢 \n <tag> {json} done".split(" ")


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    from gyre.real.proxy.tokenize import ChatTokenizer

    return ChatTokenizer(str(build_tiny_tokenizer(shared_tiny_dir(tmp_path_factory))))


def text(rng: np.random.Generator, most: int = 12) -> str:
    return " ".join(rng.choice(WORDS, size=int(rng.integers(1, most))))


def tools_for(rng: np.random.Generator) -> list:
    return [{"type": "function", "function": {"name": f"Tool{i}", "description": text(rng),
                                              "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}}
            for i in range(int(rng.integers(0, 4)))]


def new_turns(rng: np.random.Generator, calls: list[str]) -> list[dict]:
    """What a follow-up adds: an assistant answer (text and/or tool calls), tool results, a user turn."""
    turns = []
    tool_calls = [{"id": f"c{len(calls) + k}", "type": "function",
                   "function": {"name": f"Tool{k}", "arguments": {"x": text(rng, 4)}}}
                  for k in range(int(rng.choice([0, 0, 1, 2])))]
    turns.append({"role": "assistant", "content": text(rng) if rng.random() < 0.8 or not tool_calls else "",
                  **({"tool_calls": tool_calls} if tool_calls else {})})
    for call in tool_calls:
        calls.append(call["id"])
        turns.append({"role": "tool", "tool_call_id": call["id"], "content": text(rng)})
    if not tool_calls or rng.random() < 0.3:
        turns.append({"role": "user", "content": text(rng)})
    return turns


class DrawnChoices:
    """The part of ``numpy.random.Generator`` that ``histories`` uses, every choice drawn by Hypothesis
    (so a failing conversation shrinks to a small one)."""

    def __init__(self, data) -> None:
        self.data = data

    def random(self) -> float:
        return self.data.draw(st.floats(0, 1, exclude_max=True))

    def integers(self, low: int, high: int) -> int:
        return self.data.draw(st.integers(low, high - 1))

    def choice(self, options, size=None):
        pick = st.sampled_from(list(options))
        return self.data.draw(pick) if size is None else [self.data.draw(pick) for _ in range(size)]


def histories(seed, calls_per_execution: int = 10):
    """Yield (messages, tools, thinking) of the successive calls of one generated execution
    (``seed``: an int for a seeded generator, or a ``DrawnChoices``)."""
    rng = np.random.default_rng(seed) if isinstance(seed, int) else seed
    messages = ([{"role": "system", "content": text(rng, 40)}] if rng.random() < 0.7 else [])
    messages.append({"role": "user", "content": text(rng)})
    tools, thinking, calls = tools_for(rng), rng.choice([None, True, False]), []
    earlier = messages
    for _ in range(calls_per_execution):
        yield [dict(m) for m in messages], tools, thinking
        roll = rng.random()
        if roll >= 0.25 and roll < 0.3:  # a retry: the same history again
            continue
        if roll >= 0.3 and roll < 0.35:  # a sibling: another continuation of the call before this one
            messages = earlier
        earlier = messages
        if roll < 0.1 and len(messages) > 2:  # branch: cut back to an earlier user turn
            users = [i for i, m in enumerate(messages) if m["role"] == "user"]
            messages = messages[:users[int(rng.integers(0, len(users)))] + 1]
        elif roll < 0.18:  # an earlier message edited by the harness (e.g. compaction)
            index = int(rng.integers(0, len(messages)))
            messages[index] = dict(messages[index], content=text(rng))
        elif roll < 0.22:
            tools = tools_for(rng)
        elif roll < 0.25:
            thinking = rng.choice([None, True, False])
        messages = messages + new_turns(rng, calls)


def full(chat, messages, tools, thinking, generation_prompt=True):
    return chat.render(messages, tools or None, thinking=thinking, generation_prompt=generation_prompt)


def test_incremental_rendering_equals_full_rendering_token_for_token(chat):
    renderer = IncrementalRenderer(lambda m, t, th, g: full(chat, m, t, th, g), verify_first=0, verify_every=0)
    compared = 0
    for seed in range(40):
        cache = RenderCache()
        for messages, tools, thinking in histories(seed):
            got = renderer.render(cache, messages, tools, thinking)
            want = full(chat, messages, tools, thinking)
            assert got == want, (seed, messages)
            assert chat.encode(got) == chat.encode(want)
            compared += 1
    assert compared == 400
    assert renderer.incremental > 2 * renderer.full, (renderer.incremental, renderer.full)
    assert renderer.enabled


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_incremental_rendering_equals_full_rendering_on_hypothesis_conversations(chat, data):
    """The same property over conversations Hypothesis draws (and shrinks): every call of the
    execution, incremental or not, renders byte-identical text and token ids to a full rendering."""
    renderer = IncrementalRenderer(lambda m, t, th, g: full(chat, m, t, th, g), verify_first=0, verify_every=0)
    cache = RenderCache()
    for messages, tools, thinking in histories(DrawnChoices(data), calls_per_execution=6):
        got = renderer.render(cache, messages, tools, thinking)
        want = full(chat, messages, tools, thinking)
        assert got == want
        assert chat.encode(got) == chat.encode(want)
    assert renderer.enabled


def test_renderings_are_not_repeated_a_follow_up_costs_at_most_two_a_retry_at_most_one(chat):
    """Counted template renderings: the generation prompt is learned once; a follow-up renders its
    probe with the new messages, plus its base's probe unless an earlier call rendered it; the same
    history sent again renders at most that probe, and nothing the second time. Every answer is still
    the full rendering."""
    counted = []

    def render(messages, tools, thinking, prompt):
        counted.append(len(messages))
        return full(chat, messages, tools, thinking, prompt)

    def renders(history) -> int:
        before = len(counted)
        assert renderer.render(cache, history, [], None) == full(chat, history, [], None)
        return len(counted) - before

    renderer = IncrementalRenderer(render, verify_first=0, verify_every=0)
    cache = RenderCache()
    history = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
    assert renders(history) == 3  # the full rendering, its probe and the generation prompt
    for turn in range(3):
        history = history + [{"role": "assistant", "content": f"a{turn}"}, {"role": "user", "content": f"q{turn}"}]
        assert renders(history) == 1, turn  # the base's probe is known: from the full rendering, then a retry
        assert renders(history) == 1, turn  # a retry: the new entry's probe, once
        assert renders(history) == 0, turn
    history = history + [{"role": "assistant", "content": "a"}, {"role": "user", "content": "q"}]
    history = history + [{"role": "assistant", "content": "b"}, {"role": "user", "content": "r"}]
    assert renders(history[:-2]) == 1 and renders(history) == 2  # a chain without retries: two each
    assert renderer.full == 1 and renderer.incremental == 11


def test_a_template_the_probe_cannot_see_through_is_caught_by_verification():
    """A template that numbers messages by their absolute index is not local, and the probe (a
    shorter history) cannot tell: the verified incremental rendering differs, incremental rendering
    is switched off, and every answer is still exactly the full rendering."""
    def numbered(messages, tools, thinking, prompt):
        body = "".join(f"<{i}:{m['role']}>{m['content']}" for i, m in enumerate(messages))
        return body + ("<assistant>" if prompt else "")

    renderer = IncrementalRenderer(numbered, verify_first=2)
    cache = RenderCache()
    history = [{"role": "user", "content": "a"}]
    for turn in range(4):
        assert renderer.render(cache, history, [], None) == numbered(history, None, None, True)
        history = history + [{"role": "assistant", "content": f"r{turn}"}, {"role": "user", "content": f"q{turn}"}]
    assert not renderer.enabled and renderer.incremental == 2 and renderer.verified == 2


def test_a_closing_tag_that_moves_is_detected_by_the_probe(chat):
    """Tool results of the tiny template share one user block: appending a second result
    rewrites the first one's closing tag, so the probe sends that call to a full rendering."""
    renderer = IncrementalRenderer(lambda m, t, th, g: full(chat, m, t, th, g), verify_first=0, verify_every=0)
    cache = RenderCache()
    call = {"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": {"x": "1"}}}
    history = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "", "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "c1", "content": "one"}]
    renderer.render(cache, history, [], None)
    longer = history + [{"role": "tool", "tool_call_id": "c1", "content": "two"}]
    assert renderer.render(cache, longer, [], None) == full(chat, longer, [], None)
    assert renderer.incremental == 0 and renderer.full == 2


def test_template_errors_surface_from_the_full_rendering_and_probe_errors_fall_back():
    def picky(messages, tools, thinking, prompt):
        if any(m["content"] == "bad" for m in messages):
            raise ValueError("bad message")
        if len(messages) < 3 and messages[-1]["role"] == "assistant":
            raise ValueError("probe-sized conversations cannot end with an assistant")
        return "".join(m["content"] + "|" for m in messages) + ("> " if prompt else "")

    renderer = IncrementalRenderer(picky, verify_first=0, verify_every=0)
    cache = RenderCache()
    with pytest.raises(ValueError, match="bad message"):
        renderer.render(cache, [{"role": "user", "content": "bad"}], [], None)
    history = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
               {"role": "user", "content": "c"}]
    assert renderer.render(cache, history, [], None) == "a|b|c|> "
    longer = history + [{"role": "assistant", "content": "d"}, {"role": "user", "content": "e"}]
    assert renderer.render(cache, longer, [], None) == "a|b|c|d|e|> " and renderer.incremental == 1
    probe_fails = longer + [{"role": "assistant", "content": "f"}]
    assert renderer.render(cache, probe_fails, [], None) == "a|b|c|d|e|f|> "


def test_the_probe_keeps_first_last_user_and_last_message_in_order():
    roles = ["system", "user", "assistant", "tool", "user", "assistant", "tool"]
    messages = [{"role": r, "content": str(i)} for i, r in enumerate(roles)]
    assert [m["content"] for m in probe_for(messages)] == ["0", "4", "6"]
    assert probe_for(messages[:1]) == messages[:1]


def test_follow_up_calls_through_the_proxy_render_incrementally_and_record_the_full_prompt(
        chat, tmp_path_factory, tmp_path):
    """Three calls of one execution through a real proxy: the follow-ups take the incremental path
    (the first of them verified against a full rendering) and each record's input decodes to
    exactly the full rendering of its conversation."""
    import json
    import urllib.request

    from gyre.real.proxy.api.anthropic import canonical_tools
    from gyre.real.proxy.model_call import template_tools
    from gyre.real.store.tito_log import ExecutionStore

    model = build_tiny_tokenizer(shared_tiny_dir(tmp_path_factory))
    engine = ScriptedEngine(model, echo_script)
    tools = [{"name": "Bash", "description": "run a command", "input_schema": {"type": "object"}}]
    system = "you are a careful engineer " * 50
    with ServerThread(engine.application) as engine_thread:
        proxy_thread, server = start_proxy(proxy_config(model, tmp_path / "records", {"e0": engine_thread.url}), chat)
        try:
            messages, conversations = [], []
            for turn in range(3):
                messages.append({"role": "user", "content": f"question {turn}"})
                body = {"model": "m", "max_tokens": 32, "system": system, "tools": tools, "messages": messages}
                request = urllib.request.Request(proxy_thread.url + "/v1/messages", data=json.dumps(body).encode(),
                                                 headers={"x-api-key": "key-a", "content-type": "application/json"})
                with urllib.request.urlopen(request, timeout=30) as response:
                    answer = json.loads(response.read())["content"][0]["text"]
                conversations.append([{"role": "system", "content": system}, *messages])
                messages.append({"role": "assistant", "content": answer})
            renderer = server.service.renderer
        finally:
            proxy_thread.stop()
    assert (renderer.full, renderer.incremental, renderer.enabled) == (1, 2, True)
    records = ExecutionStore(tmp_path / "records").read("exec-a")
    rendered = [chat.render(c, template_tools(canonical_tools(tools))) for c in conversations]
    assert [chat.decode(r.input_ids.tolist()) for r in records] == rendered

