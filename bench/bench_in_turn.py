"""Two versions of the proxy compared at one client: called in turn, on one engine, in one run.

On this shared 2-core machine a single proxy's added latency moves with the machine's phase
more than with a change to the proxy (``docs/cpu-stack.md#the-proxy-on-two-cores``), so two
versions are measured side by side: one scripted engine (``tests/real/proxy_fixtures.py``), a
proxy running the checkout in ``GYRE_BENCH_BASE`` (``base``; e.g. ``git worktree add /tmp/base
main``) and one running this checkout (``this``), both with durable records (``fsync``). Each
round makes a direct engine call and one call to each proxy, in an order that alternates
between rounds, with ``bench proxy``'s latency requests (streaming Anthropic ``/v1/messages``,
aiohttp client, time to the last byte). Per proxy and run: added p50 and p90 (proxied minus
direct, both at that percentile), and the proxy's CPU per call (whole process, and its event
loop's thread) over the run's rounds, read from ``/proc``. Without ``GYRE_BENCH_BASE`` both
proxies run this checkout: the spread between them is the noise floor.

``paired_median_ms``: the median over rounds of ``this`` minus ``base`` within a round, the
comparison that holds best while other work loads the machine (both calls of a round see the same
phase of it).

``GYRE_BENCH_RUNS`` runs (default 3) of ``GYRE_BENCH_ROUNDS`` rounds (default 1,000), each on
fresh proxies; the load average is printed beside each run.

``GYRE_BENCH_CLIENTS=64`` (any count above 1) compares throughput instead: per run,
``GYRE_BENCH_WINDOWS`` windows (default 6) of ``GYRE_BENCH_WINDOW_S`` seconds (default 3) on each
proxy in turn (the order alternating), that many concurrent executions calling back to back
(``bench proxy``'s throughput load, its lean client on uvloop). Per proxy and run: calls/s and CPU per
call (whole process, event-loop thread) over its windows; ``paired_rps_ratio``: the median over
window pairs of ``this`` calls/s over ``base`` calls/s (adjacent windows see about the same phase of
the machine), and ``paired_loop_cpu_ratio`` the same for the loop thread's CPU per call.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.bench_proxy import ROOT, _cpu_seconds, _run_fast, _spawn, _stop, _throughput, _timed

# runs ``gyre.real.proxy.cli`` from the checkout named by its first argument, whatever gyre is installed
_LAUNCH = """import importlib.machinery, importlib.util, runpy, sys
base = sys.argv.pop(1)
roots = {"gyre": base, "gyre.sim": base, "gyre.real": base, "gyre.analysis": base, "gyre.paper_figs": base}
folders = {"gyre": "gyre", "gyre.sim": "sim", "gyre.real": "real", "gyre.analysis": "analysis",
           "gyre.paper_figs": "paper_figs"}
class CheckoutFinder:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name not in roots:
            return None
        spec = importlib.machinery.PathFinder.find_spec(folders[name], [roots[name]])
        return importlib.util.spec_from_file_location(name, spec.origin,
                                                      submodule_search_locations=spec.submodule_search_locations)
sys.meta_path.insert(0, CheckoutFinder)
runpy.run_module("gyre.real.proxy.cli", run_name="__main__", alter_sys=True)
"""


def _start(checkout: Path, scratch: Path, config: dict, name: str):
    path = scratch / f"proxy-{name}.json"
    path.write_text(json.dumps(dict(config, records_dir=str(scratch / f"records-{name}"))))
    return _spawn(["-c", _LAUNCH, str(checkout), "--config", str(path), "--port", "0"])


async def _rounds(engine_url: str, proxies: dict, input_ids: list[int], rounds: int, warm: int) -> dict:
    import aiohttp

    direct_body = {"input_ids": input_ids, "stream": True, "return_logprob": True,
                   "sampling_params": {"max_new_tokens": 64}}
    proxied_body = {"model": "m", "max_tokens": 64, "stream": True,
                    "messages": [{"role": "user", "content": "how are you?"}]}
    headers = {"x-api-key": "bench-key-0"}
    names = list(proxies)
    times: dict[str, list[float]] = {name: [] for name in ["direct", *names]}
    cpu: dict[str, tuple[float, float]] = {}
    async with aiohttp.ClientSession() as session:
        for i in range(warm + rounds):
            if i == warm:
                cpu = {name: (_cpu_seconds(pid), _cpu_seconds(pid, pid)) for name, (pid, _) in proxies.items()}
            direct = await _timed(session, engine_url + "/generate", dict(direct_body, rid=f"t{i}"), {})
            for name in names if i % 2 else names[::-1]:
                took = await _timed(session, proxies[name][1] + "/v1/messages", proxied_body, headers)
                if i >= warm:
                    times[name].append(took)
            if i >= warm:
                times["direct"].append(direct)
    figures = {}
    direct_ms = np.array(times["direct"]) * 1e3
    for name, (pid, _) in proxies.items():
        proxied_ms = np.array(times[name]) * 1e3
        for q in (50, 90):
            figures[f"{name}_added_p{q}_ms"] = float(np.percentile(proxied_ms, q) - np.percentile(direct_ms, q))
        figures[f"{name}_cpu_ms_per_call"] = (_cpu_seconds(pid) - cpu[name][0]) * 1e3 / rounds
        figures[f"{name}_loop_cpu_ms_per_call"] = (_cpu_seconds(pid, pid) - cpu[name][1]) * 1e3 / rounds
    figures["direct_p50_ms"] = float(np.percentile(direct_ms, 50))
    if len(names) == 2:  # the two calls of one round see the same phase of the machine
        figures["paired_median_ms"] = float(np.median((np.array(times[names[1]]) - np.array(times[names[0]])) * 1e3))
    return figures


def _windows(proxies: dict, clients: int, windows: int, window_s: float) -> dict:
    """Throughput of each proxy in turn (see the module doc): calls/s and CPU per call, paired ratios."""
    names = list(proxies)
    per: dict[str, dict[str, list[float]]] = {name: {"rps": [], "cpu": [], "loop": []} for name in names}
    for name in names:  # a short warm-up window each: connections, caches, the first records
        _run_fast(_throughput(proxies[name][1], clients, 0.5))
    for window in range(windows):
        for name in names if window % 2 else names[::-1]:
            pid, url = proxies[name]
            cpu, loop = _cpu_seconds(pid), _cpu_seconds(pid, pid)
            rps, done = _run_fast(_throughput(url, clients, window_s))
            per[name]["rps"].append(rps)
            per[name]["cpu"].append((_cpu_seconds(pid) - cpu) * 1e3 / max(done, 1))
            per[name]["loop"].append((_cpu_seconds(pid, pid) - loop) * 1e3 / max(done, 1))
    figures = {}
    for name in names:
        figures[f"{name}_rps"] = float(np.median(per[name]["rps"]))
        figures[f"{name}_cpu_ms_per_call"] = float(np.median(per[name]["cpu"]))
        figures[f"{name}_loop_cpu_ms_per_call"] = float(np.median(per[name]["loop"]))
    if len(names) == 2:
        base, this = per[names[0]], per[names[1]]
        figures["paired_rps_ratio"] = float(np.median(np.array(this["rps"]) / np.array(base["rps"])))
        figures["paired_loop_cpu_ratio"] = float(np.median(np.array(this["loop"]) / np.array(base["loop"])))
    return figures


def _one_run(base: Path, rounds: int, clients: int = 1) -> dict:
    sys.path.insert(0, str(ROOT / "tests" / "real"))
    from proxy_fixtures import build_tiny_tokenizer

    from gyre.real.proxy.tokenize import ChatTokenizer

    with tempfile.TemporaryDirectory() as folder:
        scratch = Path(folder)
        model = build_tiny_tokenizer(scratch / "tiny")
        chat = ChatTokenizer(str(model))
        input_ids = chat.encode(chat.render([{"role": "user", "content": "how are you?"}], None))
        engine, engine_url = _spawn([str(ROOT / "tests" / "real" / "proxy_fixtures.py"), "--model", str(model),
                                     "--script", "short"])
        config = {"model_path": str(model), "fsync": True, "admin_token": "bench-admin-token",
                  "engines": [{"id": "e0", "url": engine_url}],
                  "executions": {f"bench-key-{i}": f"bench-{i}" for i in range(max(clients, 1))}}
        started = []
        try:
            for name, checkout in (("base", base), ("this", ROOT)):
                started.append(_start(checkout, scratch, config, name))
            proxies = {name: (process.pid, url) for name, (process, url) in zip(("base", "this"), started)}
            if clients > 1:
                return _windows(proxies, clients, int(os.environ.get("GYRE_BENCH_WINDOWS", "6")),
                                float(os.environ.get("GYRE_BENCH_WINDOW_S", "3")))
            return asyncio.run(_rounds(engine_url, proxies, input_ids, rounds, warm=50))
        finally:
            for process, _ in started:
                _stop(process)
            _stop(engine)


def main() -> dict:
    base = Path(os.environ.get("GYRE_BENCH_BASE", str(ROOT))).resolve()
    runs, rounds = int(os.environ.get("GYRE_BENCH_RUNS", "3")), int(os.environ.get("GYRE_BENCH_ROUNDS", "1000"))
    clients = int(os.environ.get("GYRE_BENCH_CLIENTS", "1"))
    if clients > 1:
        print(f"   base: {base}; this: {ROOT}; {runs} runs, {clients} clients, windows in turn")
    else:
        print(f"   base: {base}; this: {ROOT}; {runs} runs of {rounds} rounds")
    all_runs = []
    for run in range(runs):
        load_before = os.getloadavg()[0]
        start = time.perf_counter()
        figures = _one_run(base, rounds, clients)
        figures["load_1min"] = (load_before + os.getloadavg()[0]) / 2
        all_runs.append(figures)
        print(f"   run {run}: " + ", ".join(f"{name} {value:.3f}" for name, value in figures.items())
              + f" ({time.perf_counter() - start:.0f} s)", flush=True)
    summary = {}
    for name in all_runs[0]:
        values = [figures[name] for figures in all_runs]
        summary[f"{name}_median"] = float(np.median(values))
        summary[f"{name}_min"], summary[f"{name}_max"] = float(min(values)), float(max(values))
    if clients > 1:
        for name in ("paired_rps_ratio", "paired_loop_cpu_ratio"):
            print(f"   this / base, {name} per run: {', '.join(f'{f[name]:.3f}' for f in all_runs)}")
        return summary
    deltas = [f["this_added_p50_ms"] - f["base_added_p50_ms"] for f in all_runs]
    paired = [f["paired_median_ms"] for f in all_runs]
    print(f"   this - base, median of the rounds' differences (ms): {', '.join(f'{d:+.3f}' for d in paired)}")
    cpu_deltas = [f["this_cpu_ms_per_call"] - f["base_cpu_ms_per_call"] for f in all_runs]
    print(f"   this - base, added p50 per run (ms): {', '.join(f'{d:+.3f}' for d in deltas)}")
    print(f"   this - base, proxy CPU per call (ms): {', '.join(f'{d:+.3f}' for d in cpu_deltas)}")
    summary["this_minus_base_added_p50_ms_median"] = float(np.median(deltas))
    summary["this_minus_base_cpu_ms_median"] = float(np.median(cpu_deltas))
    return summary


if __name__ == "__main__":
    main()
