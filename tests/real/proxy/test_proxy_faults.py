"""Keeping harnesses alive: engine failures, drain and reroute mid-stream, proxy restarts.

Two scripted engines stand behind one proxy. Every streamed answer is checked
against what one uninterrupted engine would have produced, and every record
with ``check_records`` (one call, no gap, no duplicate, logprobs of the
engine that sampled each token).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

anthropic = pytest.importorskip("anthropic")

try:
    from proxy_fixtures import (shared_tiny_dir, ScriptedEngine, ServerThread, admin, build_tiny_tokenizer, check_records, new_key,
                                proxy_config, start_proxy, tool_loop_script)
except ImportError:
    from .proxy_fixtures import (shared_tiny_dir, ScriptedEngine, ServerThread, admin, build_tiny_tokenizer, check_records, new_key,
                                 proxy_config, start_proxy, tool_loop_script)

pytestmark = pytest.mark.timeout(90)
LONG = "word " * 60


def long_script(prompt: str) -> str:
    return "Here is a long answer: " + LONG.strip()


@pytest.fixture
def pair(model, tmp_path):
    """Two scripted engines (e0, e1) behind one proxy with a short retry budget."""
    from gyre.real.proxy.config import RetryPolicy

    engines = [ScriptedEngine(model, long_script, engine_id=f"e{i}", token_delay=0.002) for i in range(2)]
    threads = [ServerThread(e.application).start() for e in engines]
    config = proxy_config(model, tmp_path / "records", {f"e{i}": t.url for i, t in enumerate(threads)},
                          retry=RetryPolicy(attempts=3, budget_s=10, backoff_s=0.01, read_timeout_s=1.0))
    proxy_thread, server = start_proxy(config)
    yield {"url": proxy_thread.url, "server": server, "engines": engines, "threads": threads,
           "records": tmp_path / "records"}
    for engine in engines:
        engine.release()
    proxy_thread.stop()
    for thread in threads:
        thread.stop()


def _client(pair, execution):
    return anthropic.Anthropic(base_url=pair["url"], api_key=new_key(pair["url"], execution), max_retries=0)


def _stream_text(client) -> tuple[str, object]:
    with client.messages.stream(model="m", max_tokens=400, messages=[{"role": "user", "content": "go"}]) as stream:
        text = "".join(stream.text_stream)
        return text, stream.get_final_message()


def _pin(pair, execution, engine):
    assert admin(pair["url"], "POST", "/admin/routes", {"execution_id": execution, "engine": engine})[0] == 200


def test_engine_dies_mid_stream_and_the_call_continues_elsewhere(pair, model):
    client = _client(pair, "fault-die")
    _pin(pair, "fault-die", "e0")
    pair["engines"][0].die_after = 7
    text, final = _stream_text(client)
    assert text == long_script("") and final.stop_reason == "end_turn"
    [record] = check_records(pair["records"], "fault-die", model)
    assert record.role_hints["engines"] == "e0,e1"
    assert pair["engines"][1].requests[-1]["input_ids"][-7:] == record.output_ids[:7].tolist()


def test_stalled_engine_times_out_and_the_call_continues_elsewhere(pair, model):
    client = _client(pair, "fault-stall")
    _pin(pair, "fault-stall", "e0")
    pair["engines"][0].hold_after = 5  # e0 stops sending after 5 tokens; the read timeout is 1 s
    text, _ = _stream_text(client)
    assert text == long_script("")
    [record] = check_records(pair["records"], "fault-stall", model)
    assert record.role_hints["engines"] == "e0,e1" and record.role_hints["moves"] == "0"


def test_refused_engine_is_skipped(pair, model):
    client = _client(pair, "fault-refused")
    _pin(pair, "fault-refused", "e0")
    pair["threads"][0].stop()
    text, _ = _stream_text(client)
    assert text == long_script("")
    [record] = check_records(pair["records"], "fault-refused", model)
    assert record.role_hints["engines"] == "e0,e1"
    assert admin(pair["url"], "GET", "/admin/routes")[1]["routes"]["fault-refused"] == "e1"


def test_drain_and_reroute_during_streaming(pair, model):
    client = _client(pair, "fault-reroute")
    _pin(pair, "fault-reroute", "e0")
    source, dest = pair["engines"]
    source.hold_after = 10
    result: dict = {}
    worker = threading.Thread(target=lambda: result.update(zip(("text", "final"), _stream_text(client))))
    worker.start()
    deadline = time.time() + 20
    while source.tokens_sent < 10 and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # the source holds: the harness's stream pauses from its 10th token to the move and beyond
    status, body = admin(pair["url"], "POST", "/admin/engines/e0/drain", {"evacuate": True, "to": "e1"})
    assert status == 200 and body["moved"] == {"fault-reroute": "e1"}
    worker.join(30)
    assert result["text"] == long_script("") and result["final"].stop_reason == "end_turn"
    [record] = check_records(pair["records"], "fault-reroute", model)
    assert record.role_hints["engines"] == "e0,e1" and record.role_hints["moves"] == "1"
    [stall_ms] = map(float, record.role_hints["move_stalls_ms"].split(","))
    assert 300 <= stall_ms < 20_000, stall_ms  # from the last token on e0 to the first from e1
    assert len(dest.requests) == 1 and dest.requests[0]["input_ids"][-10:] == record.output_ids[:10].tolist()
    deadline = time.time() + 5
    while not source.aborted and time.time() < deadline:
        time.sleep(0.01)
    assert source.aborted == [source.requests[0]["rid"]], "the source request was aborted"
    before = len(source.requests)
    _stream_text(client)  # the drained engine takes no new request
    assert len(source.requests) == before and len(dest.requests) == 2


def _raw_post(url, path, key, body):
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"x-api-key": key, "authorization": f"Bearer {key}",
                                              "content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_no_engine_left_gives_the_apis_overload_errors(pair):
    for engine in pair["engines"]:
        engine.fail_next = [503] * 20
    key = new_key(pair["url"], "fault-overload")
    status, body = _raw_post(pair["url"], "/v1/messages", key,
                             {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})
    assert status == 529 and json.loads(body)["error"]["type"] == "overloaded_error"
    status, body = _raw_post(pair["url"], "/v1/chat/completions", key,
                             {"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert status == 503 and json.loads(body)["error"]["code"] == "server_is_overloaded"
    assert pair["server"].recorder.state("fault-overload").requests == 0


def test_outage_after_stream_start_ends_with_an_error_event(pair):
    for engine in pair["engines"]:
        engine.die_after = 3
    key = new_key(pair["url"], "fault-midstream")
    status, body = _raw_post(pair["url"], "/v1/messages", key, {"model": "m", "max_tokens": 400, "stream": True,
                                                                "messages": [{"role": "user", "content": "x"}]})
    events = [line[7:] for line in body.splitlines() if line.startswith("event: ")]
    assert status == 200 and events[0] == "message_start" and events[-1] == "error"
    assert "overloaded_error" in body.splitlines()[-1] + body.splitlines()[-2]
    assert "message_stop" not in events
    assert pair["server"].recorder.state("fault-midstream").requests == 0


def _start_proxy_process(config_path: Path) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    process = subprocess.Popen([sys.executable, "-m", "gyre.real.proxy.cli", "--config", str(config_path),
                                "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = process.stdout.readline()
    assert line, process.stderr.read()
    return process, json.loads(line)["url"]


def test_proxy_killed_and_restarted_keeps_records(model, tmp_path):
    engine = ScriptedEngine(model, tool_loop_script(command="pwd"))
    with ServerThread(engine.application) as engine_thread:
        config = {"model_path": str(model), "records_dir": str(tmp_path / "records"),
                  "admin_token": "admin-secret-token", "engines": [{"id": "e0", "url": engine_thread.url}],
                  "fsync": True}
        path = tmp_path / "proxy.json"
        path.write_text(json.dumps(config))
        process, url = _start_proxy_process(path)
        try:
            key = new_key(url, "restart")
            client = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)
            tools = [{"name": "Bash", "description": "", "input_schema": {"type": "object"}}]
            first = client.messages.create(model="m", max_tokens=200, tools=tools,
                                           messages=[{"role": "user", "content": "where?"}])
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait(10)
        records = check_records(tmp_path / "records", "restart", model)
        assert len(records) == 1
        process, url = _start_proxy_process(path)
        try:
            client = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)  # the key survived
            call = next(b for b in first.content if b.type == "tool_use")
            second = client.messages.create(model="m", max_tokens=200, tools=tools, messages=[
                {"role": "user", "content": "where?"}, {"role": "assistant", "content": first.content},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "/w"}]}])
            assert second.content[0].text == "All done. Output: /w"
            stats = admin(url, "GET", "/admin/executions/restart/stats")[1]
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(10)
        records = check_records(tmp_path / "records", "restart", model)
        assert len(records) == 2 and stats["leaves"] == 1 and stats["requests"] == 2
        assert int(records[1].role_hints["reused_ids"]) == len(records[0].sequence)


# ---- holding calls while no engine can take them (RetryPolicy.hold_s) -------------------------------------------
@pytest.fixture
def held(model, tmp_path):
    """Two scripted engines behind a proxy that holds calls up to 20 s (a training job's setting)."""
    from gyre.real.proxy.config import RetryPolicy

    engines = [ScriptedEngine(model, long_script, engine_id=f"e{i}", token_delay=0.002) for i in range(2)]
    threads = [ServerThread(e.application).start() for e in engines]
    config = proxy_config(model, tmp_path / "records", {f"e{i}": t.url for i, t in enumerate(threads)},
                          retry=RetryPolicy(attempts=3, budget_s=10, backoff_s=0.01, read_timeout_s=1.0,
                                            hold_s=20.0, hold_poll_s=0.1))
    proxy_thread, server = start_proxy(config)
    yield {"url": proxy_thread.url, "server": server, "engines": engines, "records": tmp_path / "records"}
    proxy_thread.stop()
    for thread in threads:
        thread.stop()


def _in_background(call):
    box = {}
    thread = threading.Thread(target=lambda: box.update(result=call()), daemon=True)
    thread.start()
    return thread, box


def test_a_call_with_every_engine_drained_is_held_until_one_is_back(held, model):
    """Every engine in training (drained): the call waits, and is served once an engine returns to rollout."""
    for name in ("e0", "e1"):
        assert admin(held["url"], "POST", f"/admin/engines/{name}/drain", {"evacuate": False})[0] == 200
    key = new_key(held["url"], "held-drained")
    body = {"model": "m", "max_tokens": 400, "messages": [{"role": "user", "content": "go"}]}
    thread, box = _in_background(lambda: _raw_post(held["url"], "/v1/messages", key, body))
    time.sleep(1.0)
    assert thread.is_alive(), box  # held, not answered with the overload error
    assert admin(held["url"], "POST", "/admin/engines/e1/undrain")[0] == 200
    thread.join(30)
    status, text = box["result"]
    assert status == 200 and json.loads(text)["content"][0]["text"] == long_script("go")
    (record,) = check_records(held["records"], "held-drained", model)
    assert float(record.role_hints["held_ms"]) >= 900 and record.role_hints["engines"] == "e1"


def test_a_held_engine_takes_routes_and_its_calls_wait_for_its_release(held, model):
    """The job's engine watch holds a restarting engine: the core's new executions are still routed to it
    (a drained engine would refuse them, and the run would stop), and with the other engine drained (in
    training) their calls wait and are served by it once it is released."""
    url = held["url"]
    assert admin(url, "POST", "/admin/engines/e0/hold")[0] == 200
    assert admin(url, "POST", "/admin/engines/e1/drain", {"evacuate": False})[0] == 200
    status, started = admin(url, "POST", "/admin/executions/start",
                            {"executions": [{"execution_id": "held-route", "engine": "e0"}]})
    assert status == 200 and started["routes"] == {"held-route": "e0"}, started
    body = {"model": "m", "max_tokens": 400, "messages": [{"role": "user", "content": "go"}]}
    thread, box = _in_background(lambda: _raw_post(url, "/v1/messages", started["api_keys"]["held-route"], body))
    time.sleep(1.0)
    assert thread.is_alive(), box  # held, not served by the held engine nor answered with the overload error
    engines = {e["id"]: e for e in admin(url, "GET", "/admin/engines")[1]["engines"]}
    assert engines["e0"]["held"] and not engines["e0"]["draining"] and engines["e0"]["in_flight"] == 0
    assert admin(url, "POST", "/admin/engines/e0/release")[0] == 200
    thread.join(30)
    status, text = box["result"]
    assert status == 200 and json.loads(text)["content"][0]["text"] == long_script("go")
    (record,) = check_records(held["records"], "held-route", model)
    assert record.role_hints["engines"] == "e0" and float(record.role_hints["held_ms"]) >= 900


def test_a_call_whose_engines_fail_is_held_until_one_answers(held, model):
    """Both engines refuse far more submissions than the retry budget (an engine restarting): held, then served
    as one call with one record; without the hold the same outage is the overload error."""
    for engine in held["engines"]:
        engine.fail_next = [503] * 12
    client = anthropic.Anthropic(base_url=held["url"], api_key=new_key(held["url"], "held-failing"), max_retries=0)
    text, message = _stream_text(client)
    assert text == long_script("go") and message.stop_reason == "end_turn"
    refused = 24 - sum(len(engine.fail_next) for engine in held["engines"])
    assert refused >= 12 > 3  # one engine's whole outage was sat out, four times the retry budget (attempts=3)
    (record,) = check_records(held["records"], "held-failing", model)
    assert float(record.role_hints["held_ms"]) > 0


def test_a_hold_that_runs_out_answers_with_the_overload_error(model, tmp_path):
    from gyre.real.proxy.config import RetryPolicy

    engine = ScriptedEngine(model, long_script, engine_id="e0")
    with ServerThread(engine.application) as thread:
        config = proxy_config(model, tmp_path / "records", {"e0": thread.url},
                              retry=RetryPolicy(attempts=2, budget_s=10, backoff_s=0.01, hold_s=0.6, hold_poll_s=0.1))
        proxy_thread, server = start_proxy(config)
        try:
            assert admin(proxy_thread.url, "POST", "/admin/engines/e0/drain", {"evacuate": False})[0] == 200
            key = new_key(proxy_thread.url, "held-out")
            started = time.monotonic()
            status, body = _raw_post(proxy_thread.url, "/v1/messages", key,
                                     {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})
            waited = time.monotonic() - started
        finally:
            proxy_thread.stop()
    assert status == 529 and json.loads(body)["error"]["type"] == "overloaded_error"
    assert "held" in json.loads(body)["error"]["message"] and waited >= 0.5
    assert server.recorder.state("held-out").requests == 0


@pytest.mark.parametrize("retry, problem", [({"hold_s": -1}, "hold_s"), ({"hold_poll_s": 0}, "hold_poll_s"),
                                            ({"hold_s": "long"}, "hold_s")])
def test_a_bad_hold_setting_is_named(retry, problem):
    from gyre.real.proxy.config import ProxyConfigError, config_from_mapping

    with pytest.raises(ProxyConfigError, match=problem):
        config_from_mapping({"model_path": "m", "records_dir": "r", "admin_token": "admin-secret-token",
                             "engines": [{"id": "e0", "url": "http://127.0.0.1:1"}], "retry": retry})
