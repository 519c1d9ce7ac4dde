"""The resume test's kill schedule and what it reports per kill, as pure functions (no process).

A schedule is drawn from ``random.Random(seed)``: ``kills`` kill points, each a
*kind* of moment (``KINDS``) and an extra delay drawn in ``[0, max_delay_s)``.
Invariants: the same seed gives the same schedule; every kind occurs at least
once (so ``kills >= len(KINDS)``; fewer raises ValueError); delays lie in
``[0, max_delay_s)``.

A kind is recognised from what a run leaves observable (``situation``): the
policy core rebuilt from the durable journal (``log/events.jsonl``) and the
number of model calls the proxy has open (its admin listing):

- ``mid-step``: a batch is open (``StartBatch`` issued, its ``StepDone`` not);
- ``mid-transition``: a cell is entering training (``BeginTransition(c,
  training)`` issued, its ``TransitionDone`` not);
- ``mid-publication``: a publication this attempt reached is pending
  (``Publish`` issued, its ``PublishDone`` not; its version past the one the
  attempt resumed at, so the kill keeps a new checkpoint) and its resume
  checkpoint is complete;
- ``mid-model-call``: at least one model call is open at the proxy.

``kill_table`` renders the per-kill rows the test prints and puts in its
failure messages; ``resume_columns`` fills a row's columns from its resume's
record (``at P``: how many executions ran at the checkpoint the resume took,
the ones it could re-attach).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Iterable

from gyre import roles as R

KINDS = ("mid-step", "mid-transition", "mid-publication", "mid-model-call")


@dataclass(frozen=True)
class KillPoint:
    kind: str
    delay_s: float   # waited once the attempt is running, before watching for the kind


def draw_schedule(seed: int, kills: int = 5, max_delay_s: float = 2.0) -> list[KillPoint]:
    """``kills`` kill points from ``random.Random(seed)``: every kind once, the rest drawn, in a drawn order."""
    if kills < len(KINDS):
        raise ValueError(f"{kills} kills cannot cover the {len(KINDS)} kinds {KINDS}")
    rng = random.Random(seed)
    kinds = list(KINDS) + [rng.choice(KINDS) for _ in range(kills - len(KINDS))]
    rng.shuffle(kinds)
    return [KillPoint(kind, rng.uniform(0.0, max_delay_s)) for kind in kinds]


@dataclass(frozen=True)
class Observed:
    """What the run shows at one instant (``situation`` reads it)."""
    version: int
    batch_open: bool
    transitioning: bool          # a cell in TO_TRAINING
    awaiting_publish: bool
    checkpoint_complete: bool    # the resume checkpoint of the core's version is written
    open_calls: int              # model calls open at the proxy


def observe(core, checkpoint_complete: bool, open_calls: int) -> Observed:
    """``Observed`` from a core rebuilt from the journal (``gyre.scheduler.Scheduler``)."""
    transitioning = any(role == R.TO_TRAINING for role in core.roles)
    return Observed(core.version, core.batch_open, transitioning, core.awaiting_publish, checkpoint_complete,
                    open_calls)


def situation(kind: str, seen: Observed, resumed_at: int = 0) -> bool:
    """Whether ``seen`` is a moment of ``kind`` (module docstring) in an attempt that resumed at version
    ``resumed_at``; ValueError for an unknown kind."""
    if kind == "mid-step":
        return seen.batch_open
    if kind == "mid-transition":
        return seen.transitioning
    if kind == "mid-publication":
        return seen.awaiting_publish and seen.checkpoint_complete and seen.version > resumed_at
    if kind == "mid-model-call":
        return seen.open_calls > 0
    raise ValueError(f"unknown kill kind {kind!r}; known: {KINDS}")


def open_calls(listing: Iterable[dict[str, Any]]) -> int:
    """Model calls open at the proxy, from its ``GET /admin/executions`` rows."""
    return sum(int(row.get("in_flight", 0)) for row in listing)


def saved_seconds(running: dict[str, float], now: float) -> float:
    """Harness work a resume keeps: the seconds each still-running harness (key: start time) has run."""
    return sum(max(0.0, now - started) for started in running.values())


def resume_columns(resume: dict[str, Any], running: Iterable[int]) -> dict[str, Any]:
    """A kill's columns from its resume's record (``attempts/{n}/resume.json``) and the executions whose
    harness ran at the kill (``running``): ``at P`` (executions running at the checkpoint: re-attached,
    re-admitted, re-run or cancelled), ``re-attached``, ``kept`` (harness work kept), ``re-run`` (the
    plan's, and any harness running at the kill whose work was not kept) and ``saved exec-s``."""
    kept = {int(x) for x in resume["work_kept_s"]}
    at_p = {*resume["reattached"], *map(int, resume["readmitted"]), *resume["rerun"], *resume["cancelled"]}
    return {"at P": len(at_p), "re-attached": len(resume["reattached"]), "kept": len(kept),
            "re-run": len(set(resume["rerun"]) | (set(running) - kept)),
            "saved exec-s": float(resume["saved_execution_s"])}


COLUMNS = ("kill", "what", "moment", "at P", "re-attached", "kept", "re-run", "saved exec-s", "processes")


def kill_table(rows: list[dict[str, Any]]) -> str:
    """The per-kill table: one line per kill, columns ``COLUMNS`` (a missing value shows as ``-``)."""
    cells = [[str(row.get(c, "-")) if not isinstance(row.get(c), float) else f"{row[c]:.1f}" for c in COLUMNS]
             for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) if cells else len(c) for i, c in enumerate(COLUMNS)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)


HOLD_S = 120.0        # a step or publication held this long: the test kills inside it
TRANSITION_HOLD_S = 4.0  # each entry into training of the attempt held this long (a restore's too)


def pause_for(kind: str, resumed_at: int) -> str:
    """``GYRE_FAULT_PAUSE`` for an attempt resumed at version ``resumed_at`` whose kill is of ``kind``: the
    window held open where it is too short to hit by polling (none for a model call)."""
    if kind == "mid-step":
        return f"step={HOLD_S:g}@{resumed_at + 1}"
    if kind == "mid-publication":
        return f"publish={HOLD_S:g}@{resumed_at + 2}"
    if kind == "mid-transition":
        return f"transition={TRANSITION_HOLD_S:g}@*"
    if kind == "mid-model-call":
        return ""
    raise ValueError(f"unknown kill kind {kind!r}; known: {KINDS}")
