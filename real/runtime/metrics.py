"""Live metrics of a real run: one record per trained step, to ``metrics.jsonl`` and TensorBoard.

Every optimizer step the backend reports (``RealBackend.on_step``) becomes one
record, written while the run goes on:

- ``RUN_DIR/metrics.jsonl``: one JSON object per line, appended and flushed
  before the step's ``StepDone`` reaches the core (``tail -f`` shows it live);
- ``RUN_DIR/tb/``: the record's numbers as TensorBoard scalars (tag = field,
  nested fields as ``breakdown_s/rollout_full``, ``engine_load/e0``), flushed
  per step. TensorBoard needs the ``tensorboard`` package; without it only
  the JSON lines are written (said once through ``log``);
- with ``wandb = "offline"`` in the job file (``JobConfig.metrics.wandb``): the same
  scalars to a Weights & Biases run in offline mode under ``RUN_DIR/wandb/``
  (nothing leaves the machine; ``wandb sync`` uploads it later). Needs the
  ``wandb`` package (extra ``[wandb]``); without it the run says so once and
  goes on. Every attempt of a resumed run logs to the same W&B run: its id is
  kept in ``RUN_DIR/wandb/gyre-run-id`` (each attempt is its own offline
  folder under that id; ``wandb sync`` of them all resumes the one run).

A record (``step_record``) holds: ``step`` (1-based) and ``version``, the
``burst`` in progress (1-based), ``time_s`` (the controller's clock),
``reward_mean`` / ``rewards`` of the groups fed to the step, ``loss``,
``step_wall_s``, ``participants``, ``staleness_mean`` / ``staleness_max`` /
``groups`` (v_t - v_d of exactly the groups fed to this step), the
transitions done so far (``transitions``, ``transition_mean_s``), the
publications done so far and the last one's wall time (``publications``,
``publication_s``), ``breakdown_s`` (seconds per category so far), the
``roles`` of the cells, ``running`` executions (holding a rollout slot),
``evaluating`` ones (harness stopped, evaluation retrying: no slot),
``engine_load`` (running executions per engine), and ``problems`` (values
that were missing or not finite; each such value is null).

The time breakdown uses the categories of ``sim/breakdown.py`` (first match
wins: executions holding rollout slots fill the rollout capacity; some hold
one; a step is in progress; a publication is; a cell switches roles;
waiting). It is rebuilt from the controller's event log alone: ``Timeline`` replays the accepted events through
a shadow core and integrates the category of the core's state between events.

Invariants: ``step_record`` never raises on a malformed or missing value (it
is null and named in ``problems``) and never emits a non-finite number; the
breakdown's categories sum to the time from the ``Begin`` event to the
record's ``time_s``; ``LiveMetrics.on_step`` and ``MetricsWriter.write`` never
raise: a failure is logged and the run continues; every record is on disk
(flushed) when ``write`` returns. ``LiveMetrics.on_step_off_loop`` (what a
run uses) builds the record on the event loop, from state the loop owns, and
writes it on a worker thread, one step after another in order: a slow disk or
TensorBoard's first import holds the step, never the loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import math
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from gyre import events as ev
from gyre import roles as R
from gyre.actions import SEPARATE
from gyre.config import SchedulerConfig
from gyre.driver_rules import CATEGORIES, breakdown_category
from gyre.scheduler import Scheduler
from gyre.staleness import group_staleness

if TYPE_CHECKING:
    from gyre.real.runtime.backend import RealBackend
    from gyre.real.runtime.controller import Controller


def category(core: Scheduler) -> str:
    """The breakdown category of the core's state now (``gyre.driver_rules``, as the simulator's);
    a stopped harness's evaluation holds no rollout slot, so it does not count as running."""
    return breakdown_category(running=core.holding, capacity=core.capacity, training=core.batch_open,
                              publishing=core.awaiting_publish,
                              switching=any(role in (R.TO_TRAINING, R.TO_ROLLOUT) for role in core.roles))


class Timeline:
    """The run as the core saw it, rebuilt from the event log rows accepted so far."""

    def __init__(self, cfg: SchedulerConfig) -> None:
        self.core = Scheduler(cfg)
        self.seen = 0                     # log rows replayed
        self.t: float | None = None       # time integrated up to
        self.seconds = dict.fromkeys(CATEGORIES, 0.0)

    def advance(self, rows: list[dict[str, Any]], now: float | None = None) -> dict[str, float]:
        """Replay the rows not seen yet, then extend to ``now``; seconds per category so far."""
        for row in rows[self.seen:]:
            event = ev.event_from_dict({k: v for k, v in row.items() if k != "seq"})
            self._until(event.now)
            self.core.handle(event)
            self.seen += 1
        if now is not None and self.t is not None:
            self._until(now)
        return dict(self.seconds)

    def _until(self, t: float) -> None:
        if self.t is not None and t > self.t:
            self.seconds[category(self.core)] += t - self.t
        self.t = t if self.t is None else max(self.t, t)


def _number(value: Any, name: str, problems: list[str]) -> float | None:
    """``value`` as a finite float, else None with ``name`` added to ``problems``."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number):
        problems.append(name)
        return None
    return number


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def step_record(timeline: Timeline, metrics: Any, version: int, *, rows: list[dict[str, Any]], now: float,
                engine_names: dict[int, str]) -> dict[str, Any]:
    """The record of step ``version`` (see the module docstring); ``metrics`` is the backend's ``Metrics``."""
    problems: list[str] = []
    try:
        breakdown = timeline.advance(rows, now)
    except Exception as exc:  # a log the shadow core refuses: the rest of the record still stands
        problems.append(f"breakdown_s ({type(exc).__name__}: {exc})")
        breakdown = dict(timeline.seconds)
    step = metrics.steps.get(version) or {}
    if not step:
        problems.append("step report")
    rewards = [r for r in (_number(v, "reward", problems) for v in metrics.rewards.get(version, [])) if r is not None]
    staleness = [group_staleness(metrics.v_d[g], metrics.v_t[g]) for g in sorted(metrics.v_t)
                 if metrics.v_t[g] == version and g in metrics.v_d]
    transitions = [t for t in (_number(x.get("total_s"), "transition total_s", problems)
                               for x in metrics.transitions) if t is not None]
    core = timeline.core.snapshot()  # as of the rows replayed
    load = {name: 0 for engine, name in engine_names.items()}
    for engine in core.placements.values():
        name = engine_names.get(engine, "sep" if engine == SEPARATE else str(engine))
        load[name] = load.get(name, 0) + 1
    record = {
        "step": version + 1, "version": version, "burst": core.burst + 1,
        "time_s": _number(now, "time_s", problems),
        "reward_mean": _mean(rewards), "rewards": len(rewards),
        "loss": _number(step.get("loss"), "loss", problems) if step else None,
        "step_wall_s": _number(step.get("wall_s"), "step_wall_s", problems) if step else None,
        "participants": list(step.get("participants") or []),
        "staleness_mean": _mean(staleness), "staleness_max": max(staleness) if staleness else None,
        "groups": len(staleness),
        "transitions": len(metrics.transitions), "transition_mean_s": _mean(transitions),
        "publications": len(metrics.publishes),
        "publication_s": _number(metrics.publishes[-1].get("wall_s"), "publication_s", problems)
        if metrics.publishes else None,
        "breakdown_s": {k: _number(v, f"breakdown_s.{k}", problems) for k, v in breakdown.items()},
        "roles": {str(c): role for c, role in enumerate(core.roles)},
        "running": core.holding, "evaluating": len(core.stopped), "engine_load": load,
    }
    record["problems"] = problems
    return record


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The record's numbers as TensorBoard tags (nested fields as ``field/key``); nulls left out."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key in ("step", "version"):
            continue
        items = value.items() if isinstance(value, dict) else [(None, value)]
        for sub, v in items:
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                out[key if sub is None else f"{key}/{sub}"] = float(v)
    return out


WANDB_MODES = ("", "offline")
WANDB_ID_FILE = "gyre-run-id"  # under RUN_DIR/wandb: the one W&B run every attempt logs to


class MetricsWriter:
    """Appends records to ``run_dir/metrics.jsonl``, TensorBoard scalars under ``run_dir/tb`` and, with
    ``wandb="offline"``, the same scalars to an offline W&B run under ``run_dir/wandb``. ``purge_step``
    (a resumed run: its first redone step) makes TensorBoard drop what an earlier attempt logged for that
    step and later ones, as ``runtime.resume`` moves their ``metrics.jsonl`` lines aside."""

    def __init__(self, run_dir: str | Path, *, log: Callable[[str], None] = print, tensorboard: bool = True,
                 wandb: str = "", config: dict[str, Any] | None = None, purge_step: int | None = None) -> None:
        if wandb not in WANDB_MODES:
            raise ValueError(f"wandb must be one of {WANDB_MODES} (\"\": off), not {wandb!r}")
        self.run_dir, self.log = Path(run_dir), log
        self.path = self.run_dir / "metrics.jsonl"
        self._tensorboard, self._tb = tensorboard, None
        self.purge_step = purge_step  # a resumed run: TensorBoard hides the scalars of steps >= it left before
        self._wandb_mode, self._wandb, self._config = wandb, None, dict(config or {})
        self.failed: set[str] = set()   # sinks given up on, each said once

    def write(self, record: dict[str, Any]) -> None:
        """Write one record to every sink and flush; a failing sink is logged, never raised."""
        try:
            line = json.dumps(record, allow_nan=False, default=str)
            with open(self.path, "a") as fh:  # one open per line: a crash loses at most the line being written
                fh.write(line + "\n")
                fh.flush()
        except (OSError, TypeError, ValueError) as exc:
            self._give_up("metrics.jsonl", exc)
        if self._tensorboard and "tensorboard" not in self.failed:
            try:
                writer = self._tb or self._open_tensorboard()
                for tag, value in scalars(record).items():
                    writer.add_scalar(tag, value, record["step"])
                writer.flush()
            except Exception as exc:  # an import or I/O failure of an optional sink must not stop the run
                self._give_up("tensorboard", exc)
        if self._wandb_mode and "wandb" not in self.failed:
            try:
                run = self._wandb or self._open_wandb()
                run.log(scalars(record), step=record["step"])
            except Exception as exc:
                self._give_up("wandb", exc)

    def _open_wandb(self):
        import wandb

        self._wandb = wandb.init(mode=self._wandb_mode, dir=str(self.run_dir), project="gyre",
                                 name=self.run_dir.name, config=self._config, id=self.wandb_run_id(),
                                 resume="allow", settings=wandb.Settings(silent=True, console="off"))
        return self._wandb

    def wandb_run_id(self) -> str:
        """The run folder's W&B run id: read from ``wandb/gyre-run-id``, or made (from the folder's path and
        the time) and kept there by the first attempt."""
        path = self.run_dir / "wandb" / WANDB_ID_FILE
        if path.is_file() and (kept := path.read_text().strip()):
            return kept
        run_id = "gyre-" + hashlib.sha256(f"{self.run_dir.resolve()}:{time.time_ns()}".encode()).hexdigest()[:12]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(run_id + "\n")
        return run_id

    def _open_tensorboard(self):
        from torch.utils.tensorboard import SummaryWriter

        self._tb = SummaryWriter(log_dir=str(self.run_dir / "tb"), purge_step=self.purge_step)
        return self._tb

    def _give_up(self, sink: str, exc: BaseException) -> None:
        if sink not in self.failed:
            self.failed.add(sink)
            self.log(f"metrics: {sink} not written ({type(exc).__name__}: {exc}); the run continues")

    def close(self) -> None:
        if self._tb is not None:
            try:
                self._tb.close()
            except Exception as exc:
                self._give_up("tensorboard", exc)
            self._tb = None
        if self._wandb is not None:
            try:
                import wandb

                self._wandb.finish()
                wandb.teardown()  # waits for the W&B service to write the run out, so it is on disk on return
            except Exception as exc:
                self._give_up("wandb", exc)
            self._wandb = None


class LiveMetrics:
    """The backend's step hook: builds each step's record and writes it; ``watch`` sees every record."""

    def __init__(self, cfg: SchedulerConfig, run_dir: str | Path, engine_names: dict[int, str], *,
                 log: Callable[[str], None] = print, watch: Callable[[dict], None] | None = None,
                 tensorboard: bool = True, wandb: str = "", purge_step: int | None = None) -> None:
        self.timeline = Timeline(cfg)
        self.writer = MetricsWriter(run_dir, log=log, tensorboard=tensorboard, wandb=wandb,
                                    config=dataclasses.asdict(cfg), purge_step=purge_step)
        self.engine_names, self.log, self.watch = dict(engine_names), log, watch
        self.controller: Controller | None = None
        self.backend: RealBackend | None = None
        self.records: list[dict[str, Any]] = []
        self._writing = asyncio.Lock()

    def bind(self, controller: Controller, backend: RealBackend) -> LiveMetrics:
        self.controller, self.backend = controller, backend
        return self

    def on_step(self, version: int) -> None:
        """Record step ``version`` (its report is in the backend's metrics); never raises."""
        record = self._record(version)
        if record is not None:
            self.writer.write(record)
            self._show(record)

    async def on_step_off_loop(self, version: int) -> None:
        """``on_step``, with the record's sinks written on a worker thread; returns once it is on disk."""
        record = self._record(version)
        if record is None:
            return
        async with self._writing:  # records reach the files in step order
            await asyncio.to_thread(self.writer.write, record)
        self._show(record)

    def _record(self, version: int) -> dict[str, Any] | None:
        try:
            if self.controller is None or self.backend is None:
                raise RuntimeError("LiveMetrics.on_step before bind(controller, backend)")
            record = step_record(self.timeline, self.backend.metrics, version, rows=self.controller.log.rows,
                                 now=self.controller.clock(), engine_names=self.engine_names)
        except Exception as exc:
            self.log(f"metrics: step {version + 1} not recorded ({type(exc).__name__}: {exc}); the run continues")
            return None
        if record["problems"]:
            self.log(f"metrics: step {version + 1}: missing or non-finite {', '.join(record['problems'])}")
        self.records.append(record)
        return record

    def _show(self, record: dict[str, Any]) -> None:
        if self.watch is not None:
            try:
                self.watch(record)
            except Exception as exc:
                self.log(f"metrics: display failed ({type(exc).__name__}: {exc})")

    def close(self) -> None:
        self.writer.close()
