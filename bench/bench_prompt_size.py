"""What refusing a too-long prompt from its size saves (``proxy.prompt_size``).

Two parts, both on the tiny locally trained byte-level tokenizer (longest vocabulary entry:
26 bytes, an added token):

- in process, per prompt size (``GYRE_BENCH_PROMPT_MB``, default 1,4,10 MB of plain words):
  CPU time of the bound (``PromptSize.at_least``: normalize, UTF-8 encode) against CPU time of
  tokenizing the same text (``ChatTokenizer.encode``), and their ratio;
- end to end, a proxy process (records fsynced, default context 262,144 tokens) and a scripted
  engine: the proxy's CPU time (``/proc/<pid>/stat``) and the wall time to the 400 for one call
  whose prompt the bound refuses (10 MB: >= 400k tokens by size) and one it cannot (4 MB: the
  bound says >= 160k, so it is tokenized, 2.4M tokens, then refused), each per MB of prompt.

The machine is shared while this runs: CPU time is the figure to compare; the load average is
printed with the results.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_proxy import ROOT, _cpu_seconds, _spawn, _start_proxy, _stop

WORDS = "read the file then run the tests and report what failed and why".split()


def _text(megabytes: float, seed: int = 0) -> str:
    rng = random.Random(seed)
    words = [rng.choice(WORDS) for _ in range(int(megabytes * 1e6 / 5))]
    return " ".join(words)[: int(megabytes * 1e6)]


def _in_process(chat, sizes: list[float]) -> dict:
    results = {}
    for megabytes in sizes:
        text = _text(megabytes)
        start = time.process_time()
        bound = chat.size.at_least(text)
        bound_s = time.process_time() - start
        start = time.process_time()
        tokens = len(chat.encode(text))
        encode_s = time.process_time() - start
        name = f"{megabytes:g}mb"
        results.update({f"bound_ms_{name}": bound_s * 1e3, f"encode_ms_{name}": encode_s * 1e3,
                        f"saved_ratio_{name}": encode_s / max(bound_s, 1e-6),
                        f"bound_tokens_{name}": bound, f"tokens_{name}": tokens})
    return results


async def _refusal(url: str, pid: int, megabytes: float) -> tuple[float, float, int]:
    """(proxy CPU s, wall s, status) of one Anthropic call with a prompt of ``megabytes``."""
    import aiohttp

    body = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": _text(megabytes, 1)}]}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        cpu, start = _cpu_seconds(pid), time.perf_counter()
        async with session.post(url + "/v1/messages", json=body, headers={"x-api-key": "bench-key-0"}) as response:
            await response.read()
            status = response.status
        return _cpu_seconds(pid) - cpu, time.perf_counter() - start, status


def _end_to_end(model: Path, scratch: Path) -> dict:
    engine, engine_url = _spawn([str(ROOT / "tests" / "real" / "proxy_fixtures.py"), "--model", str(model)])
    config = {"model_path": str(model), "fsync": True, "admin_token": "bench-admin-token",
              "engines": [{"id": "e0", "url": engine_url}], "executions": {"bench-key-0": "huge-0"}}
    results: dict = {}
    try:
        proxy, url = _start_proxy(scratch, config, "records")
        try:
            for label, megabytes in (("by_size", 10.0), ("tokenized", 4.0)):
                cpu, wall, status = asyncio.run(_refusal(url, proxy.pid, megabytes))
                results.update({f"refused_{label}_status": status,
                                f"refused_{label}_cpu_ms_per_mb": cpu * 1e3 / megabytes,
                                f"refused_{label}_wall_ms_per_mb": wall * 1e3 / megabytes})
        finally:
            _stop(proxy)
    finally:
        _stop(engine)
    return results


def main() -> dict:
    sys.path.insert(0, str(ROOT / "tests" / "real"))
    from proxy_fixtures import build_tiny_tokenizer

    from gyre.real.proxy.tokenize import ChatTokenizer

    sizes = [float(s) for s in os.environ.get("GYRE_BENCH_PROMPT_MB", "1,4,10").split(",") if s]
    results: dict = {"loadavg_before": open("/proc/loadavg").read().split()[0]}
    with tempfile.TemporaryDirectory() as scratch:
        model = build_tiny_tokenizer(Path(scratch) / "tiny")
        chat = ChatTokenizer(str(model))
        results["bytes_per_token"] = chat.size.bytes_per_token
        results.update(_in_process(chat, sizes))
        results.update(_end_to_end(model, Path(scratch)))
    results["loadavg_after"] = open("/proc/loadavg").read().split()[0]
    for name, value in results.items():
        print(f"   {name:36s} {value}", flush=True)
    return results


if __name__ == "__main__":
    main()
