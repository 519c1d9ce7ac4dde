"""``gyre run --dry-run`` on a Ray cluster: the job placed for real, each process's environment shown, all released.

``placed_plan_lines(job)`` connects to the job's cluster, makes the placement a
run would make (``cluster.placement.Placement.open``: one placement group per
cell, with its GPUs for a CUDA job, and its node agent), and describes it: each
cell's node, address and GPU ids, then per rank its device, its collective
backend and the environment its agent would start it with
(``CUDA_VISIBLE_DEVICES``, ``LOCAL_RANK``, the socket interface), and per engine
its environment and SGLang arguments. The backend is NCCL where the node has
CUDA and gloo where it has none (a CUDA job there would stop at its ranks' device
check; the line says so).

A layout this build cannot run (``runtime.layout.GpuLayout.runnable_problem``) is
not placed: its plan (``runtime.layout.plan_lines``) is all there is.

Invariants: no rank, engine, control store or proxy starts; every placement
group and agent it made is released before it returns, also when placing fails
(``PlacementError``, naming what the cluster lacks).
"""

from __future__ import annotations

from typing import Any


def placed_plan_lines(job: Any) -> list[str]:
    from gyre.real.cluster.placement import Placement
    from gyre.real.runtime.job_parts import JobParts

    parts = JobParts(job, lambda line: None)  # only its plan: cells, engine names and layout; starts nothing
    tp, layout = job.cell_tp(), parts.layout
    if layout is not None and layout.runnable_problem():
        return [f"not placed on the cluster: {layout.runnable_problem()}"]
    placement = Placement(job.cluster)
    try:
        placement.open(cells=parts.cfg.K, tp=tp, engines=dict(parts.names.items()),
                       gpus=layout.gpus_per_cell if layout is not None else 0)
        lines = placement.describe_lines()
        for cell, env in placement.environments(tp).items():
            lines += _cell_lines(cell, env, layout, parts.names.get(cell))
    finally:
        placement.close()
    return lines


def _cell_lines(cell: int, env: dict[str, Any], layout: Any, engine: str | None) -> list[str]:
    if layout is None:
        backend = "gloo"
    else:
        backend = "nccl" if env["cuda"] else "gloo (no CUDA on this node: a CUDA run stops at its ranks' device check)"
    lines = []
    for rank, rank_env in enumerate(env["ranks"]):
        device = f"cuda:{rank}" if layout is not None else "cpu"  # train.context.CellConfig.local_gpu, placed
        lines.append(f"cell {cell} rank {rank}: {device}, {backend}; env {_shown(rank_env)}")
    if engine is not None:
        args = " ".join(layout.engine_args(cell, placed=True)) if layout is not None else "(CPU engine)"
        lines.append(f"cell {cell} engine {engine}: env {_shown(env['engine'])}; sglang {args}")
    return lines


def _shown(env: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(env.items())) or "(the node's own)"
