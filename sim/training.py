"""Simulated training plane: micro-steps claimed by training cells (docs/streaming.md#claiming-micro-steps).

The plane never decides anything the policy core decides: it models *time*.
A batch opens (StartBatch), groups arrive (FeedGroups), and each group's
trainable executions become micro-steps in one shared queue by the real
packer's rule (``gyre.driver_rules.pack_micro_steps`` under
``costs.micro_step_tokens``: an execution is never split, small ones pack
together, the batch's last group flushes the rest), and every member cell
that is free claims the next one, so faster and earlier cells take more. A
micro-step's work follows the tokens it trains (``gyre.sim.sizes``: trained
tokens x 6 x active parameters / (node throughput x utilisation)); a cell of
n nodes runs a micro-step of w node-seconds in w / n seconds.
Each cell pays one warm-up per batch at its first claim; after the last
micro-step the batch pays drain + gradient reduction + the optimizer update,
then reports StepDone. Streaming asks the core for one group at a time
(GroupWanted, at most one outstanding) whenever the queue holds fewer
micro-steps than there are member cells, asynchronously (an event after the current instant's claims,
as the real backend's asks reach the core); the real backend follows the
same rule (``runtime.backend``, tests/differential checks they agree);
non-streaming receives the whole batch at once.

Invariants: a micro-step is claimed by exactly one cell; a cell runs at most
one micro-step at a time; StepDone is reported once per batch, only after all
B groups were fed and all their micro-steps finished; the node-seconds of a
batch's micro-steps equal the sum of its groups' work (a batch whose
executions train nothing ends with no micro-step).
"""

from __future__ import annotations

from bisect import insort
from collections import deque
from dataclasses import dataclass
from heapq import heappush
from typing import Callable

from gyre import events as ev
from gyre.config import SchedulerConfig
from gyre.driver_rules import asks_for_group, pack_micro_steps
from gyre.sim.clock import Clock
from gyre.sim.costs import CostModel
from gyre.sim.sizes import BoundCosts, train_rate


@dataclass(slots=True)
class Member:
    nodes: int
    available_at: float
    busy: bool = False
    warmed: bool = False
    micro_steps: int = 0


class SimTrainingPlane:
    def __init__(self, env: Clock, cfg: SchedulerConfig, costs: CostModel,
                 send: Callable[[ev.Event], None]) -> None:
        self.env, self.cfg, self._send = env, cfg, send
        self.costs = costs if isinstance(costs, BoundCosts) else costs.bind(cfg)  # no trace: fallback tokens
        self._per_token, self._per_node_s = train_rate(self.costs.base)  # train_node_s's terms, read once
        self._micro_step_tokens = self.costs.micro_step_tokens
        self._warmup_s = self.costs.warmup_s  # read per first claim of a batch (BoundCosts' __getattr__ is slow)
        self._streaming, self._batch_size = cfg.streaming, cfg.B  # read once per micro-step
        self.members: dict[int, Member] = {}
        self._idle: list[int] = []  # sorted cells of the members not running a micro-step: the claim order
        self.version: int | None = None
        self.fed = self.wanted = self.in_flight = 0
        self.queue: deque[float] = deque()  # node-seconds of each waiting micro-step
        self.pending: list[float] = []  # trained tokens of the open batch's executions not yet packed
        self.work_node_s = 0.0  # node-seconds of all micro-steps fed (trained-token work)
        self._claims = [0] * cfg.K  # micro-steps claimed by each cell (micro_steps_by_cell)
        self._done_call = self._micro_step_done  # a micro-step end's function, bound once (pushed once per claim)
        self.busy_node_s = 0.0  # node-seconds of micro-steps, warm-ups, drains and updates (the slack's busy part)

    @property
    def micro_steps_by_cell(self) -> dict[int, int]:
        """Cell -> the micro-steps it claimed, for the cells that claimed any (in cell order)."""
        return {cell: n for cell, n in enumerate(self._claims) if n}

    # ---- membership ------------------------------------------------------------
    def join(self, cell: int, delay: float = 0.0) -> None:
        """A cell enters training; it can claim work after ``delay`` (weight pull).

        One more member makes the queue shorter relative to the cells, so the packing
        buffer may ask for a group at once (the real backend asks at the same moment)."""
        if cell not in self._idle:  # a new member, or one re-joining while its last micro-step still runs
            insort(self._idle, cell)
        self.members[cell] = Member(self.cfg.nodes_per_cell, self.env.now + delay)
        self._assign()
        self._wake_at(self.env.now + delay)

    def leave(self, cell: int) -> None:
        member = self.members.pop(cell, None)
        if member is None:
            return
        if member.busy:
            raise RuntimeError(f"cell {cell} left training while running a micro-step")
        self._idle.remove(cell)

    def hold(self, cells: tuple[int, ...], seconds: float) -> None:
        """Cells are busy receiving parameters (broadcast) for ``seconds``."""
        for cell in cells:
            if cell in self.members:
                self.members[cell].available_at = max(self.members[cell].available_at, self.env.now + seconds)
        self._wake_at(self.env.now + seconds)

    # ---- batches ---------------------------------------------------------------
    def start_batch(self, version: int) -> None:
        if self.version is not None:
            raise RuntimeError(f"batch {version} opened while batch {self.version} is running")
        self.version = version
        self.fed = self.wanted = self.in_flight = 0
        self.queue.clear()
        self.pending = []
        for member in self.members.values():
            member.warmed = False
        self._assign()

    def feed(self, version: int, groups: tuple[int, ...]) -> None:
        if version != self.version:
            raise RuntimeError(f"groups fed to batch {version} while batch {self.version} is open")
        if self.cfg.streaming:
            self.wanted -= len(groups)
        for g in groups:
            self.fed += 1
            self._pack([t for t in self.costs.execution_tokens(g) if t > 0], flush=self.fed == self.cfg.B)
        if self.fed == self.cfg.B and not self.queue and self.in_flight == 0:
            self._finish_batch()  # nothing of the batch trains (every execution excluded or failed)
            return
        self._assign()

    def _pack(self, tokens: list[float], *, flush: bool) -> None:
        """One group's trainable executions into the pending ones; queue the micro-steps emitted."""
        self.pending.extend(tokens)
        emitted, kept = pack_micro_steps(self.pending, self._micro_step_tokens, flush=flush)
        pending, per_token, per_node_s, queue = self.pending, self._per_token, self._per_node_s, self.queue
        for bin_ in emitted:  # train_node_s (tokens * per_token / per_node_s), inlined: once per micro-step
            trained = pending[bin_[0]] if len(bin_) == 1 else sum([pending[i] for i in bin_])  # sum([t]) is 0 + t
            work = trained * per_token / per_node_s
            self.work_node_s += work
            queue.append(work)
        self.pending = [pending[i] for i in kept]

    # ---- internals ---------------------------------------------------------------
    def _wake_at(self, when: float) -> None:
        if when > self.env.now:
            self.env.call_in(when - self.env.now, self._assign)

    def _assign(self) -> None:
        """Free cells claim queued micro-steps, then the plane asks for a group if it needs one.

        Neither step calls back into the plane (micro-steps end and asks reach the core as later
        calls on the clock), so nothing changes between them and one claim pass suffices."""
        if self.version is None:
            return
        self._claim_free_cells()
        self._ask_for_groups()

    def _claim_free_cells(self) -> None:
        """Idle members claim queued micro-steps in the order of their cells (busy ones are not in ``_idle``)."""
        queue, idle = self.queue, self._idle
        if not queue or not idle:
            return
        members, now = self.members, self.env.now
        position = 0  # in idle: the cells before it are held (not available yet)
        while queue and position < len(idle):
            cell = idle[position]
            member = members[cell]
            if member.available_at > now:
                position += 1
                continue
            del idle[position]  # it claims: busy until its micro-step ends
            self.in_flight += 1
            self._run(cell, member, queue.popleft(), now)

    def _run(self, cell: int, member: Member, work: float, now: float) -> None:
        """``cell`` runs a micro-step of ``work`` node-seconds from ``now`` (it claimed it: counted in flight)."""
        member.busy = True
        nodes = member.nodes
        seconds = work / nodes + (0.0 if member.warmed else self._warmup_s)
        member.warmed = True
        self._claims[cell] += 1
        self.busy_node_s += seconds * nodes
        # Clock.call_in(seconds, ...), pushed here (seconds >= 0: costs and work are never negative)
        clock = self.env
        heappush(clock.queue, (now + seconds, next(clock.sequence), self._done_call, (cell,)))

    def _ask_for_groups(self) -> None:
        if not self._streaming:
            return
        # the rule the real backend follows too (gyre.driver_rules), its arguments by position
        if self.version is not None and asks_for_group(self.wanted, self.fed, self._batch_size, len(self.queue),
                                                       len(self.members)):
            self._ask()

    def _ask(self) -> None:
        self.wanted = 1
        # asynchronously, as any real plane must ask: cells free now claim before the core answers
        self.env.call_in(0, self._send, ev.GroupWanted(self.env.now))

    def _micro_step_done(self, cell: int) -> None:
        member = self.members.get(cell)
        queue = self.queue
        now = self.env.now
        if queue and not self._idle and member is not None and member.busy and member.available_at <= now:
            # the common end: every other member is busy and a micro-step waits, so this cell, the only one
            # free, claims it at once (what freeing it and _claim_free_cells do; in flight: -1 + 1)
            self._run(cell, member, queue.popleft(), now)
        else:
            self.in_flight -= 1
            if member is not None and member.busy:  # (not busy: it re-joined meanwhile, and is idle already)
                member.busy = False
                insort(self._idle, cell)
            if self.fed == self._batch_size and not queue and self.in_flight == 0:
                self._finish_batch()
                return
            if queue:  # _assign, inlined: once per micro-step (a batch is open while one runs)
                self._claim_free_cells()
        # _ask_for_groups, inlined; the rule's first tests: a batch fed whole, or with an ask outstanding,
        # asks for nothing
        if (self._streaming and self.fed < self._batch_size and not self.wanted
                and asks_for_group(0, self.fed, self._batch_size, len(queue), len(self.members))):
            self._ask()

    def _finish_batch(self) -> None:
        version, self.version = self.version, None
        assert version is not None  # a batch is open
        tail = self.costs.drain_s + self.costs.grad_reduce_s + self.costs.optimizer_s
        self.busy_node_s += tail * sum(m.nodes for m in self.members.values())
        self.env.call_in(tail, self._step_done, version)

    def _step_done(self, version: int) -> None:
        self._send(ev.StepDone(self.env.now, version))
