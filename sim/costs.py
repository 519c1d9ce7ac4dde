"""Every cost constant of the simulated cluster, in one documented dataclass.

Times are seconds. Defaults and where they come from:
- ``to_training_s`` 8.52 and ``to_rollout_s`` 3.46: the paper's measured mean
  role-transition costs (SPEC.md 3.5).
- Training: one group of N executions yields ``micro_steps_per_group``
  micro-steps of ``micro_step_node_s`` node-seconds each, so a cell of n nodes
  runs a micro-step in ``micro_step_node_s / n`` seconds. The default (4 x 225
  node-s per group) makes a B = 32 step on 32 nodes take 15 minutes of compute,
  a 122B-scale assumption of ours: SPEC.md gives no step time. Override it
  from measured numbers (``--cost micro_step_node_s=...``).
- ``warmup_s``/``drain_s``: one pipeline warm-up and one drain per cell per
  batch (SPEC.md 3.6); 20 s each is an assumption.
- ``grad_reduce_s`` + ``optimizer_s``: gradient reduction and the one optimizer
  update per step; ``broadcast_s``: new parameters to current satellites after
  a non-final update; ``publish_s``: weight publication to rollout engines
  after a burst; ``weight_pull_s``: a joining satellite's Mooncake pull.
  Assumptions of the same order as the transition costs.
- ``evaluation_s``: delay between a group's last execution closing and its
  rewards being valid (0: scoring is folded into the trace durations).
- Optional switches (off by default): ``slowdown_per_load`` scales an
  execution's duration by ``1 + slowdown_per_load * load/capacity`` of its
  engine at start (a concurrency-dependent latency model, outside the
  staleness identity's assumptions); ``reroute_recompute_s`` is the prefix
  recompute a rerouted execution pays when KV migration is off.

Invariant: every field is a finite number >= 0 (``micro_steps_per_group`` >= 1).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any


class CostError(ValueError):
    """An impossible cost constant; the message names the field."""


@dataclass(frozen=True, kw_only=True)
class CostModel:
    to_training_s: float = 8.52
    to_rollout_s: float = 3.46
    micro_steps_per_group: int = 4
    micro_step_node_s: float = 225.0
    warmup_s: float = 20.0
    drain_s: float = 20.0
    grad_reduce_s: float = 5.0
    optimizer_s: float = 10.0
    broadcast_s: float = 15.0
    publish_s: float = 30.0
    weight_pull_s: float = 10.0
    evaluation_s: float = 0.0
    slowdown_per_load: float = 0.0
    reroute_recompute_s: float = 0.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise CostError(f"{f.name} must be a finite number, got {value!r}")
            if value < 0:
                raise CostError(f"{f.name} must be >= 0, got {value}")
        if not isinstance(self.micro_steps_per_group, int) or self.micro_steps_per_group < 1:
            raise CostError(f"micro_steps_per_group must be an integer >= 1, got {self.micro_steps_per_group!r}")

    def micro_step_s(self, nodes: int) -> float:
        """Seconds for one micro-step on a cell of ``nodes`` nodes."""
        return self.micro_step_node_s / nodes


def parse_cost_overrides(pairs: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``key=value`` strings to typed CostModel fields; errors name the key."""
    fields = {f.name: f for f in dataclasses.fields(CostModel)}
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep:
            raise CostError(f"cost override {pair!r} is not key=value")
        if key not in fields:
            raise CostError(f"unknown cost field {key!r}; known: {', '.join(fields)}")
        try:
            out[key] = int(raw) if isinstance(fields[key].default, int) else float(raw)
        except ValueError:
            raise CostError(f"{key}: cannot parse {raw!r} as a number") from None
    return out
