"""Shared helpers for the proxy tests: a tiny model and tokenizer, and servers.

- the tiny tokenizer and Qwen2 builders come from ``gyre.real.toy.tiny_model``;
- ``ServerThread`` runs an aiohttp application on 127.0.0.1 in a background
  thread with its own event loop, so the synchronous SDK clients can call it;
- the scripted engine lives in ``proxy_scripted_engine``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
from pathlib import Path
from typing import Any, Iterator

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from gyre.real.runtime.ports import free_port  # noqa: F401  (re-exported for the tests)
from gyre.real.toy.tiny_model import (ADDED, CHAT_TEMPLATE, SPECIAL, build_tiny_qwen2,  # noqa: F401
                                   build_tiny_tokenizer)


def shared_tiny_dir(tmp_path_factory: Any, name: str = "tiny-model") -> Path:
    """One folder per test session for the tiny tokenizer/model (built once, reused)."""
    return Path(tmp_path_factory.getbasetemp()) / name


class ServerThread:
    """Run ``make_app()`` (an aiohttp Application factory) on 127.0.0.1 in a thread."""

    def __init__(self, make_app: Any, port: int | None = None, runner_args: dict | None = None,
                 on_setup: Any = None) -> None:
        self.make_app = make_app
        self.runner_args = runner_args or {}
        self.on_setup = on_setup  # called with the runner after its setup (``app.keep_half_open``)
        self.port = port or free_port()
        self.loop = asyncio.new_event_loop()
        self.app: Any = None
        self._runner: Any = None
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "ServerThread":
        self._thread.start()
        self.call(self._start())
        return self

    async def _start(self) -> None:
        from aiohttp import web

        self.app = self.make_app()
        if asyncio.iscoroutine(self.app):
            self.app = await self.app
        self._runner = web.AppRunner(self.app, access_log=None, **self.runner_args)
        await self._runner.setup()
        if self.on_setup is not None:
            self.on_setup(self._runner)
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    def call(self, coro: Any, timeout: float = 60) -> Any:
        """Run a coroutine on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        if self._runner is not None:
            self.call(self._runner.cleanup())
            self._runner = None
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- the scripted engine ---------------------------------------------------------


def token_logprob(token: int, position: int) -> float:
    """Deterministic behaviour log-probability of ``token`` at output ``position``.

    It depends only on (token, position), so a continuation resubmitted to
    another engine reports exactly what one uninterrupted engine would have.
    """
    return -(((token * 7919 + position * 104729) % 1000) / 500.0 + 0.01)


class ScriptedEngine:
    """An engine speaking SGLang's ``/generate`` streaming contract, driven by a script.

    ``script(prompt_text) -> output_text`` decides the answer from the prompt up to
    the last ``<|im_start|>assistant\\n``; input ids past that marker are tokens
    already generated (a resubmission after a reroute or failure), and the engine
    continues after them. Lists are cumulative, like SGLang's default, or hold only
    the new tokens with ``incremental=True`` (``--incremental-streaming-output``);
    ``cumulative_work=True`` with it builds each cumulative chunk and sends only the
    new tokens (an engine's work of cumulative mode without its bytes on the wire);
    chunks are compact JSON in SGLang's key order (``text``, ``output_ids``,
    ``meta_info``), a cumulative chunk built in time linear in its size. Faults:
    ``fail_next`` (HTTP statuses for the next submissions), ``garble_next`` (raw
    payloads, each the one event of the next streamed submission), ``die_after`` (close
    the connection after that many tokens of a submission), ``hold_after`` (stop
    after that many tokens until ``release()``).

    Like SGLang it rejects invalid sampling values and requests longer than
    ``context_length`` with an error chunk ``{"error": {..., "retryable": false}}``
    (HTTP 400 when not streaming), and honours ``stop`` strings (finish
    ``{"type": "stop", "matched": "<string>"}``, the stop text included in the
    output ids). A script may return token ids (a list) instead of text, to
    produce outputs no text encodes to (partial UTF-8, special tokens).
    """

    def __init__(self, model_dir: str | os.PathLike, script: Any, *, engine_id: str = "scripted",
                 token_delay: float = 0.0, chunk_tokens: int = 1, context_length: int = 1 << 20,
                 incremental: bool = False, cumulative_work: bool = False) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.script = script
        self.engine_id = engine_id
        self.token_delay = token_delay
        self.chunk_tokens = chunk_tokens
        self.context_length = context_length
        self.incremental = incremental
        self.cumulative_work = cumulative_work
        self.im_start = self.tokenizer.convert_tokens_to_ids("<|im_start|>")
        self.eos = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.marker = self.tokenizer.encode("assistant\n", add_special_tokens=False)
        self.requests: list[dict[str, Any]] = []
        self.aborted: list[str] = []
        self.fail_next: list[int] = []
        self.garble_next: list[bytes] = []
        self.die_after: int | None = None
        self.hold_after: int | None = None
        self.tokens_sent = 0
        self._release: asyncio.Event | None = None
        self._cache: dict[str, list[int]] = {}

    def plan(self, input_ids: list[int]) -> tuple[list[int], int]:
        """(full output ids the script wants, tokens of it already generated)."""
        starts = [i for i, t in enumerate(input_ids) if t == self.im_start]
        cut = len(input_ids)
        for start in reversed(starts):
            if input_ids[start + 1 : start + 1 + len(self.marker)] == self.marker:
                cut = start + 1 + len(self.marker)
                break
        prompt = self.tokenizer.decode(input_ids[:cut], skip_special_tokens=False)
        if prompt not in self._cache:
            text = self.script(prompt)
            ids = list(text) if isinstance(text, list) else self.tokenizer.encode(text, add_special_tokens=False)
            self._cache[prompt] = ids + [self.eos]
        target = self._cache[prompt]
        done = input_ids[cut:]
        if target[: len(done)] != done:
            raise ValueError("resubmitted tokens are not a prefix of the scripted answer")
        return target, len(done)

    def release(self) -> None:
        self.hold_after = None
        if self._release is not None:
            self._release.set()

    def application(self) -> Any:
        from aiohttp import web

        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.add_routes([web.post("/generate", self.generate), web.post("/abort_request", self.abort),
                        web.get("/health_generate", self.health), web.get("/health", self.health)])
        return app

    async def health(self, request: Any) -> Any:
        from aiohttp import web

        return web.Response(text="ok")

    async def abort(self, request: Any) -> Any:
        from aiohttp import web

        body = await request.json()
        self.aborted.append(str(body.get("rid", "")))
        return web.Response(status=200)

    def _chunk(self, rid: str, ids: list[int], start: int, n_prompt: int, finish: Any) -> bytes:
        return ChunkWriter(rid, start, n_prompt).chunk(ids, len(ids), finish)

    def invalid(self, body: dict) -> str | None:
        """SGLang's checks of a request (``SamplingParams.verify`` and the context length)."""
        params = body.get("sampling_params", {})
        if params.get("temperature", 1.0) < 0:
            return "temperature must be non-negative"
        if not 0 < params.get("top_p", 1.0) <= 1:
            return "top_p must be in (0, 1]"
        if params.get("top_k", -1) < 1 and params.get("top_k", -1) != -1:
            return "top_k must be -1 (disable), or at least 1"
        if len(body["input_ids"]) + params.get("max_new_tokens", 0) > self.context_length:
            return f"Requested token count exceeds the model's maximum context length of {self.context_length}"
        return None

    def _stop_at(self, out: list[int], stops: list[str], start: int) -> tuple[list[int], str | None]:
        """Cut ``out`` after the first token that completes a stop string (SGLang keeps its ids)."""
        for end in range(1, len(out) + 1):
            text = self.tokenizer.decode(out[:end], skip_special_tokens=True)
            for stop in stops:
                if stop in text:
                    return out[:end], stop
        return out, None

    async def generate(self, request: Any) -> Any:
        from aiohttp import web

        body = await request.json()
        self.requests.append(body)
        if self.fail_next:
            return web.json_response({"error": {"message": "scripted failure"}}, status=self.fail_next.pop(0))
        problem = self.invalid(body)
        if problem is not None:
            error = {"error": {"message": problem, "type": "invalid_request_error", "code": 400, "retryable": False}}
            if not body.get("stream"):
                return web.json_response(error, status=400)
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(b"data: " + json.dumps(error).encode() + b"\n\ndata: [DONE]\n\n")
            return response
        input_ids = list(body["input_ids"])
        target, start = self.plan(input_ids)
        budget = int(body.get("sampling_params", {}).get("max_new_tokens", 1 << 30))
        out = target[start : start + budget]
        finish = {"type": "stop", "matched": self.eos} if start + len(out) == len(target) \
            else {"type": "length", "length": len(out)}
        stops = body.get("sampling_params", {}).get("stop") or []
        if stops:
            out, matched = self._stop_at(out, stops, start)
            if matched is not None:
                finish = {"type": "stop", "matched": matched}
        rid = str(body.get("rid", ""))
        if not body.get("stream"):
            return web.Response(body=self._chunk(rid, out, start, len(input_ids), finish)[6:-2],
                                content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if self.garble_next:
            await response.write(b"data: " + self.garble_next.pop(0) + b"\n\ndata: [DONE]\n\n")
            return response
        await self._stream(request, response, rid, out, start, len(input_ids), finish)
        return response

    async def _stream(self, request: Any, response: Any, rid: str, out: list[int], start: int, n_prompt: int,
                      finish: Any) -> None:
        sent = 0
        writer = ChunkWriter(rid, start, n_prompt)
        while sent < len(out):
            if self.die_after is not None and sent >= self.die_after:
                request.transport.close()  # the engine "dies" mid-stream
                return
            if self.hold_after is not None and sent >= self.hold_after:
                self._release = self._release or asyncio.Event()
                await self._release.wait()
            if rid in self.aborted:
                return
            step = min(self.chunk_tokens, len(out) - sent)
            new = out[sent:sent + step]
            sent += step
            self.tokens_sent += step
            done = finish if sent == len(out) else None
            await response.write(self._event(writer, new, sent, done))
            if self.token_delay:
                await asyncio.sleep(self.token_delay)
        if not out:
            await response.write(writer.chunk([], 0, finish))
        await response.write(b"data: [DONE]\n\n")

    def _event(self, writer: ChunkWriter, new: list[int], sent: int, done: Any) -> bytes:
        if not self.incremental:
            return writer.chunk(new, sent, done)
        return writer.delta_after_chunk(new, sent, done) if self.cumulative_work else writer.delta(new, sent, done)


class ChunkWriter:
    """SSE chunks of one submission as SGLang writes them (orjson: compact, its key order).

    ``chunk`` appends the new tokens to the cumulative lists kept as JSON text, so a
    cumulative chunk costs time linear in its size (the engine's own cost stays
    out of a proxy benchmark); ``delta`` writes only the new tokens."""

    def __init__(self, rid: str, start: int, n_prompt: int) -> None:
        self.rid, self.start, self.n_prompt = rid, start, n_prompt
        self.ids_text = bytearray()
        self.logprobs_text = bytearray()
        self.count = 0

    def _texts(self, new: list[int]) -> tuple[bytes, bytes]:
        ids = ",".join(str(t) for t in new).encode()
        logprobs = ",".join(f"[{token_logprob(t, self.start + self.count + k)!r},{t},null]"
                            for k, t in enumerate(new)).encode()
        self.count += len(new)
        return ids, logprobs

    def chunk(self, new: list[int], total: int, finish: Any) -> bytes:
        ids, logprobs = self._texts(new)
        for text, piece in ((self.ids_text, ids), (self.logprobs_text, logprobs)):
            if text and piece:
                text += b","
            text += piece
        return self._event(bytes(self.ids_text), bytes(self.logprobs_text), total, finish)

    def delta(self, new: list[int], total: int, finish: Any) -> bytes:
        return self._event(*self._texts(new), total, finish)

    def delta_after_chunk(self, new: list[int], total: int, finish: Any) -> bytes:
        """``delta``'s event, built after ``chunk``'s (which is dropped): the work of a cumulative
        engine, the bytes of an incremental one."""
        ids_at, logprobs_at = len(self.ids_text), len(self.logprobs_text)
        self.chunk(new, total, finish)
        ids, logprobs = self.ids_text[ids_at:], self.logprobs_text[logprobs_at:]
        return self._event(bytes(ids.removeprefix(b",")), bytes(logprobs.removeprefix(b",")), total, finish)

    def _event(self, ids: bytes, logprobs: bytes, total: int, finish: Any) -> bytes:
        head = json.dumps({"id": self.rid, "finish_reason": finish, "prompt_tokens": self.n_prompt,
                           "weight_version": "default", "completion_tokens": total},
                          separators=(",", ":")).encode()
        return (b'data: {"text":"","output_ids":[' + ids + b'],"meta_info":' + head[:-1]
                + b',"output_token_logprobs":[' + logprobs + b"]}}\n\n")


# -- scripts ----------------------------------------------------------------------


def last_block(prompt: str, role: str) -> str:
    """Content of the last ``<|im_start|>{role}`` turn of a rendered prompt."""
    head = f"<|im_start|>{role}\n"
    index = prompt.rfind(head)
    if index < 0:
        return ""
    return prompt[index + len(head):].split("<|im_end|>", 1)[0]


def echo_script(prompt: str) -> str:
    """Answer ``echo: <last user text>`` (tool results count as user text)."""
    return "echo: " + last_block(prompt, "user").strip()[:200]


def tool_loop_script(command: str = "echo hello", tool: str = "Bash", final: str = "All done.",
                     arguments: dict | None = None, commands: list | None = None) -> Any:
    """Call ``tool`` once per entry of ``commands`` (default: once, with ``command``), one
    call per turn, then answer ``final`` plus the last tool output.

    The turn is the number of ``<tool_response>`` blocks already in the prompt. An
    entry of ``commands`` is either a command string (sent as ``{"command": ...}``) or
    a full arguments dict.
    """
    from gyre.real.proxy.toolcalls import format_tool_call

    steps = list(commands) if commands is not None else [arguments or {"command": command}]

    def script(prompt: str) -> str:
        turn = prompt.count("<tool_response>")
        if turn < len(steps):
            step = steps[turn]
            return f"Step {turn + 1}.\n" + format_tool_call(tool, step if isinstance(step, dict) else {"command": step})
        last = last_block(prompt, "user")
        result = last.split("<tool_response>")[-1].split("</tool_response>", 1)[0].strip()
        return f"{final} Output: {result[:80]}"

    return script


# -- a proxy in front of engines ---------------------------------------------------


def proxy_config(model_dir: Any, records_dir: Any, engines: dict[str, str], **overrides: Any) -> Any:
    from gyre.real.proxy.config import EngineSpec, ProxyConfig

    values = dict(model_path=str(model_dir), records_dir=str(records_dir), admin_token="admin-secret-token",
                  engines=tuple(EngineSpec(id=i, url=u) for i, u in engines.items()),
                  executions={"key-a": "exec-a", "key-b": "exec-b"}, fsync=False)
    values.update(overrides)
    return ProxyConfig(**values)


def start_proxy(config: Any, chat: Any = None) -> tuple[ServerThread, Any]:
    """Start a ``ProxyServer`` in a thread; returns (thread, server)."""
    from gyre.real.proxy.app import RUNNER_ARGS, ProxyServer, keep_half_open

    holder: dict[str, Any] = {}

    def make_app() -> Any:
        holder["server"] = ProxyServer(config, chat=chat)
        return holder["server"].application()

    thread = ServerThread(make_app, runner_args=RUNNER_ARGS, on_setup=keep_half_open).start()
    return thread, holder["server"]


@contextlib.contextmanager
def scripted_proxy_stack(model_dir: Any, script: Any, records_dir: Any, engine_options: dict | None = None,
                         **overrides: Any) -> Iterator[dict[str, Any]]:
    """One ``ScriptedEngine`` answering ``script`` (``engine_options``: its keyword arguments) and a proxy in
    front of it (``start_proxy``; ``overrides``: ``proxy_config``'s), both in threads of this process;
    yields ``{"url", "port", "server", "engine", "model", "records"}``, then stops the proxy and the engine."""
    engine = ScriptedEngine(model_dir, script, **(engine_options or {}))
    engine_thread = ServerThread(engine.application).start()
    try:
        proxy_thread, server = start_proxy(proxy_config(model_dir, records_dir, {"e0": engine_thread.url}, **overrides))
        try:
            yield {"url": proxy_thread.url, "port": proxy_thread.port, "server": server, "engine": engine,
                   "model": model_dir, "records": records_dir}
        finally:
            proxy_thread.stop()
    finally:
        engine_thread.stop()


# -- test-side checks --------------------------------------------------------------


def admin(url: str, method: str, path: str, body: Any = None, token: str = "admin-secret-token") -> Any:
    """Call the proxy's admin API synchronously; returns (status, json)."""
    import urllib.error
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method=method,
                                     headers={"authorization": f"Bearer {token}", "content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def new_key(url: str, execution_id: str) -> str:
    status, body = admin(url, "POST", "/admin/executions", {"execution_id": execution_id})
    assert status == 200, body
    return body["api_key"]


def check_records(records_dir: Any, execution_id: str, model_dir: Any) -> list[Any]:
    """Read an execution's log from disk and check it against the scripted engine's contract.

    Every output ends with ``<|im_end|>`` and carries ``token_logprob`` values
    (so reroutes and retries left no gap and no duplicate), request ids are
    unique, and the tree rebuilt from disk reproduces every request exactly.
    """
    import numpy as np
    from transformers import AutoTokenizer

    from gyre.real.store.tito_log import ExecutionStore
    from gyre.trajectory.tree import TrajectoryTree

    records = ExecutionStore(records_dir).read(execution_id)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert len({r.request_id for r in records}) == len(records)
    for record in records:
        out = record.output_ids.tolist()
        assert out and out[-1] == eos, "every scripted answer ends with <|im_end|>"
        expected = [token_logprob(t, k) for k, t in enumerate(out)]
        np.testing.assert_allclose(record.output_logprobs, expected, rtol=0, atol=1e-12)
    tree = TrajectoryTree.from_records(records)
    for index, record in enumerate(records):
        assert np.array_equal(tree.request_sequence(index), record.sequence)
    return records


# -- load driving ----------------------------------------------------------------------


def parse_sse(body: bytes) -> list[tuple[str, dict]]:
    """(event name, data) pairs of an Anthropic SSE body."""
    events = []
    for block in body.decode().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "data" in lines:
            events.append((lines.get("event", ""), json.loads(lines["data"])))
    return events


async def anthropic_turn(session: Any, url: str, key: str, messages: list, tools: list) -> tuple[str, list, float]:
    """One streaming Messages call: (text, tool_use blocks, seconds to the last byte)."""
    import time

    body = {"model": "m", "max_tokens": 256, "stream": True, "messages": messages, "tools": tools}
    start = time.perf_counter()
    async with session.post(url + "/v1/messages", json=body, headers={"x-api-key": key}) as response:
        raw = await response.read()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {raw[:300]!r}")
    elapsed = time.perf_counter() - start
    events = parse_sse(raw)
    if events[-1][0] != "message_stop":
        raise RuntimeError(f"stream did not end with message_stop: {events[-1]}")
    text = "".join(d["delta"].get("text", "") for e, d in events if e == "content_block_delta")
    calls = [d["content_block"] for e, d in events
             if e == "content_block_start" and d["content_block"]["type"] == "tool_use"]
    return text, calls, elapsed


async def tool_loop_execution(session: Any, url: str, key: str) -> list[float]:
    """Two calls of one execution: the tool call, then the answer after the tool result."""
    tools = [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}]
    messages = [{"role": "user", "content": "run the command"}]
    text, calls, first = await anthropic_turn(session, url, key, messages, tools)
    if len(calls) != 1:
        raise RuntimeError(f"expected one tool call, got {calls}")
    content = [{"type": "text", "text": text}, {**calls[0], "input": {"command": "echo hello"}}]
    messages += [{"role": "assistant", "content": content},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0]["id"],
                                               "content": "hello"}]}]
    text, calls, second = await anthropic_turn(session, url, key, messages, tools)
    if calls or not text.startswith("All done."):
        raise RuntimeError(f"unexpected final answer {text!r}")
    return [first, second]


def start_proxy_process(config: dict, path: Path, extra_env: dict | None = None) -> tuple[Any, str]:
    """Run ``python -m gyre.real.proxy.cli`` on ``config``; returns (process, url)."""
    import subprocess
    import sys

    path.write_text(json.dumps(config))
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", **(extra_env or {}))
    process = subprocess.Popen([sys.executable, "-m", "gyre.real.proxy.cli", "--config", str(path), "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = process.stdout.readline()
    if not line:
        raise RuntimeError(f"proxy did not start: {process.stderr.read()}")
    return process, json.loads(line)["url"]


@contextlib.contextmanager
def scripted_proxy_process(model: Path, script: Any, scratch: Path, executions: dict[str, str],
                           admin_token: str = "harness-admin-token") -> Any:
    """A ``gyre proxy`` process (records under ``scratch/records``, no fsync, ``executions``: key -> id) in
    front of one scripted engine answering ``script``; yields (url, records folder), then stops both."""
    import signal

    engine = ServerThread(ScriptedEngine(model, script).application).start()
    config = {"model_path": str(model), "records_dir": str(scratch / "records"), "admin_token": admin_token,
              "engines": [{"id": "e0", "url": engine.url}], "fsync": False, "executions": executions}
    try:
        process, url = start_proxy_process(config, scratch / "proxy.json")
    except BaseException:
        engine.stop()
        raise
    try:
        yield url, scratch / "records"
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(20)
        engine.stop()


# -- a standalone scripted engine process (benchmarks, harness tests) --------------------

def long_script(words: int = 20000) -> Any:
    """An answer of ``words`` plain words (a long agent turn; cut by the caller's ``max_tokens``)."""
    text = " ".join(("read", "the", "file", "then", "run", "tests")[i % 6] for i in range(words))
    return lambda prompt: text


SCRIPTS = {"echo": lambda **kw: echo_script, "tool_loop": tool_loop_script,
           "short": lambda **kw: (lambda prompt: "ok, done"), "long": long_script}


def serve_scripted_engine(model_dir: str, script: str, port: int = 0, token_delay: float = 0.0,
                          options: dict | None = None, incremental: bool = False,
                          cumulative_work: bool = False) -> None:
    """Run a ScriptedEngine in the foreground; prints ``{"url": ...}`` once listening."""
    from aiohttp import web

    async def serve() -> None:
        engine = ScriptedEngine(model_dir, SCRIPTS[script](**(options or {})), token_delay=token_delay,
                                incremental=incremental, cumulative_work=cumulative_work)
        runner = web.AppRunner(engine.application(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port)
        await site.start()
        print(json.dumps({"url": f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"}), flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="run a scripted SGLang-contract engine")
    parser.add_argument("--model", required=True)
    parser.add_argument("--script", default="short", choices=sorted(SCRIPTS))
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token-delay", type=float, default=0.0)
    parser.add_argument("--options", default="{}", help="JSON keyword arguments of the script factory")
    parser.add_argument("--incremental", action="store_true", help="stream only the new tokens per chunk")
    parser.add_argument("--cumulative-work", action="store_true",
                        help="with --incremental: build each cumulative chunk too, and drop it")
    options = parser.parse_args()
    serve_scripted_engine(options.model, options.script, options.port, options.token_delay,
                          json.loads(options.options), options.incremental, options.cumulative_work)
