"""Refused bodies free their memory at once: repeated gzip bombs leave the proxy's RSS bounded.

Five requests whose ~200 KB gzip body inflates to 200 MB (past the 32 MB body limit) took a
proxy from 405 MB to 1.3 GB, kept after 200 ordinary calls (issue 32). The proxy now inflates
a body itself, in one step bounded by the limit (``app._inflate``), so each bomb is refused
with 413 after at most the limit's worth of output, which is freed with the refusal. Run
against a ``gyre proxy`` process (its tuned collector included), RSS read from /proc.
"""

from __future__ import annotations

import http.client
import json
import zlib

import pytest

try:
    from proxy_fixtures import ScriptedEngine, ServerThread, build_tiny_tokenizer, shared_tiny_dir, start_proxy_process
except ImportError:
    from .proxy_fixtures import (ScriptedEngine, ServerThread, build_tiny_tokenizer, shared_tiny_dir,  # noqa: F401
                                 start_proxy_process)

pytestmark = pytest.mark.timeout(120)
INFLATED = 200 * 1024 * 1024
RSS_GROWTH_BOUND = 96 * 1024 * 1024  # what five bombs may leave: well under one 200 MB inflation


def gzip_bomb() -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    return b"".join([*(packer.compress(zeros) for _ in range(INFLATED >> 20)), packer.flush()])


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def post(port: int, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/messages", body=body, headers={"x-api-key": "key-a",
                                                              "Content-Type": "application/json", **headers})
    response = conn.getresponse()
    payload = response.read()
    conn.close()
    return response.status, payload


def test_refused_gzip_bombs_leave_the_rss_bounded(tmp_path_factory, tmp_path):
    model = build_tiny_tokenizer(shared_tiny_dir(tmp_path_factory))
    with ServerThread(ScriptedEngine(model, lambda prompt: "Hello.").application) as engine:
        config = {"model_path": str(model), "records_dir": str(tmp_path / "records"), "fsync": False,
                  "admin_token": "admin-secret-token", "engines": [{"id": "e0", "url": engine.url}],
                  "executions": {"key-a": "exec-a"}}
        process, url = start_proxy_process(config, tmp_path / "proxy.json")
        try:
            port = int(url.rsplit(":", 1)[1])
            ordinary = json.dumps({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
            assert post(port, ordinary.encode(), {})[0] == 200
            before = rss(process.pid)
            bomb = gzip_bomb()
            assert len(bomb) < 400_000
            for _ in range(5):
                status, payload = post(port, bomb, {"Content-Encoding": "gzip"})
                assert status == 413 and json.loads(payload)["error"]["type"] == "request_too_large", payload
            after = rss(process.pid)
            assert after - before < RSS_GROWTH_BOUND, (before >> 20, after >> 20)
            assert post(port, ordinary.encode(), {})[0] == 200
            print(f"proxy RSS {before >> 20} MB before five 200 MB bombs, {after >> 20} MB after")
        finally:
            process.terminate()
            process.wait(20)
