"""Run one simulation or a grid of them, and summarize the results.

``run_simulation`` resolves a schedule preset and a trace (a preset name, a
file, or a ``Trace``), runs the SimPy driver for ``steps`` steps and returns
a ``SimResult`` with the recorder and the summary dict. The summary's
``mean_step_hours`` is ``total_hours / steps`` (wall time per step, rollout
waits included); per-step training spans are in steps.csv. ``slack`` is the figure of
docs/workload.md#training-cost-and-slack, measured as ``slack_measure`` states; the size-driven costs
(trained tokens and training work per step, publication seconds, the model
description; ``gyre.sim.sizes``) are reported beside it. Cost-model fields
of the model description left at their defaults follow the trace's workload
(``sizes.WORKLOAD_MODELS``: the 2.4T model on nl2repo-2.4t).

``breakdown=False`` (what sweeps use) leaves out the wall-clock breakdown,
node-hours and busy shares, about 7% of a run's CPU time; everything else,
the slack included, is unchanged.

Invariants: same arguments and seed give identical summaries (except
``wall_seconds``) and identical tables; the trace's group size must equal the
schedule's N (a clear error otherwise).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, cast

import numpy as np

from gyre.actions import SEPARATE
from gyre.config import SchedulerConfig
from gyre.formats.trace import Trace, load_trace
from gyre.formats.trace_meta import read_trace_meta
from gyre.presets import PAPER_SHAPE, WORKLOAD_SHAPES, build_preset
from gyre.sim.breakdown import role_node_seconds, rollout_busy_share, time_breakdown
from gyre.sim.costs import CostModel
from gyre.sim.driver import Simulation, cyclic_gc_paused
from gyre.sim.exposure import burst_exposure, exposure_summary
from gyre.sim.realized import realized_profile
from gyre.sim.record import SimRecord, write_tables
from gyre.sim.sizes import for_workload
from gyre.sim.switch_waits import switch_summary, switch_waits
from gyre.sim.traces.presets import PRESETS as TRACE_PRESETS
from gyre.sim.traces.presets import generate_trace
from gyre.staleness import steady_window

DEFAULT_PRESET = "E0"
DEFAULT_TRACE = "nl2repo-122b"
TRACE_QUERIES = 400
SLACK_MEASURE = ("idle share of training-role node time: 1 - busy node-s (micro-steps, warm-ups, drains, "
                 "updates) / node-s in the training role")


@dataclass
class SimResult:
    cfg: SchedulerConfig
    summary: dict[str, Any]
    record: SimRecord

    def write(self, out: str | Path) -> Path:
        out = Path(out)
        write_tables(self.record, out, self.summary)
        return out


def resolve_trace(trace: str | Path | Trace, seed: int, N: int | None = None) -> tuple[Trace, str]:
    """A Trace and its display name from a preset name, a CSV/Parquet path, or a Trace."""
    if isinstance(trace, Trace):
        return trace, trace.source
    if str(trace) in TRACE_PRESETS:
        return _preset_trace(str(trace), seed, N or 16), str(trace)
    return load_trace(trace, N=N), str(trace)


@functools.lru_cache(maxsize=4)
def _preset_trace(name: str, seed: int, N: int) -> Trace:
    """A preset trace is a pure function of (name, seed, N) and a Trace is never modified, so a process
    (a sweep worker runs hundreds of schedules on one seed) generates each once."""
    return generate_trace(name, TRACE_QUERIES, np.random.default_rng(seed), N=N)


def run_simulation(preset: str | None = None, trace: str | Path | Trace = DEFAULT_TRACE, *, steps: int = 12,
                   seed: int = 0, overrides: dict[str, Any] | None = None, costs: CostModel | None = None,
                   on_step: Callable[[int], None] | None = None, breakdown: bool = True) -> SimResult:
    """Simulate ``preset`` (default: the trace's recorded preset, else E0) on ``trace``.

    A trace file with a sidecar (``gyre.formats.trace_meta``) brings its cluster
    shape and schedule overrides: the recorded schedule, or another preset
    scaled to the same cluster.
    """
    preset, cfg, resolved, trace_name, costs, meta = _schedule(preset, trace, seed, overrides, costs)
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    t0 = time.perf_counter()
    with cyclic_gc_paused():  # building, running and summarizing a run frees nothing cyclic (driver.py)
        sim = Simulation(cfg, resolved, costs, steps, on_step=on_step)
        record = sim.run()
        wall = time.perf_counter() - t0
        summary = summarize(cfg, record, preset, trace_name, steps, seed, wall)
    summary["units"] = "s" if meta is not None else "h"  # a real run's trace: report in its own seconds
    summary["total_s"], summary["mean_step_s"] = round(record.end_s, 6), round(record.end_s / steps, 6)
    if breakdown:
        summary.update(where_the_time_goes(cfg, record, sim.plane.busy_node_s))
        summary["realized_profile"] = realized_profile(record, cfg.group_size, cfg.N,
                                                       float(sim.trace.durations_s.max()))
        bursts = burst_exposure(record, sim.costs, cfg.nodes_per_cell)
        summary["training_exposure"] = {**exposure_summary(bursts), "per_burst": bursts}
        waits = switch_waits(record)
        summary["switch_waits"] = {**switch_summary(waits), "per_switch": waits}
    else:  # a sweep reads only the slack: skip the wall-clock breakdown (~7% of a run's CPU time)
        summary["slack"] = slack(cfg, record, sim.plane.busy_node_s)
    summary.update(training_costs(sim.costs, sim.plane.work_node_s, steps))
    # A finished driver is a reference cycle (its handlers point back at it). The record leaves it here,
    # so when the caller drops the result, reference counting frees the record and its events at once
    # instead of a collector pass over them (a sweep worker collects after each run: ``sim.workers``).
    del sim.record, sim.loop.log
    return SimResult(cfg, summary, record)


def _schedule(preset: str | None, trace: str | Path | Trace, seed: int, overrides: dict[str, Any] | None,
              costs: CostModel | None) -> tuple[str, SchedulerConfig, Trace, str, CostModel, Any]:
    """(preset, config, trace, trace name, costs, the trace's sidecar or None) of ``run_simulation``'s arguments."""
    meta = read_trace_meta(trace) if not isinstance(trace, Trace) and str(trace) not in TRACE_PRESETS else None
    if meta is not None:
        shape, recorded = meta.shape, dict(meta.schedule) if preset in (None, meta.preset) else {}
        preset = preset or meta.preset
    else:
        shape = WORKLOAD_SHAPES.get(str(trace), PAPER_SHAPE) if not isinstance(trace, Trace) else PAPER_SHAPE
        recorded, preset = {}, preset or DEFAULT_PRESET
    cfg = build_preset(preset, shape, **{**recorded, **(overrides or {})})
    resolved, trace_name = resolve_trace(trace, seed, N=cfg.N)
    return preset, cfg, resolved, trace_name, for_workload(costs or CostModel(), trace_name), meta


def warm_caches(preset: str | None, trace: str | Path | Trace, *, steps: int, seed: int,
                overrides: dict[str, Any] | None = None) -> None:
    """Build what a run of this schedule caches (its generated trace, that trace shifted by the sandbox
    start, the driver's lists and execution plan: pure functions of their inputs) without simulating.
    A sweep's parent does so before its workers fork, so they inherit them instead of each building them."""
    _, cfg, resolved, _, costs, _ = _schedule(preset, trace, seed, overrides, None)
    Simulation(cfg, resolved, costs, steps)


def training_costs(costs: Any, work_node_s: float, steps: int) -> dict[str, Any]:
    """The size-driven costs of the run (``gyre.sim.sizes``): model, J_max, work per step, publication."""
    return {
        "slack_measure": SLACK_MEASURE,
        "model": {"params_b": costs.params_b, "active_params_b": costs.active_params_b, "j_max": costs.j_max,
                  "train_utilisation": costs.train_utilisation},
        "training_work_node_hours_per_step": round(work_node_s / 3600 / steps, 6),
        "trained_tokens_per_step": round(work_node_s / costs.train_node_s(1.0) / steps),
        "publication_s": round(costs.publish_s, 3),
    }


def where_the_time_goes(cfg: SchedulerConfig, record: SimRecord, training_busy_node_s: float) -> dict[str, Any]:
    """The wall-clock breakdown, node-hours per role with busy shares, and the slack (``sim.breakdown``)."""
    roles = [(r["cell"], r["role"], r["start_s"], r["end_s"]) for r in record.roles]
    execs = list(record.executions.values())
    slots = {x: record.slot_interval(x) for x in record.executions}  # a stopped harness frees its slot
    seconds = time_breakdown(end_s=record.end_s, executions=list(slots.values()),
                             roles=roles, steps=[(s["start_s"], s["end_s"]) for s in record.steps.values()],
                             publications=[cast("tuple[float, float | None]", tuple(p)) for p in record.publications],
                             C_e=cfg.C_e, C_s=cfg.C_s)
    node_s = role_node_seconds(roles, cfg.nodes_per_cell)
    on_cells = [slots[x["execution"]] for x in execs if x["engine"] != SEPARATE]
    rollout_busy = rollout_busy_share(end_s=record.end_s, executions_on_cells=on_cells, roles=roles, C_e=cfg.C_e)
    training_busy = training_busy_node_s / node_s["training"] if node_s["training"] > 0 else None
    return {
        "time_breakdown_hours": {k: round(v / 3600, 6) for k, v in seconds.items()},
        "role_node_hours": {k: round(v / 3600, 6) for k, v in node_s.items()},
        "role_busy_share": {"rollout": None if rollout_busy != rollout_busy else round(rollout_busy, 6),
                            "training": None if training_busy is None else round(min(1.0, training_busy), 6),
                            "switching": 1.0},
        "slack": slack(cfg, record, training_busy_node_s),
    }


def slack(cfg: SchedulerConfig, record: SimRecord, training_busy_node_s: float) -> float | None:
    """The share of training node-time left idle (``where_the_time_goes``'s slack, alone)."""
    roles = [(r["cell"], r["role"], r["start_s"], r["end_s"]) for r in record.roles]
    training_node_s = role_node_seconds(roles, cfg.nodes_per_cell)["training"]
    if training_node_s <= 0:
        return None
    return round(max(0.0, 1.0 - min(1.0, training_busy_node_s / training_node_s)), 6)


def summarize(cfg: SchedulerConfig, record: SimRecord, preset: str, trace: str, steps: int, seed: int,
              wall: float) -> dict[str, Any]:
    consumed = record.consumed_groups(steps)
    staleness = np.array([row["staleness"] for row in consumed], dtype=float)
    tokens = np.array([row["tokens"] for row in consumed], dtype=float)
    total_s = record.end_s
    steady = _steady_mean(cfg, consumed, steps)
    return {
        "preset": preset, "trace": trace, "steps": steps, "seed": seed,
        "total_hours": round(total_s / 3600, 6),
        "mean_step_hours": round(total_s / 3600 / steps, 6),
        "staleness_mean": round(float(staleness.mean()), 6) if staleness.size else None,
        "staleness_token_weighted_mean": round(float(np.average(staleness, weights=tokens)), 6)
        if staleness.size and tokens.sum() > 0 else None,
        "staleness_max": int(staleness.max()) if staleness.size else None,
        "staleness_predicted": cfg.predicted_staleness,
        "staleness_steady_mean": steady[0],
        "steady_steps": steady[1],
        "groups_consumed": len(consumed),
        "transitions": record.log.action_counts.get("begin_transition", 0),
        "reroutes": record.log.action_counts.get("reroute", 0),
        "events": len(record.log),
        "wall_seconds": round(wall, 3),
        "config": {k: v for k, v in vars(cfg).items()},
    }


def _steady_mean(cfg: SchedulerConfig, consumed: list[dict[str, Any]], steps: int) -> tuple[float | None, str]:
    """Group mean staleness over whole bursts after the warm-up (None if the run is too short)."""
    try:
        first, stop = steady_window(cfg.phi, cfg.mu, steps)
    except ValueError:
        return None, ""
    window = [row["staleness"] for row in consumed if first <= row["v_t"] < stop]
    return (round(float(np.mean(window)), 6) if window else None), f"{first}..{stop - 1}"
