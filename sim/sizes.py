"""Times from sizes: training work from trained tokens and FLOPs, publication from parameter bytes.

Formulas (the constants are ``CostModel`` fields, see ``costs.py``):

* trained tokens of an execution: the tokens of its first ``j_max``
  trajectories in admission order (``traces.trajectories``; the trace
  column ``trajectory_tokens``). Only executions whose designated outcome
  trains count (docs/trajectories.md#evaluation-and-outcomes): completed and harness-timed-out ones; an
  excluded one (overall timeout) trains nothing, a failed one only a
  reward-0 placeholder (counted as 0 tokens). A trace without the column
  trains each execution's whole ``input_tokens + output_tokens`` whatever
  ``j_max`` is; a trace without token columns trains
  ``FALLBACK_EXECUTION_TOKENS`` per execution;
* FLOPs per trained token ``6 x active parameters`` (forward 2, backward
  4 FLOPs per parameter and token: Kaplan et al. 2020, "Scaling Laws for
  Neural Language Models", section 2.1, with the MoE reading that only the
  active parameters are touched per token); attention and packing
  overheads are not modelled separately: they are in ``train_utilisation``;
* training work of a group in node-seconds: ``trained tokens x FLOPs per
  token / (node_peak_tflops x 1e12 x train_utilisation)``; a cell of n
  nodes runs it in work / n seconds;
* publication: ``publish_s + params x bytes_per_param /
  (publishing nodes x publish_node_gbps x 1e9)``, the publishing pool
  being the core's transition unit (the whole colocated block when it
  switches as one unit; the static training cells of a split);
* sandbox start-up: every execution holds its rollout slot
  ``sandbox_start_s`` longer than its trace duration (each execution runs
  in a fresh sandbox, docs/README.md#vocabulary), so the redispatch after a publication pays
  it before the next groups' executions do any work. It is added to the
  execution's harness time at the execution's model-call share (an
  approximation: start-up is no model call, but 30 s is under 0.5 % of a
  1.9 h execution, and a per-row share would give every execution its own
  virtual clock, ``gyre.sim.engines``).

Model presets (``MODELS``; docs/workload.md#workload-profile names the models, not their shapes):
``122b``: Qwen 3.6 122B, a mixture of experts with 10B active parameters
(ours: the shape of the published Qwen3.5-122B-A10B); ``2.4t``: Qwen 3.8
2.4T with 100B active (ours: ~4 % active, the ratio of the published
Qwen3.5-397B-A17B). Both in bf16 (2 bytes per parameter).

Invariants: training work is linear in trained tokens and in active
parameters and inverse in throughput x utilisation; publication time is
affine in parameter bytes and inverse in the publishing pool's nodes;
``bind`` is idempotent (binding a bound model binds its base again).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from gyre.config import SchedulerConfig
from gyre.formats.trace import HARNESS_COLUMN, Outcome, Trace

if TYPE_CHECKING:
    from gyre.sim.costs import CostModel

FLOPS_PER_PARAM_TOKEN = 6.0  # forward + backward, Kaplan et al. 2020
# ours: ~1M tokens (docs/workload.md#workload-profile) x the J_max = 5 share (docs/workload.md#training-cost-and-slack)
FALLBACK_EXECUTION_TOKENS = 748_000.0
TRAINS = (Outcome.COMPLETED.value, Outcome.HARNESS_TIMEOUT.value)


@dataclass(frozen=True)
class ModelSpec:
    """A model description: total and active parameters (billions) and bytes per parameter."""

    params_b: float
    active_params_b: float
    bytes_per_param: float = 2.0

    def fields(self) -> dict[str, float]:
        return dataclasses.asdict(self)


MODELS: dict[str, ModelSpec] = {
    "122b": ModelSpec(params_b=122.0, active_params_b=10.0),
    "2.4t": ModelSpec(params_b=2400.0, active_params_b=100.0),
}
WORKLOAD_MODELS = {"nl2repo-122b": "122b", "nl2repo-2.4t": "2.4t", "deepswe": "122b", "terminalbench": "122b"}


def flops_per_token(costs: CostModel) -> float:
    return FLOPS_PER_PARAM_TOKEN * costs.active_params_b * 1e9


def train_rate(costs: CostModel) -> tuple[float, float]:
    """(FLOPs per trained token, a node's training FLOP/s): ``train_node_s`` is ``tokens * [0] / [1]``."""
    return flops_per_token(costs), costs.node_peak_tflops * 1e12 * costs.train_utilisation


def train_node_s(costs: CostModel, tokens: float) -> float:
    """Node-seconds of forward-backward work for ``tokens`` trained tokens."""
    per_token, per_node_s = train_rate(costs)
    return tokens * per_token / per_node_s


def publishing_nodes(cfg: SchedulerConfig) -> int:
    cells = len(cfg.core_unit) if not cfg.static else cfg.static_train_cells
    return max(1, cells) * cfg.nodes_per_cell


def publication_s(costs: CostModel, nodes: int) -> float:
    """Seconds to publish the parameters from a pool of ``nodes`` nodes."""
    if nodes < 1:
        raise ValueError(f"a publishing pool needs >= 1 node, got {nodes}")
    size = costs.params_b * 1e9 * costs.bytes_per_param
    return costs.publish_s + size / (nodes * costs.publish_node_gbps * 1e9)


def trained_tokens(trace: Trace | None, j_max: int) -> np.ndarray | None:
    """(queries, N) trained tokens per execution (see the module docstring), or None without a trace."""
    if trace is None:
        return None
    trains = np.isin(trace.outcomes, TRAINS)
    kept = trace.kept_tokens(j_max)
    if kept is None:
        inp, out = trace.column("input_tokens"), trace.column("output_tokens")
        if inp is None and out is None:
            kept = np.full(trace.durations_s.shape, FALLBACK_EXECUTION_TOKENS)
        else:
            kept = (0 if inp is None else inp) + (0 if out is None else out)
    return np.where(trains, kept, 0).astype(float)


@lru_cache(maxsize=8)
def _shared_trained_tokens(trace: Trace | None, j_max: int) -> np.ndarray | None:
    """``trained_tokens``, computed once per (trace, j_max) and shared read-only: a Trace is never modified
    and a sweep binds hundreds of schedules to one (~0.5 ms a schedule, recomputed in each before)."""
    grid = trained_tokens(trace, j_max)
    if grid is not None:
        grid.flags.writeable = False
    return grid


@dataclass(frozen=True, eq=False)
class BoundCosts:
    """A CostModel bound to one schedule and trace: the times that depend on sizes.

    Every CostModel attribute reads through; ``publish_s`` is the whole
    publication time on this schedule's publishing pool, ``trace`` carries
    the sandbox start-up in its durations, ``group_work_node_s(g)`` is
    group g's training work and ``execution_tokens(g)`` its executions' trained tokens.
    """

    base: CostModel
    cfg: SchedulerConfig
    trace: Trace | None

    def __getattr__(self, name: str) -> Any:
        if name == "base":  # not yet set (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.base, name)

    @property
    def publish_s(self) -> float:
        return publication_s(self.base, publishing_nodes(self.cfg))

    @cached_property
    def _execution_tokens(self) -> np.ndarray | None:
        return _shared_trained_tokens(self.trace, self.base.j_max)

    @cached_property
    def _group_tokens(self) -> np.ndarray | None:
        grid = self._execution_tokens
        return None if grid is None else grid.sum(axis=1)

    def execution_tokens(self, g: int) -> list[float]:
        """Trained tokens of each of group g's N executions (0: it trains nothing)."""
        grid = self._execution_tokens
        if grid is None:
            return [FALLBACK_EXECUTION_TOKENS] * self.cfg.N
        return grid[g % grid.shape[0]].tolist()

    def group_tokens(self, g: int) -> float:
        tokens = self._group_tokens
        return FALLBACK_EXECUTION_TOKENS * self.cfg.N if tokens is None else float(tokens[g % tokens.size])

    def group_work_node_s(self, g: int) -> float:
        return train_node_s(self.base, self.group_tokens(g))

    def bind(self, cfg: SchedulerConfig, trace: Trace | None = None) -> BoundCosts:
        return bind(self.base, cfg, trace)


_SHIFTED: dict[tuple[int, float], tuple[Trace, Trace]] = {}  # (id(trace), seconds) -> (trace, shifted trace)
SHIFTED_CACHE = 4


def with_sandbox_start(trace: Trace, seconds: float) -> Trace:
    """The trace with every duration ``seconds`` longer (see the module docstring).

    A Trace is never modified, so the last few shifted traces are kept: a sweep
    runs hundreds of schedules on one trace, and building and validating the
    shifted copy each time was ~4% of a schedule's CPU time. The cache holds the
    original too, so its ``id`` cannot be reused while the entry lives."""
    if seconds == 0:
        return trace
    hit = _SHIFTED.get((id(trace), seconds))
    if hit is not None and hit[0] is trace:
        return hit[1]
    shifted = _shifted(trace, seconds)
    if len(_SHIFTED) >= SHIFTED_CACHE:
        _SHIFTED.pop(next(iter(_SHIFTED)))
    _SHIFTED[(id(trace), seconds)] = (trace, shifted)
    return shifted


def _shifted(trace: Trace, seconds: float) -> Trace:
    columns = trace.column_arrays()
    changed = {"duration_s": columns["duration_s"] + seconds}
    if HARNESS_COLUMN in columns:  # the sandbox starts before the harness
        changed[HARNESS_COLUMN] = columns[HARNESS_COLUMN] + seconds
    return trace.with_columns(**changed)


def bind(costs: CostModel, cfg: SchedulerConfig, trace: Trace | None = None) -> BoundCosts:
    if isinstance(costs, BoundCosts):
        return costs.bind(cfg, trace)
    return BoundCosts(costs, cfg, None if trace is None else with_sandbox_start(trace, costs.sandbox_start_s))


def for_workload(costs: CostModel, workload: str) -> CostModel:
    """Model-description fields still at their defaults take the workload's model (``WORKLOAD_MODELS``)."""
    model = MODELS[WORKLOAD_MODELS.get(workload, "122b")]
    defaults = MODELS["122b"].fields()  # the CostModel defaults
    changes: dict[str, Any] = {k: v for k, v in model.fields().items() if getattr(costs, k) == defaults[k]}
    return dataclasses.replace(costs, **changes)
