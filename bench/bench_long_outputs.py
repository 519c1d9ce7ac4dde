"""Proxy CPU per output token of one long streamed answer, and a bystander's delay meanwhile.

Three processes: a scripted engine speaking SGLang's ``/generate`` contract
(``tests/real/proxy_fixtures.py``, script ``long``: plain words, cut at the
caller's ``max_tokens``), the proxy (``python -m gyre.real.proxy.cli``, records
fsynced) and this client. For each engine mode, ``incremental`` (each chunk
holds only the new tokens: ``--incremental-streaming-output``, what engines
Gyre starts use) and ``cumulative`` (SGLang's default: each chunk repeats
every output id and log-probability so far), one streamed Anthropic call per
length in ``GYRE_BENCH_STREAM_TOKENS`` (default 1000,4000,16000 tokens), one
token per chunk every millisecond (``--token-delay``: paced like a fast
engine, so each token is a chunk the proxy handles on its own), and the
proxy process's CPU time for it (its threads' run time, ``/proc/<pid>/task/*/schedstat``;
``cpu_us_ticks_per_token_*``: the same from ``/proc/<pid>/stat``, in 10 ms ticks)
divided by the tokens answered (``cpu_us_system_per_token_*``: the part spent in the kernel, where
receiving the engine's bytes and writing the client's are counted). Linear-time
handling shows as a flat figure across lengths; a parse of every whole chunk
grows with the length. ``reads_per_token_*`` and ``bytes_per_read_*`` count the
proxy's ``read`` system calls (``/proc/<pid>/io``): a receive path whose reads
per token grew with the chunk (a buffer smaller than the chunk) would show there.

In cumulative mode the engine sends a number of bytes quadratic in the
length (the 16k-token answer's last chunk alone is ~0.5 MB, the answer ~3 GB):
the kernel's copy of them into the receiver is work no receiver can skip, so
that mode's figure keeps a term growing with the length even when only each
chunk's new suffix is parsed. That term is measured apart as the floor
(``receive_floor_us_per_token_*``): the CPU time of this process's thread
doing nothing but receive the same stream from the same engine with
``recv_into`` into one preallocated buffer (no parsing, no copy). The proxy's
own share is the difference (``above_floor_us_per_token_*``), the figure
linear-time handling is meant to keep flat (the floor does not include what
3 GB passing through the proxy's caches costs the rest of its work).

A cumulative engine also works harder as its answer grows (it builds each
chunk of every id and log-probability so far: ~0.5 MB a token at 16k), on
the machine's other core, and that slows the proxy's own work as well
(caches, memory bandwidth, the core's sibling). A third run measures this
apart: ``engine_work``, an engine that builds every cumulative chunk, drops
it and sends the incremental one (``--cumulative-work`` of the scripted
engine), so the proxy receives and parses exactly what it does in
``incremental``. Its CPU per token less incremental's is
``engine_work_us_per_token_*``; cumulative's figure less the floor and less
that is ``own_us_per_token_*``, the part of cumulative mode's cost that the
proxy's handling of the bytes decides.

Bystander: during one more answer of the longest length in each mode (not
counted in the CPU figures), another execution makes short calls (8 tokens)
back to back; their p50 and max latency are printed beside the same calls on
an idle proxy (``bystander_idle_*``).

The machine is shared while this runs: CPU time per token is the figure to
compare; the load average is printed with the results.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.bench_proxy import ROOT, _cpu_seconds, _spawn, _start_proxy, _stop

MODES = {"incremental": ["--incremental"], "cumulative": [], "engine_work": ["--incremental", "--cumulative-work"]}


def _lengths() -> list[int]:
    chosen = os.environ.get("GYRE_BENCH_STREAM_TOKENS", "1000,4000,16000")
    return [int(n) for n in chosen.split(",") if n]


async def _call(session, url: str, key: str, tokens: int) -> tuple[float, int]:
    """One streamed Anthropic call; (seconds to the last byte, output tokens reported)."""
    body = {"model": "m", "max_tokens": tokens, "stream": True, "messages": [{"role": "user", "content": "go"}]}
    start = time.perf_counter()
    async with session.post(url + "/v1/messages", json=body, headers={"x-api-key": key}) as response:
        data = await response.read()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {data[:200]!r}")
    usage = data.rfind(b'"output_tokens":')
    answered = int(data[usage + 16:data.index(b"}", usage)].strip()) if usage >= 0 else 0
    return time.perf_counter() - start, answered


async def _bystander(session, url: str, stop: asyncio.Event, calls: int | None = None) -> list[float]:
    times: list[float] = []
    while not stop.is_set() and (calls is None or len(times) < calls):
        times.append((await _call(session, url, "bench-key-1", 8))[0])
    return times


def _run_seconds(pid: int) -> float:
    """CPU time of a process's threads so far, in nanoseconds' resolution (``/proc/<pid>/task/*/schedstat``,
    the scheduler's run time): ``_cpu_seconds`` counts clock ticks (10 ms: 10 us a token at 1k tokens).
    A thread that ended meanwhile is not counted (the proxy's threads are pools that live on)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as handle:
                total += int(handle.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total / 1e9


def _system_seconds(pid: int) -> float:
    """The system (kernel) part of ``_cpu_seconds``: field 15 of ``/proc/<pid>/stat``."""
    with open(f"/proc/{pid}/stat") as handle:
        return int(handle.read().rsplit(")", 1)[1].split()[12]) / os.sysconf("SC_CLK_TCK")


def _reads(pid: int) -> tuple[int, int]:
    """The proxy's ``read`` system calls and the bytes they returned so far (``/proc/<pid>/io``:
    ``syscr``, ``rchar``): its event loop reads sockets with ``read``, so these count the reads of
    the engine's stream (and of the few request bytes) whatever the loop's callbacks do."""
    with open(f"/proc/{pid}/io") as handle:
        fields = dict(line.split(": ") for line in handle.read().splitlines())
    return int(fields["syscr"]), int(fields["rchar"])


def _receive_floor_seconds(engine_url: str, tokens: int) -> float:
    """CPU time of this thread receiving one ``/generate`` stream of ``tokens`` tokens and doing
    nothing else (read into one preallocated buffer until the engine closes the connection)."""
    host, port = engine_url.split("//", 1)[1].rsplit(":", 1)
    body = json.dumps({"rid": "floor", "input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": tokens},
                       "return_logprob": True, "stream": True}).encode()
    head = (f"POST /generate HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    view = memoryview(bytearray(1 << 20))
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(head + body)
        start = time.thread_time()
        while sock.recv_into(view):
            pass
        return time.thread_time() - start


async def _mode(url: str, pid: int, lengths: list[int], bystander: bool) -> dict:
    import aiohttp

    figures: dict = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as session:
        await _call(session, url, "bench-key-0", 50)  # warm-up: connections, tokenizer, records
        idle = await _bystander(session, url, asyncio.Event(), calls=50)
        figures["bystander_idle_p50_ms"] = float(np.percentile(idle, 50)) * 1e3
        figures["bystander_idle_max_ms"] = max(idle) * 1e3
        for tokens in lengths:
            run, ticks, system, reads = _run_seconds(pid), _cpu_seconds(pid), _system_seconds(pid), _reads(pid)
            wall, answered = await _call(session, url, "bench-key-0", tokens)
            calls, received = (after - before for after, before in zip(_reads(pid), reads))
            figures[f"reads_per_token_{tokens}"] = calls / max(answered, 1)
            figures[f"bytes_per_read_{tokens}"] = received / max(calls, 1)
            figures[f"cpu_us_per_token_{tokens}"] = (_run_seconds(pid) - run) * 1e6 / max(answered, 1)
            figures[f"cpu_us_ticks_per_token_{tokens}"] = (_cpu_seconds(pid) - ticks) * 1e6 / max(answered, 1)
            figures[f"cpu_us_system_per_token_{tokens}"] = (_system_seconds(pid) - system) * 1e6 / max(answered, 1)
            figures[f"wall_s_{tokens}"] = wall
            figures[f"answered_{tokens}"] = answered
        if not bystander:
            return figures
        stop = asyncio.Event()
        watcher = asyncio.ensure_future(_bystander(session, url, stop))
        await _call(session, url, "bench-key-0", max(lengths))
        stop.set()
        during = await watcher
        figures["bystander_during_p50_ms"] = float(np.percentile(during, 50)) * 1e3
        figures["bystander_during_max_ms"] = max(during) * 1e3
        figures["bystander_calls"] = len(during)
    return figures


def _engine_work_terms(results: dict, lengths: list[int]) -> None:
    """What the engine's cumulative work adds to the proxy's CPU, and cumulative's own share."""
    for tokens in lengths:
        term = results[f"engine_work_cpu_us_per_token_{tokens}"] - results[f"incremental_cpu_us_per_token_{tokens}"]
        own = results[f"cumulative_above_floor_us_per_token_{tokens}"] - term
        results[f"engine_work_us_per_token_{tokens}"] = term
        results[f"cumulative_own_us_per_token_{tokens}"] = own
        print(f"   {'derived':11s} {f'engine_work_us_per_token_{tokens}':28s} {term:10.2f}")
        print(f"   {'derived':11s} {f'own_us_per_token_{tokens}':28s} {own:10.2f}", flush=True)


def main() -> dict:
    sys.path.insert(0, str(ROOT / "tests" / "real"))
    from proxy_fixtures import build_tiny_tokenizer

    lengths = _lengths()
    results: dict = {"loadavg_before": open("/proc/loadavg").read().split()[0]}
    with tempfile.TemporaryDirectory() as scratch:
        model = build_tiny_tokenizer(Path(scratch) / "tiny")
        for mode, flags in MODES.items():
            engine, engine_url = _spawn([str(ROOT / "tests" / "real" / "proxy_fixtures.py"), "--model", str(model),
                                         "--script", "long", "--options", '{"words": 40000}',
                                         "--token-delay", "0.001", *flags])
            config = {"model_path": str(model), "fsync": True, "admin_token": "bench-admin-token",
                      "engines": [{"id": "e0", "url": engine_url}],
                      "executions": {"bench-key-0": "long-0", "bench-key-1": "bystander-1"}}
            try:
                proxy, proxy_url = _start_proxy(Path(scratch), config, f"records-{mode}")
                try:
                    figures = asyncio.run(_mode(proxy_url, proxy.pid, lengths, mode != "engine_work"))
                finally:
                    _stop(proxy)
                for tokens in lengths if mode != "engine_work" else []:
                    floor = _receive_floor_seconds(engine_url, tokens) * 1e6 / tokens
                    figures[f"receive_floor_us_per_token_{tokens}"] = floor
                    figures[f"above_floor_us_per_token_{tokens}"] = figures[f"cpu_us_per_token_{tokens}"] - floor
            finally:
                _stop(engine)
            for name, value in figures.items():
                print(f"   {mode:11s} {name:28s} {value:10.2f}", flush=True)
                results[f"{mode}_{name}"] = value
    _engine_work_terms(results, lengths)
    results["loadavg_after"] = open("/proc/loadavg").read().split()[0]
    print(f"   load average (1 min) before {results['loadavg_before']}, after {results['loadavg_after']}")
    return results


if __name__ == "__main__":
    main()
