"""Group commit loses nothing acknowledged: a proxy killed with SIGKILL under load.

A real proxy process (``python -m gyre.real.proxy.cli``, records fsynced, so
committed in groups by ``group_commit.GroupCommit``) serves a scripted engine
process (echo script, a small per-token delay so calls are in flight). Client
executions send a generated mix of calls (seeded: Anthropic or OpenAI Chat,
streaming or not, multi-turn histories of random words) back to back; once
enough calls were acknowledged the proxy is killed with SIGKILL mid-load.

Then every call a client got a complete 200 for (a non-streaming body, or a
stream that reached its final event) must be in the store under its request
id and execution, its output must decode to the text the client received,
and the whole log must replay exactly (tree sequences, logprobs as sampled).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

try:
    from proxy_fixtures import build_tiny_tokenizer, parse_sse, shared_tiny_dir, start_proxy_process, token_logprob
except ImportError:
    from .proxy_fixtures import build_tiny_tokenizer, parse_sse, shared_tiny_dir, start_proxy_process, token_logprob

FIXTURES = Path(__file__).resolve().parents[1] / "proxy_fixtures.py"
WORDS = "alpha beta gamma delta tests files build error fixed run read write patch".split()


def spawn_engine(model: Path, token_delay: float) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([sys.executable, str(FIXTURES), "--model", str(model), "--script", "echo",
                                "--token-delay", str(token_delay)], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    line = process.stdout.readline()
    if not line:
        raise RuntimeError("scripted engine did not start")
    return process, json.loads(line)["url"]


async def one_call(session, url: str, key: str, api: str, stream: bool, messages: list) -> tuple[str, str] | None:
    """(request id, text) of a call the client saw complete, None for anything else."""
    if api == "anthropic":
        path, body = "/v1/messages", {"model": "m", "max_tokens": 64, "stream": stream, "messages": messages}
    else:
        path, body = "/v1/chat/completions", {"model": "m", "max_tokens": 64, "stream": stream, "messages": messages}
    async with session.post(url + path, json=body, headers={"x-api-key": key}) as response:
        raw = await response.read()
        if response.status != 200:
            return None
    if api == "anthropic" and not stream:
        data = json.loads(raw)
        return data["id"].removeprefix("msg_"), "".join(b.get("text", "") for b in data["content"])
    if api == "anthropic":
        events = parse_sse(raw)
        if not events or events[-1][0] != "message_stop":
            return None
        text = "".join(d["delta"].get("text", "") for e, d in events if e == "content_block_delta")
        return events[0][1]["message"]["id"].removeprefix("msg_"), text
    if not stream:
        data = json.loads(raw)
        return data["id"].removeprefix("chatcmpl-"), data["choices"][0]["message"]["content"] or ""
    lines = [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]
    if not lines or lines[-1] != "[DONE]":
        return None
    chunks = [json.loads(line) for line in lines[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
    return chunks[0]["id"].removeprefix("chatcmpl-"), text


async def drive(url: str, keys: dict[str, str], rng: np.random.Generator, pid: int, kill_after: int,
                commits: dict) -> list:
    """Run the executions until the proxy dies; SIGKILL it once ``kill_after`` calls were acknowledged
    (``commits``: the proxy's commit counters just before)."""
    import aiohttp

    acked: list[tuple[str, str, str]] = []  # (execution, request id, text)
    plans = {key: (str(rng.choice(["anthropic", "chat"])), int(rng.integers(0, 1 << 31))) for key in keys}
    killed, claimed = asyncio.Event(), asyncio.Event()

    async def execution(session, key: str) -> None:
        api, seed = plans[key]
        local = np.random.default_rng(seed)
        messages: list = []
        while not killed.is_set():
            words = " ".join(local.choice(WORDS, size=int(local.integers(1, 12))))
            messages.append({"role": "user", "content": words})
            try:
                got = await one_call(session, url, key, api, bool(local.integers(0, 2)), messages)
            except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError):
                return
            if got is None:
                return
            acked.append((keys[key], *got))
            messages.append({"role": "assistant", "content": got[1]})
            if len(messages) > 16:
                messages = []
            if len(acked) >= kill_after and not claimed.is_set():
                claimed.set()  # before the await below: exactly one execution does the kill
                async with session.get(url + "/") as alive:  # how the proxy committed so far
                    commits.update((await alive.json())["commits"])
                os.kill(pid, signal.SIGKILL)
                killed.set()

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        await asyncio.gather(*(execution(session, key) for key in keys))
    assert killed.is_set(), "the load ended before the proxy was killed"
    return acked


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("seed,executions", [(0, 24), (1, 24), (2, 1)])
def test_kill_9_under_load_loses_no_acknowledged_call(tmp_path_factory, tmp_path, seed, executions):
    """24 executions: records are committed in groups by the writer thread; 1 execution: each record
    is waited for on the event loop's thread (``Recorder.commit(alone=True)``)."""
    from gyre.real.proxy.tokenize import ChatTokenizer
    from gyre.real.store.tito_log import ExecutionStore
    from gyre.trajectory.tree import TrajectoryTree

    rng = np.random.default_rng(seed)
    model = build_tiny_tokenizer(shared_tiny_dir(tmp_path_factory))
    keys = {f"durable-key-{i}": f"durable-{i:02d}" for i in range(executions)}
    engine, engine_url = spawn_engine(model, token_delay=0.001)
    config = {"model_path": str(model), "records_dir": str(tmp_path / "records"), "fsync": True,
              "admin_token": "admin-secret-token", "engines": [{"id": "e0", "url": engine_url}],
              "executions": keys}
    proxy, url = start_proxy_process(config, tmp_path / "proxy.json")
    try:
        commits: dict = {}
        acked = asyncio.run(drive(url, keys, rng, proxy.pid, kill_after=int(rng.integers(60, 160)), commits=commits))
    finally:
        for process in (proxy, engine):
            process.kill()
            process.wait(20)
    assert proxy.returncode == -signal.SIGKILL
    assert len(acked) >= 60
    # which path each commit took is structural; how many lone waits landed within ALONE_WAIT_S depends on
    # the machine's load, so "here" is only required to happen
    if executions == 1:  # every call alone: first waited for on the loop's thread
        assert commits["alone"] >= 0.9 * commits["records"] and commits["here"] > 0, commits
    else:  # concurrent calls: queued for the writer
        assert commits["alone"] <= 0.5 * commits["records"] and commits["batches"] > 0, commits
    chat = ChatTokenizer(str(model))
    store = ExecutionStore(tmp_path / "records")
    by_execution: dict[str, dict] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a torn tail (an unacknowledged frame) is allowed
        for execution in store.executions():
            by_execution[execution] = {r.request_id: r for r in store.read(execution)}
    for execution, request_id, text in acked:
        record = by_execution.get(execution, {}).get(request_id)
        assert record is not None, f"acknowledged call {request_id} of {execution} is not in the store"
        out = record.output_ids.tolist()
        assert chat.decode(out, skip_special=True) == text
        np.testing.assert_allclose(record.output_logprobs, [token_logprob(t, k) for k, t in enumerate(out)],
                                   rtol=0, atol=1e-12)
    for records in by_execution.values():
        ordered = list(records.values())
        tree = TrajectoryTree.from_records(ordered)
        for index, record in enumerate(ordered):
            assert np.array_equal(tree.request_sequence(index), record.sequence)
