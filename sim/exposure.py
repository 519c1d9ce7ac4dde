"""Per burst: how much training sits on the critical path, and the margin by which rollout hides it.

A burst is the run of steps up to a published one (the last step of a run
closes one too). For burst b, from the record and the bound costs
(docs/simulator.md section 4):

- ``train_s``: the burst's training work at its pool size: the node-seconds
  of the groups its steps consumed (``costs.group_work_node_s``: trained
  tokens x FLOPs per token / node throughput) over the nodes that trained
  (the most training cells any of its steps had, x ``nodes_per_cell``);
- ``last_ready_s``: when the last group its steps consumed became ready;
- ``exposed_s = end - max(last_ready, start)``: training that ran after
  rollout had delivered everything the burst needed, so nothing but
  training held the burst's end (and the publication after it);
- ``margin_s = last_ready - (start + train_s)``: with all its data at the
  start, the burst's training would end at ``start + train_s``; rollout
  delivered its last group ``margin_s`` later. Positive: rollout hides
  training with that much to spare (training could take that much longer
  before rollout stops hiding it); negative: training, not rollout, is
  the bottleneck. ``margin_share`` is ``margin_s / train_s``.

Invariants: ``exposed_s >= 0``; ``train_s > 0`` for a burst that consumed a
group; the figures are a pure function of the record and the costs.
"""

from __future__ import annotations

from typing import Any


def burst_exposure(record: Any, costs: Any, nodes_per_cell: int) -> list[dict[str, Any]]:
    """One row per burst: steps, start, end, last group ready, training seconds, exposure and margin."""
    groups_by_step: dict[int, list[dict[str, Any]]] = {}
    for row in record.groups.values():
        if row["consumed_step"] is not None:
            groups_by_step.setdefault(row["consumed_step"], []).append(row)
    rows: list[dict[str, Any]] = []
    burst: list[dict[str, Any]] = []
    finished = [s for _, s in sorted(record.steps.items()) if s["end_s"] is not None]
    for i, step in enumerate(finished):
        burst.append(step)
        if step["published"] or i == len(finished) - 1:
            rows.append(_one_burst(len(rows), burst, groups_by_step, costs, nodes_per_cell))
            burst = []
    return rows


def _one_burst(index: int, steps: list[dict[str, Any]], groups_by_step: dict[int, list[dict[str, Any]]],
               costs: Any, nodes_per_cell: int) -> dict[str, Any]:
    start, end = steps[0]["start_s"], steps[-1]["end_s"]
    consumed = [g for s in steps for g in groups_by_step.get(s["step"], [])]
    nodes = max(s["training_cells_max"] for s in steps) * nodes_per_cell
    work = sum(costs.group_work_node_s(g["group_id"]) for g in consumed)
    train_s = work / nodes if nodes else 0.0
    last_ready = max((g["ready_at_s"] for g in consumed if g["ready_at_s"] is not None), default=start)
    margin = last_ready - (start + train_s)
    return {"burst": index, "steps": f"{steps[0]['step']}..{steps[-1]['step']}", "start_s": round(start, 3),
            "end_s": round(end, 3), "training_nodes": nodes, "train_s": round(train_s, 3),
            "last_ready_s": round(last_ready, 3), "exposed_s": round(max(0.0, end - max(last_ready, start)), 3),
            "margin_s": round(margin, 3), "margin_share": round(margin / train_s, 6) if train_s > 0 else None}


def exposure_summary(bursts: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over bursts (the first burst, a warm-up, included), and the smallest margin."""
    if not bursts:
        return {"bursts": 0}
    shares = [b["margin_share"] for b in bursts if b["margin_share"] is not None]
    return {"bursts": len(bursts),
            "exposed_s_mean": round(sum(b["exposed_s"] for b in bursts) / len(bursts), 3),
            "exposed_s_max": max(b["exposed_s"] for b in bursts),
            "margin_s_mean": round(sum(b["margin_s"] for b in bursts) / len(bursts), 3),
            "margin_share_mean": round(sum(shares) / len(shares), 6) if shares else None,
            "margin_share_min": round(min(shares), 6) if shares else None}
