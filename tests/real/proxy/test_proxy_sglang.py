"""The real-engine tier: the proxy in front of a real SGLang CPU engine.

SGLang runs from its own virtualenv (``tools/setup_sglang_cpu.sh`` builds
``.venv-sglang``; set ``GYRE_SGLANG_PYTHON`` to use another) with the CPU
import shims of ``tools/shims`` and serves a tiny random Qwen2 built here with
a locally trained tokenizer (``HF_HUB_OFFLINE=1``: nothing is downloaded). The
official SDKs talk to the proxy; every recorded output log-probability is
checked against a teacher-forced transformers forward pass of the same
weights, including a call rerouted mid-stream between two engine entries.
Skipped, with the reason, when the SGLang virtualenv is absent.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

try:
    from proxy_fixtures import (ServerThread, admin, build_tiny_qwen2, free_port, new_key, proxy_config,
                                shared_tiny_dir, start_proxy)
except ImportError:
    from .proxy_fixtures import (ServerThread, admin, build_tiny_qwen2, free_port, new_key, proxy_config,
                                 shared_tiny_dir, start_proxy)

ROOT = Path(__file__).resolve().parents[3]
SGLANG_PYTHON = Path(os.environ.get("GYRE_SGLANG_PYTHON", ROOT / ".venv-sglang" / "bin" / "python"))
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240),
              pytest.mark.skipif(not SGLANG_PYTHON.exists(),
                                 reason=f"SGLang CPU venv not found at {SGLANG_PYTHON} (run tools/setup_sglang_cpu.sh)")]
BASH = {"name": "Bash", "description": "Run a command", "input_schema": {"type": "object"}}


def _wait_healthy(url: str, process: subprocess.Popen, log: Path, timeout: float = 150) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"SGLang exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/health_generate", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"SGLang did not become healthy:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def sglang(tmp_path_factory):
    model = build_tiny_qwen2(shared_tiny_dir(tmp_path_factory, "tiny-qwen2"))
    port = free_port()
    log = tmp_path_factory.mktemp("sglang") / "server.log"
    env = dict(os.environ, SGLANG_USE_CPU_ENGINE="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT / "tools" / "shims"))
    args = [str(SGLANG_PYTHON), "-m", "sglang.launch_server", "--model-path", str(model), "--host", "127.0.0.1",
            "--port", str(port), "--device", "cpu", "--attention-backend", "torch_native", "--sampling-backend",
            "pytorch", "--grammar-backend", "none", "--disable-cuda-graph", "--dtype", "float32",
            "--mem-fraction-static", "0.05", "--max-total-tokens", "32768", "--skip-server-warmup"]
    with open(log, "w") as sink:
        process = subprocess.Popen(args, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, process, log)
        yield {"url": url, "model": model}
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def stack(sglang, tmp_path_factory):
    records = tmp_path_factory.mktemp("records")
    # two entries for the one engine: a reroute between them exercises abort + resubmission for real
    config = proxy_config(sglang["model"], records, {"e0": sglang["url"], "e1": sglang["url"]})
    thread, server = start_proxy(config)
    yield {"url": thread.url, "server": server, "model": sglang["model"]}
    thread.stop()


@pytest.fixture(scope="module")
def reference(sglang):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(sglang["model"], torch_dtype=torch.float32).eval()

    def logprobs(record) -> np.ndarray:
        ids = torch.tensor([record.sequence.tolist()])
        with torch.no_grad():
            logits = model(ids).logits[0, :-1].double().log_softmax(-1)
        n_in = len(record.input_ids)
        targets = ids[0, n_in:]
        return logits[n_in - 1:].gather(1, targets[:, None])[:, 0].numpy()

    return logprobs


def _check_tito(stack, execution, reference, calls):
    records = stack["server"].recorder.store.read(execution)
    assert len(records) == calls
    for record in records:
        assert len(record.output_ids) > 0
        np.testing.assert_allclose(record.output_logprobs, reference(record), atol=2e-4)
    return records


def test_anthropic_create_stream_tools_and_count_tokens(stack, reference):
    client = anthropic.Anthropic(base_url=stack["url"], api_key=new_key(stack["url"], "sg-anthropic"),
                                 max_retries=0)
    first = client.messages.create(model="m", max_tokens=12, system="You are terse.", tools=[BASH],
                                   messages=[{"role": "user", "content": "list the files"}])
    assert first.stop_reason in ("end_turn", "max_tokens", "tool_use") and first.usage.output_tokens > 0
    history = [{"role": "user", "content": "list the files"},
               {"role": "assistant", "content": [{"type": "text", "text": "Running."},
                                                 {"type": "tool_use", "id": "toolu_x", "name": "Bash",
                                                  "input": {"command": "ls"}}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "a.txt"}]}]
    with client.messages.stream(model="m", max_tokens=12, tools=[BASH], messages=history) as stream:
        for _ in stream:
            pass
        final = stream.get_final_message()
    assert final.usage.output_tokens > 0
    assert client.messages.count_tokens(model="m", messages=history, tools=[BASH]).input_tokens > 20
    _check_tito(stack, "sg-anthropic", reference, 2)


def test_openai_chat_and_responses(stack, reference):
    client = openai.OpenAI(base_url=stack["url"] + "/v1", api_key=new_key(stack["url"], "sg-openai"),
                           max_retries=0)
    tools = [{"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}}]
    created = client.chat.completions.create(model="m", max_tokens=10, tools=tools,
                                             messages=[{"role": "user", "content": "hi"}])
    assert created.usage.completion_tokens > 0
    chunks = list(client.chat.completions.create(model="m", max_tokens=10, stream=True,
                                                 stream_options={"include_usage": True},
                                                 messages=[{"role": "user", "content": "hi"}]))
    assert chunks[-1].usage.completion_tokens > 0
    history = [{"type": "message", "role": "user", "content": "go"},
               {"type": "function_call", "call_id": "call_1", "name": "Bash", "arguments": '{"command": "ls"}'},
               {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"}]
    with client.responses.stream(model="m", max_output_tokens=10, input=history, store=False,
                                 tools=[{"type": "function", "name": "Bash", "parameters": {"type": "object"}}]) as s:
        events = list(s)
    # a random model rarely stops within 10 tokens: then the API's own answer is response.incomplete
    assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete")
    assert events[-1].response.usage.output_tokens > 0
    _check_tito(stack, "sg-openai", reference, 3)


def _reroute_at_first_delta(url: str, execution: str, max_tokens: int):
    client = anthropic.Anthropic(base_url=url, api_key=new_key(url, execution), max_retries=0)
    assert admin(url, "POST", "/admin/routes", {"execution_id": execution, "engine": "e0"})[0] == 200
    moved = None
    with client.messages.stream(model="m", max_tokens=max_tokens,
                                messages=[{"role": "user", "content": "talk"}]) as stream:
        for event in stream:
            if moved is None and event.type == "content_block_delta":
                moved = admin(url, "POST", "/admin/routes", {"execution_id": execution, "engine": "e1"})[1]
        return moved, stream.get_final_message()


def test_reroute_mid_stream_on_a_real_engine(stack, reference):
    """The tiny model is fast and may stop early (random weights): retry with longer answers
    until the reroute lands while tokens are still being generated."""
    for attempt, max_tokens in enumerate((200, 800, 2000)):
        execution = f"sg-reroute-{attempt}"
        moved, final = _reroute_at_first_delta(stack["url"], execution, max_tokens)
        if moved is not None and moved["moved_in_flight"] == 1:
            break
    else:
        pytest.fail("the engine finished every answer before the reroute landed")
    [record] = _check_tito(stack, execution, reference, 1)
    assert record.role_hints["engines"] == "e0,e1" and record.role_hints["moves"] == "1"
    assert final.usage.output_tokens == len(record.output_ids)
