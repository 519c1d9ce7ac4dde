"""The fuzz tier over HTTP: generated requests of all three APIs and hostile model outputs.

Bodies come from ``tests/proxy_parse/proxy_bodies.py`` (valid and subtly
broken: wrong types, missing fields, odd Unicode, extremes); model outputs
are drawn from tags, JSON fragments, NaN, lone-surrogate escapes, special
tokens and raw token ids (partial UTF-8). Properties, for every call:
- never a 5xx (the engine is healthy), never a second status line;
- an error has the API's error shape and leaves nothing recorded;
- an answered call is recorded exactly once, and every SSE event and JSON
  body is valid JSON in valid UTF-8;
and at the end every recorded call replays exactly from disk (the tree
rebuilt from the log reproduces each request's ids, logprobs as sampled).
"""

from __future__ import annotations

import http.client
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "proxy_parse"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from proxy_bodies import APIS, PATHS, any_body  # noqa: E402
from hypothesis_budget import examples  # noqa: E402

try:
    from proxy_fixtures import (ScriptedEngine, ServerThread, build_tiny_tokenizer, proxy_config, shared_tiny_dir,
                                start_proxy, token_logprob)
except ImportError:
    from .proxy_fixtures import (ScriptedEngine, ServerThread, build_tiny_tokenizer, proxy_config,  # noqa: F401
                                 shared_tiny_dir, start_proxy, token_logprob)

pytestmark = pytest.mark.timeout(600)
FUZZ = settings(max_examples=examples(300), deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

PIECES = ["<think>", "</think>", "<tool_call>", "</tool_call>", "\n", "{\"name\": \"Bash\", \"arguments\": ",
          "{\"command\": \"ls\"}", "{\"n\": NaN}", "\"\\ud800\"", "\"\\udfff x\"", "}", "<|im_start|>", "<|im_end|>",
          "Infinity", "[[[[[[[[", "héllo 😀", "\\", "\x00", " "]


class Script:
    def __init__(self) -> None:
        self.answer: object = "ok"
        self.engine: ScriptedEngine | None = None

    def __call__(self, prompt: str) -> object:
        return self.answer

    def set(self, answer: object) -> None:
        self.answer = answer
        self.engine._cache.clear()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    model = build_tiny_tokenizer(shared_tiny_dir(tmp_path_factory))
    records = tmp_path_factory.mktemp("fuzz-records")
    script = Script()
    engine = ScriptedEngine(model, script, context_length=8192)
    script.engine = engine
    engine_thread = ServerThread(engine.application).start()
    proxy_thread, server = start_proxy(proxy_config(model, records, {"e0": engine_thread.url}))
    vocab = len(engine.tokenizer)
    yield {"port": proxy_thread.port, "server": server, "script": script, "records": records, "vocab": vocab,
           "model": model}
    proxy_thread.stop()
    engine_thread.stop()


def model_outputs(vocab: int) -> st.SearchStrategy:
    text = st.lists(st.sampled_from(PIECES), max_size=8).map("".join)
    ids = st.lists(st.integers(0, vocab - 1), max_size=12)
    return st.one_of(text, ids)


def call(port: int, path: str, raw: bytes) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", path, body=raw, headers={"content-type": "application/json", "x-api-key": "key-b"})
    response = conn.getresponse()
    payload = response.read()
    conn.close()
    return response.status, payload


def strict_json(text: str) -> object:
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))


def check_answer(api: str, status: int, payload: bytes) -> None:
    text = payload.decode("utf-8")
    assert "HTTP/1.1" not in text, "a second status line"
    if not text.startswith(("event:", "data:")):
        strict_json(text)
        return
    for block in text.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                event = strict_json(line[6:])
                assert "error" not in event or event.get("type") == "response.failed" or api != "chat", event
                assert not (isinstance(event, dict) and event.get("type") == "error"), event


def check_error(api: str, payload: bytes) -> None:
    body = strict_json(payload.decode("utf-8"))
    if api == "anthropic":
        assert body["type"] == "error" and {"type", "message"} <= set(body["error"]), body
    else:
        assert {"message", "type", "param", "code"} == set(body["error"]), body


@pytest.mark.parametrize("api", APIS)
def test_fuzzed_requests_and_outputs_never_break_the_proxy(stack, api):
    counts = {"ok": 0, "rejected": 0}

    @FUZZ
    @given(body=any_body(api), output=model_outputs(stack["vocab"]))
    def run(body, output):
        stack["script"].set(output)
        before = stack["server"].recorder.state("exec-b").requests
        status, payload = call(stack["port"], PATHS[api], json.dumps(body).encode())
        after = stack["server"].recorder.state("exec-b").requests
        assert status < 500, (status, payload[:400])
        if status == 200:
            check_answer(api, status, payload)
            assert after == before + 1
            counts["ok"] += 1
        else:
            check_error(api, payload)
            assert after == before, "a rejected call left a record"
            counts["rejected"] += 1

    run()
    print(f"\n{api}: {counts}")
    assert counts["ok"] > 0 and counts["rejected"] > 0, counts
    check_replay(stack)


def check_replay(stack: dict) -> None:
    """Every record of the fuzzed execution replays exactly from disk."""
    from gyre.real.store.tito_log import ExecutionStore
    from gyre.trajectory.tree import TrajectoryTree

    records = ExecutionStore(stack["records"]).read("exec-b")
    assert records, "the fuzz tests recorded nothing"
    tree = TrajectoryTree.from_records(records)
    for index, record in enumerate(records):
        assert np.array_equal(tree.request_sequence(index), record.sequence)
        expected = [token_logprob(t, k) for k, t in enumerate(record.output_ids.tolist())]
        np.testing.assert_allclose(record.output_logprobs, expected, rtol=0, atol=1e-12)
        json.loads(record.role_hints["requested"])
