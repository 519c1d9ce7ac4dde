"""The scheduler's decision rules as tiny pure functions (docs/scheduler.md).

Each function reads like its equation; the state machine in ``scheduler.py``
only gathers the numbers and calls these. Nothing here holds state.
"""

from __future__ import annotations

from gyre.config import SchedulerConfig


def rollout_capacity(cfg: SchedulerConfig, rollout_cells: int) -> int:
    """C_R = C_s + (K - k) * C_e, with ``rollout_cells`` = K - k serving rollout."""
    return cfg.C_s + rollout_cells * cfg.C_e


def startable(queued: int, holding: int, capacity: int) -> int:
    """Executions to start now: min(d - p, C_R - holding), never negative.

    docs/scheduler.md#counters writes C_R - (p - f); ``holding`` is the executions that hold a
    rollout slot, i.e. p - f less those whose harness has stopped (their
    evaluation holds no rollout capacity; see ``scheduler.py``).
    """
    return max(0, min(queued, capacity - holding))


def waterlevel_allows(cfg: SchedulerConfig, waterlevel: int, capacity: int, unit_capacity: int) -> bool:
    """Eq. 2: w <= C_R - C_unit; the global (Colocate) unit also needs w == 0."""
    if cfg.granularity == "global" and waterlevel > 0:
        return False
    return waterlevel <= capacity - unit_capacity


def supply(ready_unclaimed: int, batch_need: int) -> int:
    """Ready, unclaimed groups capped at what the current batch still needs."""
    return max(0, min(ready_unclaimed, batch_need))


def supply_sufficient(cfg: SchedulerConfig, available: int) -> bool:
    """The supply check's level: at least rho_min * B groups."""
    return available >= cfg.rho_min * cfg.B - 1e-9


def timer_elapsed(cfg: SchedulerConfig, since: float | None, now: float) -> bool:
    """The supply level has held continuously for tau seconds."""
    return since is not None and now - since >= cfg.tau - 1e-9


def core_stays_in_training(cfg: SchedulerConfig, waterlevel: int, ready_unclaimed: int) -> bool:
    """End of burst (3.4): next batch has rho_min*B ready groups AND Eq. 3.

    Eq. 3: w + mu * N * B <= C_s + (K - |core unit|) * C_e, i.e. outstanding
    work plus the executions about to be dispatched fit without the core unit.
    """
    if not supply_sufficient(cfg, supply(ready_unclaimed, cfg.B)):
        return False
    incoming = cfg.mu * cfg.group_size * cfg.B
    return waterlevel + incoming <= cfg.C_s + (cfg.K - len(cfg.core_unit)) * cfg.C_e
