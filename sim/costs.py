"""Every cost constant of the simulated cluster, in one documented dataclass.

Times are seconds. Defaults and where they come from:
- ``to_training_s`` 8.52 and ``to_rollout_s`` 3.46: the paper's measured mean
  role-transition costs (docs/scheduler.md#role-transitions).
- ``satellite_to_training_s`` / ``satellite_to_rollout_s``: a satellite's own
  transition costs where they differ from the core unit's (the core enters
  training with the optimizer state and leaves it after exporting the
  publication; a satellite holds weights only). ``None`` (the default, and
  docs/scheduler.md#role-transitions gives one figure) means the same as ``to_training_s`` /
  ``to_rollout_s``; ``gyre calibrate`` measures both from a real run.
- Training follows the tokens a group trains (``gyre.sim.sizes`` states the
  formulas): each execution's first ``j_max`` trajectories (docs/trajectories.md#admission,
  default 5) at ``6 x active_params_b`` FLOPs per token, on nodes of
  ``node_peak_tflops`` (7912: 8 GPUs x 989 dense bf16 TFLOP/s, an H100/H200
  node; ours, the paper names no GPU) at ``train_utilisation``. A group's
  trainable executions become micro-steps by the real packer's rule
  (``gyre.driver_rules.pack_micro_steps``): an execution is never split, and
  executions are packed under ``micro_step_tokens`` (the packer's token budget,
  default 4096: the real job's ``token_budget``, ``gyre.real.runtime.job``), so
  an execution larger than the budget is a micro-step of its own; a cell of n
  nodes runs a micro-step in its work / n seconds. ``train_utilisation`` (0.25, ours) is the
  share of peak the forward-backward reaches on the 6 x active FLOPs: no
  figure of the paper pins it, so it is derived, not fitted
  (docs/simulator.md section 4): Megatron-Core reports 468 TFLOP/s per H100
  (47 % of 989) for Mixtral 8x7B bf16 pre-training, the upper end for an
  MoE; RL training on packed variable-length agent trajectories runs well
  below pre-training (NeMo-RL issue 985 opens on that gap for MoE GRPO), and
  attention over long trajectories adds FLOPs that 6 x active leaves out;
  we take about half the pre-training figure, 0.25, with a stated range of
  0.15-0.40 (``gyre sensitivity``). It is no longer fitted to E0's idle
  share (20.85 % was a gloss on the paper's "slack", and an idle share moves
  by ~10 points with rho_min and tau alone); the summary reports the idle
  share beside the per-burst exposure and hiding margin
  (``gyre.sim.exposure``) so the mechanisms can be checked together
  (tests/sim/test_training_mechanisms.py).
- Model description: ``params_b`` / ``active_params_b`` (billions) and
  ``bytes_per_param``; defaults are the 122B preset, and the runner swaps in
  the workload's preset (``sizes.MODELS``: 122B-A10B, 2.4T-A100B, bf16) for
  every model field left at its default.
- ``warmup_s``/``drain_s``: one pipeline warm-up and one drain per cell per
  batch (docs/streaming.md#dynamic-membership); 20 s each is an assumption.
- ``grad_reduce_s`` + ``optimizer_s``: gradient reduction and the one optimizer
  update per step; ``broadcast_s``: new parameters to current satellites after
  a non-final update; ``weight_pull_s``: a joining satellite's Mooncake pull.
  Assumptions of the same order as the transition costs.
- Publication to the rollout engines after a burst: ``publish_s`` (a fixed
  latency: engines pause, reload, flush their KV cache; 30 s, ours) plus
  parameter bytes / (publishing nodes x ``publish_node_gbps``), 25 GB/s per
  node (ours: a fraction of a node's RDMA bandwidth, resharding included),
  plus ``publish_engine_s`` per rollout engine that loads the weights (the
  cells in rollout and the separate pool's engine at the Publish): 0 by
  default (ours: engines load in parallel inside ``publish_s``); ``gyre
  calibrate`` measures it where a run's publications reach different
  numbers of engines (docs/simulator.md section 7).
- ``sandbox_start_s``: every execution starts in a fresh sandbox and holds
  its slot that much longer, so the redispatch after a publication pays it
  (30 s, ours: a cached image and a checkout).
- ``evaluation_s``: delay between a group's last execution closing and its
  rewards being valid (0: scoring is folded into the trace durations).
- Rollout engines share their throughput (``gyre.sim.engines``, processor
  sharing): an execution's trace duration is its work at the reference load
  ``engine_reference_load`` x capacity (default 1.0: the traces were recorded
  on full engines), and each execution on an engine of load L and capacity C
  progresses at ``(1 + a*x_ref) / (1 + a*x)``, ``x = (L-1)/(C-1)``,
  re-evaluated at every start, finish, cancel and reroute on that engine.
  ``engine_load_alpha`` (a) defaults to the fit of SGLang's CPU engine
  measured here (``gyre.sim.engines.MEASURED``, bench/bench_engine_concurrency.py):
  per-request decode tokens/s 389, 344, 294, 225, 164 at concurrency 1, 2,
  4, 8, 16 (aggregate 388 -> 2544) on a tiny Qwen2, fitted a = 1.42: a full
  engine serves each request 2.4x slower than a lone one. Mapping the CPU
  engine's 16 slots onto a cell's C_e slots (same x) is an assumption of ours.
  ``engine_load_alpha=0`` gives load-independent engines (every execution
  takes exactly its trace duration).
- ``slowdown_per_load`` (a duration scaled once at start) is gone: a config
  that sets it gets a ``CostError`` naming ``engine_load_alpha`` instead.
- Optional (off by default): ``reroute_recompute_s`` is the prefix recompute
  a rerouted execution pays when KV migration is off, added to its remaining
  work on the destination engine.

Invariant: every field is a finite number >= 0 (the satellite transition
costs may also be ``None``; ``micro_step_tokens`` and
``j_max`` integers >= 1; model sizes, throughput, utilisation and bandwidth
> 0; ``train_utilisation`` <= 1; ``active_params_b`` <= ``params_b``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from gyre.sim.engines import DEFAULT_ALPHA as ENGINE_LOAD_ALPHA
from gyre.sim.engines import EngineCurve

TRAIN_UTILISATION = 0.25  # ours: derived from stated MFU figures, see the module docstring
REMOVED = {"micro_steps_per_group": "micro_steps_per_group was removed: a group's micro-steps follow the real "
           "packer's rule (one per trainable execution unless small ones pack together); set micro_step_tokens "
           "(the packer's token budget) instead",
           "micro_step_node_s": "micro_step_node_s was removed: training work follows trained tokens; set "
           "active_params_b, node_peak_tflops, train_utilisation or j_max instead (see gyre.sim.sizes)",
           "slowdown_per_load": "slowdown_per_load was removed: engines now share their throughput by "
           "processor sharing; set engine_load_alpha (0 = load-independent) and engine_reference_load instead"}


OPTIONAL = ("satellite_to_training_s", "satellite_to_rollout_s")  # None: the core unit's value


class CostError(ValueError):
    """An impossible cost constant; the message names the field."""


@dataclass(frozen=True, kw_only=True)
class CostModel:
    to_training_s: float = 8.52
    to_rollout_s: float = 3.46
    satellite_to_training_s: float | None = None
    satellite_to_rollout_s: float | None = None
    micro_step_tokens: int = 4096
    j_max: int = 5
    params_b: float = 122.0
    active_params_b: float = 10.0
    bytes_per_param: float = 2.0
    node_peak_tflops: float = 7912.0
    train_utilisation: float = TRAIN_UTILISATION
    publish_node_gbps: float = 25.0
    sandbox_start_s: float = 30.0
    warmup_s: float = 20.0
    drain_s: float = 20.0
    grad_reduce_s: float = 5.0
    optimizer_s: float = 10.0
    broadcast_s: float = 15.0
    publish_s: float = 30.0
    publish_engine_s: float = 0.0
    weight_pull_s: float = 10.0
    evaluation_s: float = 0.0
    engine_load_alpha: float = ENGINE_LOAD_ALPHA
    engine_reference_load: float = 1.0
    reroute_recompute_s: float = 0.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in OPTIONAL:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise CostError(f"{f.name} must be a finite number, got {value!r}")
            if value < 0:
                raise CostError(f"{f.name} must be >= 0, got {value}")
        for name in ("micro_step_tokens", "j_max"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise CostError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        for name in ("params_b", "active_params_b", "bytes_per_param", "node_peak_tflops", "train_utilisation",
                     "publish_node_gbps"):
            if getattr(self, name) <= 0:
                raise CostError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.train_utilisation > 1:
            raise CostError(f"train_utilisation must be <= 1 (a share of peak), got {self.train_utilisation}")
        if self.active_params_b > self.params_b:
            raise CostError(f"active_params_b ({self.active_params_b}) cannot exceed params_b ({self.params_b})")
        if self.engine_reference_load <= 0:
            raise CostError(f"engine_reference_load must be > 0 (a fraction of engine capacity), "
                            f"got {self.engine_reference_load}")

    def transition_s(self, role: str, satellite: bool) -> float:
        """Seconds a cell's transition into ``role`` ("training" or "rollout") costs, by the cell's kind."""
        own = self.satellite_to_training_s if role == "training" else self.satellite_to_rollout_s
        if satellite and own is not None:
            return own
        return self.to_training_s if role == "training" else self.to_rollout_s

    def engine_curve(self) -> EngineCurve:
        """The per-engine processor-sharing curve these constants describe."""
        return EngineCurve(self.engine_load_alpha, self.engine_reference_load)

    def train_node_s(self, tokens: float) -> float:
        """Node-seconds of forward-backward work for ``tokens`` trained tokens (``gyre.sim.sizes``)."""
        from gyre.sim.sizes import train_node_s

        return train_node_s(self, tokens)

    def bind(self, cfg: Any, trace: Any = None) -> Any:
        """These constants on one schedule and trace (``gyre.sim.sizes.BoundCosts``): the size-driven times."""
        from gyre.sim.sizes import bind

        return bind(self, cfg, trace)


def parse_cost_overrides(pairs: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``key=value`` strings to typed CostModel fields; errors name the key."""
    fields = {f.name: f for f in dataclasses.fields(CostModel)}
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep:
            raise CostError(f"cost override {pair!r} is not key=value")
        if key in REMOVED:
            raise CostError(REMOVED[key])
        if key not in fields:
            raise CostError(f"unknown cost field {key!r}; known: {', '.join(fields)}")
        try:
            out[key] = int(raw) if isinstance(fields[key].default, int) else float(raw)
        except ValueError:
            raise CostError(f"{key}: cannot parse {raw!r} as a number") from None
    return out
