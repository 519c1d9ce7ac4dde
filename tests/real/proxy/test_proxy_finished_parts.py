"""The whole output is decoded and parsed for a call's end only when its answer needs it (``proxy.request``'s
``Finished.deferred``, ``proxy.model_call``).

An Anthropic or Chat Completions stream ends with the stop reason and the token count, never the whole
text, so its call never decodes and parses its whole output for ``Finished`` (the call's last step, the
answer waiting on it); a non-streaming answer, and a Responses stream (whose ``response.completed``
carries the text), still get the text and the thinking, parsed once.
"""

from __future__ import annotations

import json
import urllib.request

import pytest

from gyre.real.proxy import model_call

try:
    from proxy_fixtures import build_tiny_tokenizer, parse_sse, scripted_proxy_stack, shared_tiny_dir
except ImportError:
    from .proxy_fixtures import build_tiny_tokenizer, parse_sse, scripted_proxy_stack, shared_tiny_dir

pytestmark = pytest.mark.timeout(60)
ANSWER = "<think>plan it</think>the answer"


@pytest.fixture()
def stack(tmp_path_factory, monkeypatch):
    parsed: list[str] = []
    real = model_call.parse_output

    def counted(text, **kwargs):
        parsed.append(text)
        return real(text, **kwargs)

    monkeypatch.setattr(model_call, "parse_output", counted)  # ``ChatService._finished``'s parse only
    model = build_tiny_tokenizer(shared_tiny_dir(tmp_path_factory))
    with scripted_proxy_stack(model, lambda prompt: ANSWER, tmp_path_factory.mktemp("records"), fsync=True) as stack:
        yield stack["url"], parsed


def _post(url: str, path: str, body: dict) -> bytes:
    request = urllib.request.Request(url + path, json.dumps(body).encode(), method="POST",
                                     headers={"x-api-key": "key-a", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 200
        return answer.read()


def _messages(stream: bool, turn: str) -> dict:
    return {"model": "m", "max_tokens": 64, "stream": stream, "thinking": {"type": "enabled", "budget_tokens": 64},
            "messages": [{"role": "user", "content": turn}]}


def test_streams_ending_without_the_text_never_parse_the_whole_output(stack):
    url, parsed = stack
    events = parse_sse(_post(url, "/v1/messages", _messages(True, "first")))
    assert events[-1][0] == "message_stop" and events[-2][1]["usage"]["output_tokens"] > 0
    chat = _post(url, "/v1/chat/completions", {"model": "m", "max_tokens": 64, "stream": True,
                                                "messages": [{"role": "user", "content": "second"}]})
    assert chat.endswith(b"data: [DONE]\n\n")
    assert parsed == []


def test_answers_that_carry_the_text_parse_it_once(stack):
    url, parsed = stack
    answer = json.loads(_post(url, "/v1/messages", _messages(False, "first")))
    assert [(b["type"], b.get("thinking") or b.get("text")) for b in answer["content"]] == \
        [("thinking", "plan it"), ("text", "the answer")]
    assert len(parsed) == 1
    body = _post(url, "/v1/responses", {"model": "m", "max_output_tokens": 64, "stream": True, "input": "second"})
    completed = [json.loads(line[6:]) for line in body.decode().splitlines()
                 if line.startswith("data: ") and '"response.completed"' in line]
    assert completed and "the answer" in json.dumps(completed[0]["response"]["output"])
    assert len(parsed) == 2
