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
- ``pack_micro_steps(sizes, token_budget, ...)``: which trainable executions
  form a micro-step (docs/streaming.md#two-buffers). An execution is never split; executions
  are packed first-fit decreasing by tokens under the token budget (ties keep
  input order; one larger than the budget gets a micro-step of its own); a
  micro-step is emitted once it holds ``EMIT_FILL`` of the budget, or when the
  batch's last group flushes the rest. The real packer
  (``gyre.trajectory.packing``) packs its token rows by it and the simulator's
  plane (``gyre.sim.training``) the trace's trained tokens.

Invariants: pure functions of their arguments (no clock, no I/O, no state);
``breakdown_category`` always returns a member of ``CATEGORIES``; a static
cell and a core-unit cell are never satellites; ``pack_micro_steps`` places
every index exactly once (in an emitted micro-step or in the kept rest), a
flush keeps nothing, and an emitted micro-step of two or more executions
stays within the budget.
"""

from __future__ import annotations

from typing import Sequence

from gyre.config import SchedulerConfig

#: a micro-step is emitted before the batch's last group once it holds this share of the token budget
EMIT_FILL = 0.9
CATEGORIES = ("rollout_full", "rollout_tail", "training_exposed", "publication", "transitions", "waiting")


def is_satellite(cfg: SchedulerConfig, cell: int) -> bool:
    """A cell that can switch into training outside the core unit (never in a static split)."""
    return not cfg.static and cell not in cfg.core_unit


def asks_for_group(asked: int, fed: int, batch_size: int, queued: int, training_cells: int) -> bool:
    """One group at a time (``asked`` outstanding asks), while the batch needs groups and its queue
    holds fewer micro-steps than cells train (at least one, so a batch with no member still asks).

    Its arguments may be given by position (the simulator's plane asks once per micro-step's end)."""
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


def first_fit_decreasing(sizes: Sequence[float], budget: float) -> list[list[int]]:
    """Bins of indices into ``sizes``: first fit in decreasing size, ties in input order."""
    if not budget > 0:
        raise ValueError(f"token_budget must be positive, got {budget!r}")
    # decreasing size; a reverse sort is still stable, so ties stay in input order (no key tuple per item)
    order = sorted(range(len(sizes)), key=sizes.__getitem__, reverse=True)
    if len(order) < 2 or sizes[order[-1]] + sizes[order[-2]] > budget:
        return [[i] for i in order]  # no two fit together (the simulator's 122B executions): one bin each
    bins: list[list[int]] = []
    loads: list[float] = []
    for i in order:
        slot = next((b for b, load in enumerate(loads) if load + sizes[i] <= budget), None)
        if slot is None:
            bins.append([])
            loads.append(0.0)
            slot = len(bins) - 1
        bins[slot].append(i)
        loads[slot] += sizes[i]
    return bins


def pack_micro_steps(sizes: Sequence[float], token_budget: float, *, flush: bool,
                     emit_fill: float = EMIT_FILL) -> tuple[list[list[int]], list[int]]:
    """Pending executions' token counts -> (micro-steps emitted now, indices kept pending, in bin order).

    ``flush`` (the batch's last group is in) emits every bin; otherwise a bin is emitted once
    its tokens reach ``emit_fill`` x ``token_budget``."""
    if not 0 < emit_fill <= 1:
        raise ValueError(f"emit_fill must be in (0, 1], got {emit_fill!r}")
    emitted: list[list[int]] = []
    kept: list[int] = []
    threshold = emit_fill * token_budget
    for bin_ in first_fit_decreasing(sizes, token_budget):
        # a lone execution's load is its size (sum([s]) is 0 + s: the same number); a list, no generator frames
        if flush or (sizes[bin_[0]] if len(bin_) == 1 else sum([sizes[i] for i in bin_])) >= threshold:
            emitted.append(bin_)
        else:
            kept.extend(bin_)
    return emitted, kept
