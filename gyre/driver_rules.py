"""What both drivers (``sim/`` and ``real/``) decide the same way, as pure functions.

The policy core decides *what* happens; a driver decides a few things on its
own while carrying the core's actions out. Where the simulator and the real
backend must agree, the rule lives here, once:

- ``is_satellite(cfg, cell)``: a cell that can join training outside the core
  unit; a static split has none (its training cells never switch). A satellite pulls the core's weights when
  it joins, holds its seat until the core has acted on its TransitionDone,
  is sent new parameters after every non-final update (``Broadcast``) and
  returns to rollout at its burst's end.
- ``asks_for_group(...)``: the streaming packing buffer's ask. With no ask
  outstanding, while the open batch has fewer than B groups fed and fewer
  micro-steps are queued (emitted, unclaimed) than cells are training, the
  buffer asks the core for one more group (``GroupWanted``).
- ``breakdown_category(...)``: the time-breakdown category of one instant;
  the first that holds, in the order of ``CATEGORIES``.

Invariants: pure functions of their arguments (no clock, no I/O, no state);
``breakdown_category`` always returns a member of ``CATEGORIES``; a static
cell and a core-unit cell are never satellites.
"""

from __future__ import annotations

from gyre.config import SchedulerConfig

CATEGORIES = ("rollout_full", "rollout_tail", "training_exposed", "publication", "transitions", "waiting")


def is_satellite(cfg: SchedulerConfig, cell: int) -> bool:
    """A cell that can switch into training outside the core unit (never in a static split)."""
    return not cfg.static and cell not in cfg.core_unit


def asks_for_group(*, asked: int, fed: int, batch_size: int, queued: int, training_cells: int) -> bool:
    """One group at a time (``asked`` outstanding asks), while the batch needs groups and its queue
    holds fewer micro-steps than cells train (at least one, so a batch with no member still asks)."""
    return asked == 0 and fed < batch_size and queued < max(1, training_cells)


def breakdown_category(*, running: float, capacity: float, training: bool, publishing: bool,
                       switching: bool) -> str:
    """The category of an instant: ``running`` executions hold rollout slots out of ``capacity``
    (C_R, the separate pool included); a training step, a publication, a role switch in progress."""
    if running > 0:
        return "rollout_full" if running >= capacity - 1e-9 else "rollout_tail"
    if training:
        return "training_exposed"
    if publishing:
        return "publication"
    if switching:
        return "transitions"
    return "waiting"
