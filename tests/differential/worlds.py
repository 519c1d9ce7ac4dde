"""Run one scripted trace through both worlds and compare what the policy core saw and did.

``run_sim`` is the SimPy simulator (``gyre.sim.driver.Simulation``).
``run_real`` is the real controller and the real backend on a ``VirtualLoop``,
with only the outer edge replaced (``doubles.py``). ``transcript`` renders a
run's event log as one line per event with the actions the core returned
(re-derived by replaying the log through a fresh core, which is deterministic),
and ``first_difference`` names the first line where two transcripts disagree,
with context, so a failure reads as a diff.

Invariant: both worlds use one ``SchedulerConfig``, one trace, one ``CostModel``
and one set of dropped groups; nothing else is shared between them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gyre import events as ev
from gyre.actions import SEPARATE
from gyre.config import SchedulerConfig
from gyre.formats.eventlog import EventLog
from gyre.formats.trace import Trace
from gyre.real.harness.runner import Budgets
from gyre.real.runtime.backend import Parts, RealBackend
from gyre.real.runtime.proxy_admin import InlineAdmin
from gyre.real.runtime.controller import Controller
from gyre.scheduler import Scheduler
from gyre.sim.costs import CostModel
from gyre.sim.driver import Simulation
from gyre.sim.sizes import trained_tokens
from gyre.staleness import staleness_by_group

from .doubles import TOKEN_BUDGET, EngineDouble, PlaneDouble, ProxyDouble, RunnerDouble, TaskDouble
from .virtual_loop import VirtualLoop


def costs_for_differential(**fields: Any) -> CostModel:
    """Costs with load-independent engines (executions take exactly their trace durations)."""
    names = {f.name for f in dataclasses.fields(CostModel)}
    base = {"engine_load_alpha": 0.0} if "engine_load_alpha" in names else {}
    return CostModel(**{**base, **fields})


@dataclass
class World:
    log: EventLog
    staleness: dict[int, int]  # consumed group -> v_t - v_d
    end_s: float


def check_one_micro_step_per_execution(costs: Any) -> None:
    """The doubles pack each trainable execution into a micro-step of its own (``TOKEN_BUDGET``); the
    simulator does under the same rule (``gyre.driver_rules.pack_micro_steps``) when none is smaller than
    its token budget."""
    tokens = trained_tokens(costs.trace, costs.j_max)
    smallest = float(tokens[tokens > 0].min()) if tokens is not None and (tokens > 0).any() else math.inf
    if smallest < costs.micro_step_tokens:
        raise ValueError(f"an execution trains {smallest:g} tokens, under micro_step_tokens="
                         f"{costs.micro_step_tokens}: the simulator would pack it with others, the doubles "
                         "pack one micro-step per execution")


class EdgeBackend(RealBackend):
    """The real backend with its one HTTP edge (the proxy's admin API) answered by a double's ``handle``."""

    def __init__(self, cfg: SchedulerConfig, parts: Any, *, proxy_double: Any, **kwargs: Any) -> None:
        super().__init__(cfg, parts, admin=InlineAdmin(proxy_double.handle), **kwargs)
        self.proxy_double = proxy_double


def run_sim(cfg: SchedulerConfig, trace: Trace, costs: CostModel, steps: int,
            dropped: frozenset[int] = frozenset()) -> World:
    sim = Simulation(cfg, trace, costs, steps, dropped_groups=dropped)
    record = sim.run()
    staleness = {row["group_id"]: row["staleness"] for row in record.consumed_groups()}
    return World(record.log, staleness, record.end_s)


def run_real(cfg: SchedulerConfig, trace: Trace, costs: CostModel, steps: int,
             dropped: frozenset[int] = frozenset(), *, overall_timeout_s: float = 1e6,
             backend_class: type[EdgeBackend] = EdgeBackend,
             runner_class: type[RunnerDouble] = RunnerDouble,
             engine_class: type[EngineDouble] = EngineDouble) -> tuple[World, EdgeBackend]:
    loop = VirtualLoop()
    costs = costs.bind(cfg, trace)  # the simulator's size-driven times: training work, publication, sandbox start
    trace = costs.trace
    check_one_micro_step_per_execution(costs)
    with tempfile.TemporaryDirectory(prefix="gyre-diff-") as tmp:
        root = Path(tmp)
        (root / "records").mkdir()
        (root / "workspace").mkdir()
        names = {c: f"cell{c}" for c in range(cfg.K)}
        if cfg.C_s > 0:
            names[SEPARATE] = "separate"
        budgets = Budgets(harness_timeout_s=overall_timeout_s, overall_timeout_s=overall_timeout_s)
        runner = runner_class(loop, cfg, trace, root / "records", root / "workspace", budgets)
        parts = Parts(proxy_url="http://proxy.invalid", admin_token="-", engines=engine_class(loop, names, costs),
                      engine_names=names, plane=PlaneDouble(loop, cfg, costs), runner=runner,
                      records_dir=root / "records", checkpoint_dir=root / "checkpoints",
                      task=TaskDouble(runner, dropped, seed=7))
        backend = backend_class(cfg, parts, seed=3, token_budget=TOKEN_BUDGET, clock=loop.time,
                                proxy_double=ProxyDouble(runner))
        controller = Controller(cfg, backend, clock=loop.time)
        backend.bind(controller)
        try:
            loop.run_until_complete(controller.run(steps))
        finally:
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()
    if backend.errors:
        raise AssertionError(f"backend tasks failed: {backend.errors}")
    m = backend.metrics
    return World(controller.log, staleness_by_group(m.v_d, m.v_t), loop.time()), backend


def transcript(cfg: SchedulerConfig, log: EventLog) -> list[str]:
    """One line per event: time, the event, and the actions the core returned for it.

    A ``Tick`` the core answered with no action is left out: the simulator
    delivers the tick of a supply timer that has since stopped (the real
    controller waits only for a live deadline); such a tick changes nothing.
    """
    core = Scheduler(cfg)
    lines = []
    for event in log.events():
        fields = {k: v for k, v in event.as_dict().items() if k not in ("kind", "now")}
        actions = core.handle(event)
        if isinstance(event, ev.Tick) and not actions:
            continue
        shown = "; ".join(_show(a.as_dict()) for a in actions)
        lines.append(f"t={event.now:12.6f} {event.kind}{_args(fields)} -> [{shown}]")
    return lines


def _args(fields: dict[str, Any]) -> str:
    return "(" + ", ".join(f"{k}={v}" for k, v in fields.items()) + ")" if fields else ""


def _show(action: dict[str, Any]) -> str:
    kind = action.pop("kind")
    return kind + _args(action)


def first_difference(sim: list[str], real: list[str], context: int = 3) -> str | None:
    """None when equal; else the first differing line with ``context`` lines before it, as a diff."""
    for i in range(max(len(sim), len(real))):
        a = sim[i] if i < len(sim) else "<end of run>"
        b = real[i] if i < len(real) else "<end of run>"
        if a != b:
            before = [f"  {line}" for line in sim[max(0, i - context):i]]
            return "\n".join([f"first difference at event {i} (of {len(sim)} sim, {len(real)} real):",
                              *before, f"- sim:  {a}", f"+ real: {b}"])
    return None


def times_match(sim: list[str], real: list[str], tol: float = 1e-6) -> str | None:
    """None when every transcript line happened at the same virtual time; else the first mismatch."""
    for i, (a, b) in enumerate(zip(sim, real)):
        ta, tb = (float(re.match(r"t=\s*(\S+)", line).group(1)) for line in (a, b))
        if not math.isclose(ta, tb, rel_tol=0, abs_tol=tol):
            return f"event {i} at t={ta} in the sim, t={tb} in the real backend: {a}"
    return None
