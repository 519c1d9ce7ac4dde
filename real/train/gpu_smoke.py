"""The GPU acceptance check behind ``make gpu-smoke`` / ``tools/gpu_smoke.sh``: one table, non-zero on any miss.

It cannot pass by accident. Asked for a GPU (the default) it fails when torch
is a CPU-only build, when CUDA sees no GPU, and when any row did not run; a
row passes only on a measured value inside its bound. ``--cpu`` runs only the
device-independent rows on the CPU (what the test suite runs), prints the GPU
rows as "not run", and its last line says that nothing on a GPU was checked.

Rows (docs/gpu.md, "GPU smoke check"):
- ``torch``: a CUDA build that sees at least one GPU (GPU mode);
- ``device after role switches``: weights, gradients, accumulator and masters
  on the training device after each of three restores, weights on the host
  after each offload (``train.state``);
- ``bf16 masters at lr 1e-6``: after two updates over 80% of the float32
  masters moved and the bfloat16 weights are the rounded masters
  (``train.precision``; on CUDA Megatron's mixed-precision optimizer);
- ``engine memory released`` (GPU): an SGLang engine started with the memory
  saver frees at least half of its share on ``/release_memory_occupation``,
  measured with ``torch.cuda.mem_get_info``;
- ``two bursts`` (GPU): ``gyre run`` of a small-model version of
  ``configs/gpu_node_qwen.toml``: every step published, the replay identical,
  the publication seconds and the reward per step and its trend (reported).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Row:
    name: str
    value: str = "not run"
    ok: bool | None = None  # None: did not run

    def cell(self) -> str:
        return {True: "ok", False: "FAIL", None: "not run"}[self.ok]


def torch_row(gpu: bool) -> Row:
    import torch

    if torch.version.cuda is None:
        return Row("torch", f"{torch.__version__} is a CPU-only build", not gpu)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return Row("torch", f"{torch.__version__}, CUDA {torch.version.cuda}, {count} GPU(s)", count > 0 or not gpu)


def _world(device) -> None:
    """A one-process world with Megatron's parallel state (what a cell sets up)."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    if not dist.is_initialized():
        store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=60))
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store, rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)


def _state(setup, dtype: str, lr: float):
    from gyre.real.train.cpu_compat import seed_model_rng
    from gyre.real.train.model import FlatParameters, LossConfig, ModelConfig, build_gpt
    from gyre.real.train.state import OptimConfig, TrainingState

    cfg = ModelConfig(dtype=dtype)
    seed_model_rng(cfg.init_seed, setup)
    model = build_gpt(cfg, setup.device)
    return TrainingState(model, FlatParameters(model), OptimConfig(lr=lr), LossConfig(), owns_optimizer=True,
                         device=setup.device)


def device_row(setup) -> Row:
    from gyre.real.toy.microsteps import toy_batch

    state = _state(setup, "bfloat16", 1e-6)
    wrong = []
    for switch in range(3):
        state.offload()
        if state.flat.data.device.type != "cpu":
            wrong.append(f"offload {switch}: weights on {state.flat.data.device}")
        state.restore()
        state.accumulate(toy_batch(switch, 0, 1)[0])
        state.apply_update()
        held = {"weights": state.flat.data, "grads": state.flat.grad, "accumulator": state.acc,
                "masters": state.masters()}
        wrong += [f"restore {switch}: {name} on {t.device}" for name, t in held.items() if t.device != state.device]
    return Row("device after role switches", "; ".join(wrong) or f"all on {state.device} after 3 restores",
               not wrong)


def masters_row(setup) -> Row:
    import torch

    from gyre.real.toy.microsteps import toy_batch

    state = _state(setup, "bfloat16", 1e-6)
    start = state.masters().clone()
    for seed in (1, 2):
        for step in toy_batch(seed, 0, 2):
            state.accumulate(step)
        state.apply_update()
    moved = (state.masters() != start).float().mean().item()
    rounded = torch.equal(state.flat.data, state.masters().to(torch.bfloat16))
    kind = type(state.updater).__name__
    return Row("bf16 masters at lr 1e-6", f"{moved:.1%} of masters moved, bf16 = rounded masters: {rounded} "
               f"({kind})", moved > 0.8 and rounded)


def engine_memory_row(checkpoint: str, work: Path) -> Row:
    import torch

    from gyre.real.engines.manager import EngineManager, EngineSpec
    from gyre.real.runtime.layout import GpuLayout
    from gyre.real.runtime.ports import free_port

    manager = EngineManager(work / "engine-logs")
    layout = GpuLayout(gpus_per_node=1, engine_mem_fraction=0.3)
    manager.launch(EngineSpec(engine_id="smoke", model_path=checkpoint, port=free_port(), cpu=False,
                              extra_args=layout.engine_args(0)))
    try:
        manager.wait_healthy("smoke", timeout=600)
        total = torch.cuda.mem_get_info(0)[1]
        used_serving = total - torch.cuda.mem_get_info(0)[0]
        manager.release_memory("smoke")
        time.sleep(2)
        used_released = total - torch.cuda.mem_get_info(0)[0]
        manager.resume_memory("smoke")
    finally:
        manager.shutdown_all()
    freed, share = used_serving - used_released, 0.3 * total
    return Row("engine memory released", f"{freed / 2**30:.1f} GiB freed of a {share / 2**30:.1f} GiB share",
               freed >= 0.5 * share)


def bursts_row(checkpoint: str, work: Path, gpus: int) -> Row:
    layout = (f"{{gpus_per_node = {gpus}, tensor_parallel = 1, pipeline_parallel = 1, engine_tensor_parallel = 1, "
              f"engine_mem_fraction = 0.2, gpu_memory_gib = 80}}")
    sets = [f'workdir="{work / "run"}"', f"nodes={min(gpus, 2)}", "steps=4", "C_e=4", "N=4", "B=2",
            "max_tokens=64", "token_budget=2048", "timeout_s=1800.0", 'harness="scripted"',
            "harness_options={calls = 2}", f"layout={layout}", 'publication="memory"',
            f'model={{checkpoint = "{checkpoint}", dtype = "bfloat16"}}']
    command = [sys.executable, "-m", "gyre.cli", "run", "--config", str(ROOT / "configs/gpu_node_qwen.toml")]
    for item in sets:
        command += ["--set", item]
    done = subprocess.run(command, cwd=ROOT)
    summary = work / "run" / "summary.json"
    if done.returncode != 0 or not summary.exists():
        return Row("two bursts", f"gyre run exited {done.returncode}", False)
    s = json.loads(summary.read_text())
    publish = [round(p["wall_s"], 2) for p in s.get("publishes", [])]
    routes = sorted({p.get("route", "?") for p in s.get("publishes", [])})
    ok = s["published"] >= s["steps"] and s["replay_identical"] and routes == ["memory"]
    return Row("two bursts", f"published {s['published']}/{s['steps']} in {publish} s from {routes}, reward per step "
               f"{[round(r, 3) for r in s['reward_curve']]}, trend {s.get('reward_trend')}", ok)


def run_checks(*, gpu: bool, checkpoint: str | None = None, work: Path | None = None) -> list[Row]:
    """Every row; GPU rows run only with ``gpu`` and a usable CUDA torch (else they stay "not run")."""
    from gyre.real.train.cpu_compat import prepare_device

    rows = [torch_row(gpu)]
    if gpu and not rows[0].ok:
        return rows + [Row(name) for name in ("device after role switches", "bf16 masters at lr 1e-6",
                                              "engine memory released", "two bursts")]
    setup = prepare_device("cuda" if gpu else "cpu")
    _world(setup.device)
    rows += [device_row(setup), masters_row(setup)]
    if not gpu:
        return rows + [Row("engine memory released"), Row("two bursts")]
    import torch

    work = work or ROOT / "runs" / "gpu-smoke"
    checkpoint = checkpoint or _tiny_checkpoint(work)
    return rows + [engine_memory_row(checkpoint, work), bursts_row(checkpoint, work, torch.cuda.device_count())]


def _tiny_checkpoint(work: Path) -> str:
    from gyre.real.toy.tiny_model import build_tiny_qwen2

    return str(build_tiny_qwen2(work / "tiny-qwen2"))


def table(rows: list[Row]) -> str:
    width = max(len(r.name) for r in rows)
    return "\n".join(f"  {r.name:<{width}}  {r.cell():<7}  {r.value}" for r in rows)


def verdict(rows: list[Row], gpu: bool) -> int:
    """0 only when every row that must run ran and passed (GPU mode: every row)."""
    must = rows if gpu else [r for r in rows if r.name not in ("engine memory released", "two bursts")]
    return 0 if all(r.ok for r in must) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-smoke", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", nargs="?", default=os.environ.get("GYRE_SMOKE_CHECKPOINT") or None)
    parser.add_argument("--cpu", action="store_true", help="only the device-independent rows, on the CPU")
    args = parser.parse_args(argv)
    rows = run_checks(gpu=not args.cpu, checkpoint=args.checkpoint)
    status = verdict(rows, gpu=not args.cpu)
    print("gpu-smoke:\n" + table(rows))
    if args.cpu:
        print(f"gpu-smoke: CPU mode: no GPU check ran; device-independent rows {'pass' if status == 0 else 'FAIL'}")
    else:
        print(f"gpu-smoke: {'PASS' if status == 0 else 'FAIL'}")
    return status


if __name__ == "__main__":
    sys.exit(main())
