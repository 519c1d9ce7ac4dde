"""SGLang decode throughput against concurrency, on the CPU engine; fits the simulator's engine curve.

Launches one real SGLang CPU engine (``.venv-sglang``, via
``gyre.real.engines.manager``) on a seeded random Qwen2 built locally from a
config (nothing is downloaded), then for each concurrency c in 1, 2, 4, 8, 16
sends c simultaneous greedy ``/generate`` requests of a fixed prompt length
and a fixed output length (``ignore_eos``), ``REPEATS`` times. Per level it
reports the aggregate decode throughput (c x output tokens / wall time of the
batch) and the per-request rate (output tokens / each request's latency,
averaged), both the best of the repeats (levels interleaved across repeats),
the usual estimate of the undisturbed figure on a machine other jobs share.

Fit (``gyre.sim.engines.fit_load_alpha``): per-request rate relative to
concurrency 1 is ``1 / (1 + a * x)`` with ``x = (c - 1) / (c_max - 1)``, where
``c_max`` (the largest level measured) plays the engine's capacity, so ``a``
says how much slower each request is on a full engine than alone. ``a`` is
fitted by least squares on ``1/rate - 1``, which is linear in ``a``. By default the
``tiny`` 2-layer hidden-64 Qwen2 of the tests is measured (the simulator's
default curve, ``gyre.sim.engines.MEASURED``); ``GYRE_BENCH_ENGINE_MODELS=tiny,small``
adds a 4-layer hidden-512 one whose decode step is more compute-bound (slow
on 2 shared cores: its requests timed out once under heavy load from other jobs).

The machine is shared with other jobs (2 cores): wall times are noisy;
the printed CPU time of this client is not the engine's. Skipped, with the
reason, when the SGLang virtualenv is absent. ``python -m bench engine`` runs it.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

LEVELS = (1, 2, 4, 8, 16)
OUTPUT_TOKENS = 64
PROMPT_TOKENS = 16
REPEATS = 5
SMALL_ARGS = ("--mem-fraction-static", "0.05", "--max-total-tokens", "32768", "--skip-server-warmup",
              "--max-running-requests", "64")


def build_small_qwen2(path: Path, *, seed: int = 0) -> Path:
    """A seeded random 4-layer hidden-512 Qwen2 beside the tiny tokenizer (built from a config)."""
    from gyre.real.toy.tiny_model import build_tiny_qwen2

    return build_tiny_qwen2(path, seed=seed, shape={"hidden_size": 512, "intermediate_size": 1536,
                                                    "num_hidden_layers": 4, "num_attention_heads": 8})


def _one_level(manager, engine: str, c: int, repeat: int) -> tuple[float, float]:
    """(aggregate tokens/s, mean per-request tokens/s) of c simultaneous requests."""
    latencies: list[float] = [0.0] * c
    errors: list[BaseException] = []

    def request(i: int) -> None:
        prompt = [(7 + 31 * i + 13 * repeat + 5 * k) % 900 + 20 for k in range(PROMPT_TOKENS)]  # distinct prompts
        body = {"input_ids": prompt,
                "sampling_params": {"max_new_tokens": OUTPUT_TOKENS, "temperature": 0.0, "ignore_eos": True}}
        t0 = time.perf_counter()
        try:
            out = manager.generate(engine, body)
            got = out["meta_info"]["completion_tokens"]
            if got != OUTPUT_TOKENS:
                raise RuntimeError(f"request {i} produced {got} tokens, expected {OUTPUT_TOKENS}")
        except BaseException as exc:  # noqa: BLE001 - re-raised below in the main thread
            errors.append(exc)
        latencies[i] = time.perf_counter() - t0

    threads = [threading.Thread(target=request, args=(i,)) for i in range(c)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return c * OUTPUT_TOKENS / wall, statistics.fmean(OUTPUT_TOKENS / lat for lat in latencies)


def measure(model_path: Path, log_dir: Path, levels: tuple[int, ...] = LEVELS) -> list[dict]:
    from gyre.real.engines.manager import EngineManager, EngineSpec, free_port

    manager = EngineManager(log_dir, request_timeout=600.0)
    spec = EngineSpec(engine_id="bench", model_path=str(model_path), port=free_port(), extra_args=SMALL_ARGS)
    manager.launch(spec)
    try:
        manager.wait_healthy("bench", timeout=300)
        _one_level(manager, "bench", 4, 99)  # warm-up
        runs: dict[int, list[tuple[float, float]]] = {c: [] for c in levels}
        for r in range(REPEATS):  # levels interleaved, so a burst of load from other jobs hits them alike
            for c in levels:
                runs[c].append(_one_level(manager, "bench", c, r))
        return [{"concurrency": c, "aggregate_tok_s": max(a for a, _ in runs[c]),
                 "per_request_tok_s": max(p for _, p in runs[c])} for c in levels]
    finally:
        manager.shutdown_all()


def report(label: str, rows: list[dict]) -> dict:
    from gyre.sim.engines import fit_load_alpha

    points = [(r["concurrency"], r["per_request_tok_s"]) for r in rows]
    alpha = fit_load_alpha(points)
    base = rows[0]["per_request_tok_s"]
    print(f"   model {label}: output {OUTPUT_TOKENS} tokens, prompt {PROMPT_TOKENS}, best of {REPEATS}")
    print("   concurrency  aggregate_tok_s  per_request_tok_s  relative_rate")
    for r in rows:
        print(f"   {r['concurrency']:11d}  {r['aggregate_tok_s']:15.1f}  {r['per_request_tok_s']:17.1f}  "
              f"{r['per_request_tok_s'] / base:13.3f}")
    c_max = rows[-1]["concurrency"]
    print(f"   fit: per-request rate = rate(1) / (1 + a*x), x = (c-1)/{c_max - 1}: a = {alpha:.3f}")
    for r in rows:
        x = (r["concurrency"] - 1) / (c_max - 1)
        print(f"     c={r['concurrency']:2d}: fitted relative rate {1 / (1 + alpha * x):.3f}, "
              f"measured {r['per_request_tok_s'] / base:.3f}")
    return {"rows": rows, "alpha": round(alpha, 4)}


def main() -> dict:
    from gyre.real.engines.manager import sglang_python

    if not sglang_python().exists():
        print(f"   skipped: SGLang CPU venv not found at {sglang_python()} (run tools/setup_sglang_cpu.sh)")
        return {"skipped": "no SGLang venv"}
    from gyre.real.toy.tiny_model import build_tiny_qwen2

    out = {}
    with tempfile.TemporaryDirectory(prefix="gyre-bench-engine-") as tmp:
        tmp_path = Path(tmp)
        models = {"tiny": lambda: build_tiny_qwen2(tmp_path / "tiny"),
                  "small": lambda: build_small_qwen2(tmp_path / "small")}
        wanted = [m.strip() for m in os.environ.get("GYRE_BENCH_ENGINE_MODELS", "tiny").split(",") if m.strip()]
        unknown = sorted(set(wanted) - set(models))
        if unknown:
            raise ValueError(f"GYRE_BENCH_ENGINE_MODELS: unknown model(s) {unknown}; known: {sorted(models)}")
        for label in wanted:
            path = models[label]()
            t0, c0 = time.perf_counter(), time.process_time()
            out[label] = report(label, measure(path, tmp_path / f"logs-{label}"))
            print(f"   ({label}: {time.perf_counter() - t0:.0f} s wall, client CPU {time.process_time() - c0:.1f} s)")
    return out


if __name__ == "__main__":
    main()
