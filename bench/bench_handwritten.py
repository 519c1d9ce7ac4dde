"""What the proxy's two hand-written pieces buy over the library each stands in for, measured.

- ``http``: the engine client's HTTP/1.1 client (``proxy.http_client.HttpClient``) against
  aiohttp's ``ClientSession``: ``clients`` concurrent coroutines on uvloop call a scripted engine
  process (``tests/real/proxy_fixtures.py``, incremental SSE, the proxy's engine-call shape:
  streaming ``/generate`` with input ids, answered "ok, done") back to back for ``window_s``; the
  figure is this process's CPU time per call (the client's whole cost: what it takes from the
  proxy's event loop), beside calls/s and the engine's CPU per call (the same in both when only
  the client differs). Windows alternate, ``runs`` of each.
- ``journal``: durable group commit of records through ``group_commit.GroupCommit`` (frames
  into per-execution logs, one ``fdatasync`` of the commit journal per batch) against SQLite
  (WAL, ``synchronous=FULL``: the library a durable append-only store would take), with the same
  batching: one writer thread, one transaction per batch, the same encoded frames as blobs; and
  against what the journal replaced: the same logs, each touched log synced per batch (16
  threads).
  ``executions`` records are submitted at once, acknowledged, again ``bursts`` times (the shape
  of 64 executions whose calls end together); the figure is CPU time per record of the whole
  process, and wall time per burst, after as many untimed bursts first (a new journal grows to
  its capacity by doubling, writing zeros: a one-off cost of a fresh records folder).

``GYRE_BENCH_HANDWRITTEN=http,journal`` picks the parts. The machine is shared while this runs:
CPU time is the figure to compare; the load average is printed with the results.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench.bench_proxy import ROOT, _cpu_seconds, _spawn, _stop

BODY_IDS = list(range(100, 160))


async def _window(call, clients: int, window_s: float) -> int:
    done = 0
    stop_at = time.perf_counter() + window_s

    async def client(index: int) -> None:
        nonlocal done
        while time.perf_counter() < stop_at:
            await call(index)
            done += 1

    await asyncio.gather(*(client(i) for i in range(clients)))
    return done


async def _http_window(kind: str, url: str, clients: int, window_s: float) -> int:
    import json

    import aiohttp

    from gyre.real.proxy.http_client import HttpClient

    body = {"input_ids": BODY_IDS, "stream": True, "return_logprob": True, "sampling_params": {"max_new_tokens": 8}}
    headers = {"Content-Type": "application/json"}
    if kind == "lean":
        http = HttpClient(connect_timeout_s=30, read_timeout_s=60)

        async def call(index: int) -> None:
            data = json.dumps(dict(body, rid=f"l{index}-{time.perf_counter_ns()}")).encode()
            received = bytearray()  # read as the proxy's engine client reads: into its one buffer
            async with await http.request("POST", url + "/generate", data, headers) as response:
                async for _ in response.iter_into(received):
                    received.clear()
        try:
            return await _window(call, clients, window_s)
        finally:
            await http.close()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def call(index: int) -> None:
            data = json.dumps(dict(body, rid=f"a{index}-{time.perf_counter_ns()}")).encode()
            async with session.post(url + "/generate", data=data, headers=headers) as response:
                async for _ in response.content.iter_any():
                    pass
        return await _window(call, clients, window_s)


def _http(model: Path, clients: int, window_s: float, runs: int) -> dict:
    import uvloop

    engine, url = _spawn([str(ROOT / "tests" / "real" / "proxy_fixtures.py"), "--model", str(model), "--incremental"])
    figures: dict[str, list] = {}
    try:
        uvloop.run(_http_window("lean", url, clients, 1.0))  # warm-up: connections, imports
        for _ in range(runs):
            for kind in ("lean", "aiohttp"):
                cpu, engine_cpu, start = time.process_time(), _cpu_seconds(engine.pid), time.perf_counter()
                calls = uvloop.run(_http_window(kind, url, clients, window_s))
                wall = time.perf_counter() - start
                figures.setdefault(f"{kind}_client_cpu_ms_per_call", []).append(
                    (time.process_time() - cpu) * 1e3 / calls)
                figures.setdefault(f"{kind}_engine_cpu_ms_per_call", []).append(
                    (_cpu_seconds(engine.pid) - engine_cpu) * 1e3 / calls)
                figures.setdefault(f"{kind}_calls_per_s", []).append(calls / wall)
    finally:
        _stop(engine)
    return figures


class _BatchWriter:
    """One writer thread taking whatever was submitted since its last batch; ``_write`` makes a batch
    durable, then every submitter is told. Subclasses say how (``_write``) and what to release."""

    def __init__(self) -> None:
        self.pending: list = []
        self.cond = threading.Condition()
        self.closed = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def submit(self, execution, frame, done) -> None:
        with self.cond:
            self.pending.append((execution, frame, done))
            self.cond.notify()

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.pending and not self.closed:
                    self.cond.wait()
                if not self.pending:
                    return
                batch, self.pending = self.pending, []
            self._write(batch)
            for _, _, done in batch:
                done(None)

    def _write(self, batch: list) -> None:
        raise NotImplementedError

    def _release(self) -> None:
        pass

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify()
        self.thread.join()
        self._release()


class _SqliteGroup(_BatchWriter):
    """The library alternative: one writer thread, one WAL transaction (synchronous=FULL) per batch."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("CREATE TABLE records (execution TEXT, frame BLOB)")
        super().__init__()

    def _write(self, batch: list) -> None:
        self.db.execute("BEGIN")
        self.db.executemany("INSERT INTO records VALUES (?, ?)", [(e, f) for e, f, _ in batch])
        self.db.execute("COMMIT")

    def _release(self) -> None:
        self.db.close()


class _PerLogGroup(_BatchWriter):
    """What the journal replaced: the same writer, each touched log synced itself (in parallel)."""

    def __init__(self, root: Path) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from gyre.real.store.tito_log import ExecutionStore

        self.store = ExecutionStore(root, fsync=True, preallocate=False)
        self.syncers = ThreadPoolExecutor(max_workers=16)
        super().__init__()

    def _write(self, batch: list) -> None:
        touched = {}
        for call, _, _ in batch:
            touched[call.execution_id] = log = self.store.log_for(call.execution_id)
            log.write(call)
        list(self.syncers.map(lambda log: log.sync(), touched.values()))

    def _release(self) -> None:
        self.syncers.shutdown()
        self.store.close()


def _records(executions: int, bursts: int):
    from gyre.trajectory.records import ModelCall

    rng = np.random.default_rng(0)
    return [[ModelCall(execution_id=f"e{i}", request_id=f"r{b}", input_ids=rng.integers(0, 1000, 600),
                       output_ids=rng.integers(0, 1000, 40), output_logprobs=-rng.random(40), policy_version=0)
             for i in range(executions)] for b in range(bursts)]


def _commit_bursts(submit, bursts: list) -> None:
    for burst in bursts:
        left = threading.Semaphore(0)
        for call in burst:
            submit(call, lambda error, left=left: left.release())
        for _ in burst:
            left.acquire()


def _bursts(submit, bursts: list) -> tuple[float, float]:
    """(CPU ms per record, wall ms per burst) of committing the second half of ``bursts``, one after
    the other, after the first half untimed."""
    warm, timed = bursts[: len(bursts) // 2], bursts[len(bursts) // 2:]
    _commit_bursts(submit, warm)
    cpu, start = time.process_time(), time.perf_counter()
    _commit_bursts(submit, timed)
    records = sum(len(b) for b in timed)
    return (time.process_time() - cpu) * 1e3 / records, (time.perf_counter() - start) * 1e3 / len(timed)


def _journal(executions: int, bursts: int, runs: int) -> dict:
    from gyre.real.store.group_commit import GroupCommit
    from gyre.real.store.tito_log import ExecutionStore, encode_frame

    figures: dict[str, list] = {}
    for _ in range(runs):
        data = _records(executions, bursts)
        with tempfile.TemporaryDirectory() as scratch:
            group = GroupCommit(ExecutionStore(Path(scratch) / "journal", fsync=True))
            cpu, wall = _bursts(group.submit, data)
            group.close()
            figures.setdefault("journal_cpu_ms_per_record", []).append(cpu)
            figures.setdefault("journal_wall_ms_per_burst", []).append(wall)
            lite = _SqliteGroup(Path(scratch) / "records.db")
            # the frame is encoded on the submitting side, as the journal's writer encodes it in ``log.write``
            cpu, wall = _bursts(lambda call, done, lite=lite: lite.submit(call.execution_id, encode_frame(call), done),
                                data)
            lite.close()
            figures.setdefault("sqlite_cpu_ms_per_record", []).append(cpu)
            figures.setdefault("sqlite_wall_ms_per_burst", []).append(wall)
            per_log = _PerLogGroup(Path(scratch) / "per-log")
            cpu, wall = _bursts(lambda call, done, per_log=per_log: per_log.submit(call, b"", done), data)
            per_log.close()
            figures.setdefault("per_log_sync_cpu_ms_per_record", []).append(cpu)
            figures.setdefault("per_log_sync_wall_ms_per_burst", []).append(wall)
    return figures


def main(clients: int = 64, window_s: float = 3.0, runs: int = 3) -> dict:
    sys.path.insert(0, str(ROOT / "tests" / "real"))
    from proxy_fixtures import build_tiny_tokenizer

    parts = set(os.environ.get("GYRE_BENCH_HANDWRITTEN", "http,journal").split(","))
    results: dict = {"loadavg_before": open("/proc/loadavg").read().split()[0]}
    figures: dict[str, list] = {}
    with tempfile.TemporaryDirectory() as scratch:
        if "http" in parts:
            figures.update(_http(build_tiny_tokenizer(Path(scratch) / "tiny"), clients, window_s, runs))
        if "journal" in parts:
            figures.update(_journal(executions=64, bursts=200, runs=runs))
    for name, values in figures.items():
        results[name] = float(np.median(values))
        results[name + "_spread"] = [round(float(min(values)), 4), round(float(max(values)), 4)]
        print(f"   {name:34s} median {np.median(values):9.3f}  runs {[round(v, 3) for v in values]}", flush=True)
    results["loadavg_after"] = open("/proc/loadavg").read().split()[0]
    print(f"   load average (1 min) before {results['loadavg_before']}, after {results['loadavg_after']}")
    return results


if __name__ == "__main__":
    main()
