"""Publishing weights to SGLang CPU engines: from disk vs from memory (a gloo weight-update group).

Builds a seeded random Qwen2 locally (hidden 512, 4 layers, tied embeddings:
``SHAPE``; nothing is downloaded), starts ``ENGINES`` SGLang CPU engines on it
and publishes a perturbed copy of its tensors ``REPEATS`` times per path,
alternating the paths:

- disk (``train.publish``): write the Hugging Face folder (``save_hf_tensors``),
  then ``POST /update_weights_from_disk`` to every engine at once;
- memory (``train.publish_memory``): broadcast the tensors over the already
  open weight-update group, bucket by bucket, while every engine receives
  (``/update_weights_from_distributed``). Opening the group is timed apart (once).

Per path it reports seconds per GB of float32 tensors (best and median of the
repeats: the machine is shared, 2 cores) and the engine pause: the time the
engines' update calls take (an engine serves no request meanwhile), for 1
engine and for 2 (how the cost grows with engines). It also prints the load
average beside the figures. ``python -m bench publication`` runs it; skipped
when the SGLang virtualenv is absent.
"""

from __future__ import annotations

import datetime
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

SHAPE = {"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 4, "num_attention_heads": 8,
         "num_key_value_heads": 4}
FLAGS = ("--skip-tokenizer-init", "--mem-fraction-static", "0.05", "--max-total-tokens", "4096",
         "--skip-server-warmup")
REPEATS = int(os.environ.get("GYRE_BENCH_PUBLICATION_REPEATS", "3"))


def _disk(urls, tensors, cfg, root: Path, version: int) -> tuple[float, float]:
    from gyre.real.train.publish import post_json, save_hf_tensors

    t0 = time.perf_counter()
    path = save_hf_tensors(root, tensors, cfg, version)
    t1 = time.perf_counter()
    payload = {"model_path": str(path), "load_format": None, "abort_all_requests": False,
               "weight_version": str(version)}
    threads = [threading.Thread(target=post_json, args=(f"{u}/update_weights_from_disk", payload, 600.0))
               for u in urls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    t2 = time.perf_counter()
    return t2 - t0, t2 - t1


def _memory(publisher, tensors, version: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    publisher.publish(list(tensors.items()), version)
    elapsed = time.perf_counter() - t0
    return elapsed, elapsed  # the engines receive and load for the whole broadcast


def _measure(engines: int, folder: Path, work: Path) -> dict:
    import torch
    from safetensors.torch import load_file

    from gyre.real.engines.manager import EngineManager, EngineSpec
    from gyre.real.train.bridge import model_config_from_hf
    from gyre.real.train.publish_memory import MemoryPublisher, free_port

    cfg = model_config_from_hf(folder)
    base = load_file(str(folder / "model.safetensors"))
    gb = sum(t.numel() * t.element_size() for t in base.values()) / 1e9
    manager = EngineManager(work / f"logs-{engines}")
    names = [f"pub{engines}-{i}" for i in range(engines)]
    urls = [manager.launch(EngineSpec(engine_id=n, model_path=str(folder), port=free_port(), extra_args=FLAGS)).url
            for n in names]
    times: dict[str, list[tuple[float, float]]] = {"disk": [], "memory": []}
    try:
        for name in names:
            manager.wait_healthy(name, timeout=600)
        t0 = time.perf_counter()
        publisher = MemoryPublisher({u: 1 for u in urls}, bucket_bytes=64 << 20, timeout=600.0).open(
            torch.device("cpu"))
        open_s = time.perf_counter() - t0
        for repeat in range(REPEATS):
            version = 1 + 2 * repeat
            tensors = {k: v + 1e-3 * version for k, v in base.items()}
            times["disk"].append(_disk(urls, tensors, cfg, work / f"ckpt-{engines}", version))
            times["memory"].append(_memory(publisher, tensors, version + 1))
        publisher.close()
    finally:
        manager.shutdown_all()
    out = {"engines": engines, "gb": round(gb, 4), "group_open_s": round(open_s, 3)}
    for path, runs in times.items():
        totals, pauses = [t for t, _ in runs], [p for _, p in runs]
        out[path] = {"s_per_gb_best": round(min(totals) / gb, 2), "s_per_gb_median": round(statistics.median(totals)
                     / gb, 2), "pause_s_median": round(statistics.median(pauses), 3)}
    return out


def main() -> dict:
    from gyre.real.engines.manager import sglang_python

    if not sglang_python().exists():
        print("   skipped: the SGLang CPU virtualenv is not built")
        return {"skipped": "no SGLang venv"}
    import torch.distributed as dist

    from gyre.real.toy.tiny_model import build_tiny_qwen2

    if not dist.is_initialized():  # what a cell has; the update group is a second group beside it
        import torch

        store = torch.distributed.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=60))
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    results = []
    with tempfile.TemporaryDirectory(prefix="gyre-bench-pub-") as tmp:
        folder = build_tiny_qwen2(Path(tmp) / "model", shape=SHAPE)
        for engines in (1, 2):
            load = open("/proc/loadavg").read().split()[:3]
            row = _measure(engines, folder, Path(tmp))
            row["loadavg"] = " ".join(load)
            print(f"   {engines} engine(s), {row['gb']:.3f} GB: disk {row['disk']} | memory {row['memory']} | "
                  f"group open {row['group_open_s']} s | load {row['loadavg']}", flush=True)
            results.append(row)
    return {"runs": results}
