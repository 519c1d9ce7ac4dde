"""Boundary and continuous dispatch: closed forms and a group-level queue model.

Setting (docs/staleness.md#staleness-identity). A step consumes B groups and trains version v_t = its
index; a burst is mu steps and ends with a publication, so during step s the
newest published version is mu * floor(s / mu). Number consumptions
j = 0, 1, 2, ... in order; consumption j belongs to step floor(j / B).

* Boundary dispatch: (phi + mu) B groups at version 0, then mu B groups at each
  publication, at the version just published.
* Continuous dispatch at equal depth: Q = (phi + mu) B groups at version 0;
  every consumption immediately dispatches one replacement at the newest
  published version, so Q groups are always in flight.

Derivation. Take groups consumed in dispatch order (FIFO: all ready, or
readiness in dispatch order). Consumption j takes dispatch ordinal j.
Boundary: ordinals phi B + (k-1) mu B ... phi B + k mu B - 1 come from the k-th
publication, so v_d(j) = mu * floor((j - phi B) / (mu B)). Continuous: ordinal
Q + i is dispatched at consumption i, during step floor(i / B), so
v_d(j) = mu * floor((j - Q) / (mu B)). Both are one formula with a lag L
(L = phi B for boundary, L = Q = (phi + mu) B for continuous), for j >= L:

    d(j) = floor(j / B) - mu * floor((j - L) / (mu B)).

In steady state write j = k mu B + r with r uniform on {0, ..., mu B - 1}, and
L = a mu B + c with 0 <= c < mu B. Then floor(j / B) = k mu + floor(r / B) has
mean k mu + (mu - 1) / 2, and floor((j - L) / (mu B)) = k - a - [r < c] has mean
k - L / (mu B). Hence

    E[d] = L / B + (mu - 1) / 2,
    boundary:   E[d] = phi + (mu - 1) / 2              (Theorem A.1)
    continuous: E[d] = phi + mu + (mu - 1) / 2 = phi + (3 mu - 1) / 2,

so continuous dispatch at equal depth is exactly mu versions staler on
average. The distribution is d(r) = floor(r / B) + mu * (a + [r < c]) over r
(``fifo_pmf``). Intuition: boundary dispatch refills the mu B slots a burst
frees only at the publication, with the new weights; continuous dispatch
refills them during the burst with the weights the burst started from, and
those groups then wait the same Q consumptions. Matching boundary's mean with
continuous dispatch needs a depth of only L = phi B groups, less than one
batch when phi < 1.

Order does not matter for the mean: over a run, the sum of v_t over consumed
groups is fixed by the step structure and the sum of v_d over dispatched
groups by the dispatch rule, whichever group each consumption takes; consumed
and dispatched differ by the groups still queued, whose versions lie within a
few bursts of the current one. So the long-run mean equals the FIFO value
under any readiness order (heavy-tailed rollouts included) with an error of
order L / (bursts * mu B); the maximum, the percentiles and the token-weighted
mean do depend on the order, hence on the trace.

``simulate_queue`` is a group-level model of both policies (no cells, no
executions): each group is ready ``rollout_s`` after it starts, at most
``capacity_groups`` groups roll out at once (FIFO wait for a slot), training
takes ready groups oldest version first, ``train_s_per_group`` each, and a
publication takes ``publish_s``. It checks the closed forms numerically, and
its boundary mode is compared with the full simulator in ``theorem.py``.
Invariants: deterministic (no randomness: durations are an input, group g uses
``rollout_s[g % len(rollout_s)]``); every group is consumed at most once;
staleness >= 0.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

from gyre.staleness import DISPATCH_POLICIES, predicted_staleness

Policy = Literal["boundary", "continuous"]
POLICIES: tuple[str, ...] = DISPATCH_POLICIES


def lag_groups(policy: str, B: int, phi: float, mu: int) -> int:
    """L: consumptions between a group's dispatch ordinal and its lag origin (see docstring)."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    extra = round(phi * B)
    return extra if policy == "boundary" else extra + mu * B


def predicted_mean(policy: str, phi: float, mu: int) -> float:
    """Closed-form steady-state group-weighted mean staleness (``gyre.staleness.predicted_staleness``)."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    return predicted_staleness(phi, mu, policy)


def fifo_pmf(policy: str, B: int, phi: float, mu: int) -> pd.Series:
    """Exact steady-state staleness distribution under FIFO consumption (shares by value)."""
    L = lag_groups(policy, B, phi, mu)
    a, c = divmod(L, mu * B)
    r = np.arange(mu * B)
    d = r // B + mu * (a + (r < c))
    counts = pd.Series(d).value_counts().sort_index()
    return (counts / counts.sum()).rename("share").rename_axis("staleness")


@dataclass(frozen=True, kw_only=True)
class QueueModel:
    """Group-level dispatch model; see the module docstring."""

    B: int
    phi: float
    mu: int
    policy: Policy = "boundary"
    train_s_per_group: float = 0.0
    publish_s: float = 0.0
    capacity_groups: int | None = None

    def __post_init__(self) -> None:
        lag_groups(self.policy, self.B, self.phi, self.mu)
        if self.B < 1 or self.mu < 1 or self.phi < 0 or abs(self.phi * self.B - round(self.phi * self.B)) > 1e-9:
            raise ValueError(f"need B >= 1, mu >= 1, phi >= 0 with phi*B whole; got B={self.B}, "
                             f"phi={self.phi}, mu={self.mu}")
        if self.capacity_groups is not None and self.capacity_groups < 1:
            raise ValueError(f"capacity_groups must be >= 1, got {self.capacity_groups}")

    @property
    def initial_groups(self) -> int:
        return round(self.phi * self.B) + self.mu * self.B


class _Queue:
    """Mutable state of one ``simulate_queue`` run."""

    def __init__(self, model: QueueModel, rollout_s: np.ndarray, tokens: np.ndarray | None) -> None:
        self.model, self.rollout_s, self.tokens = model, rollout_s, tokens
        self.now = 0.0
        self.published = 0
        self.rows: list[dict[str, float]] = []
        self.rolling: list[tuple[float, int]] = []  # (ready_at, group)
        self.waiting: deque[int] = deque()
        self.ready: list[tuple[int, int]] = []  # (v_d, group): oldest version first

    def dispatch(self, n: int) -> None:
        for _ in range(n):
            g = len(self.rows)
            tokens = float(self.tokens[g % len(self.tokens)]) if self.tokens is not None else math.nan
            self.rows.append({"group_id": g, "v_d": self.published, "dispatched_at_s": self.now,
                              "ready_at_s": math.nan, "v_t": math.nan, "consumed_at_s": math.nan,
                              "tokens": tokens})
            self.waiting.append(g)
        self._start(self.now)

    def _start(self, when: float) -> None:
        cap = self.model.capacity_groups
        while self.waiting and (cap is None or len(self.rolling) < cap):
            g = self.waiting.popleft()
            heapq.heappush(self.rolling, (when + float(self.rollout_s[g % len(self.rollout_s)]), g))

    def advance(self, until: float) -> None:
        """Mark every group whose rollout ends by ``until`` ready, in time order."""
        while self.rolling and self.rolling[0][0] <= until:
            at, g = heapq.heappop(self.rolling)
            self.rows[g]["ready_at_s"] = at
            heapq.heappush(self.ready, (int(self.rows[g]["v_d"]), g))
            self._start(at)

    def take(self, step: int) -> None:
        """Consume the oldest-version ready group for ``step``, waiting for one if needed."""
        self.advance(self.now)
        while not self.ready:
            if not self.rolling:
                raise RuntimeError(f"queue model stalled at step {step}: nothing in flight")
            self.now = max(self.now, self.rolling[0][0])
            self.advance(self.now)
        _, g = heapq.heappop(self.ready)
        self.rows[g].update(v_t=step, consumed_at_s=self.now)
        if self.model.policy == "continuous":
            self.dispatch(1)
        self.now += self.model.train_s_per_group


def simulate_queue(model: QueueModel, rollout_s: np.ndarray, steps: int,
                   tokens: np.ndarray | None = None) -> pd.DataFrame:
    """Run ``steps`` steps; one row per dispatched group (groups.csv columns, NaN if unconsumed)."""
    rollout_s = np.asarray(rollout_s, dtype=float)
    if rollout_s.size == 0 or (rollout_s < 0).any():
        raise ValueError("rollout_s must be a non-empty array of non-negative seconds")
    queue = _Queue(model, rollout_s, None if tokens is None else np.asarray(tokens, dtype=float))
    queue.dispatch(model.initial_groups)
    for step in range(steps):
        for _ in range(model.B):
            queue.take(step)
        if (step + 1) % model.mu == 0:
            queue.now += model.publish_s
            queue.advance(queue.now)
            queue.published = step + 1
            if model.policy == "boundary":
                queue.dispatch(model.mu * model.B)
    frame = pd.DataFrame(queue.rows)
    frame["staleness"] = frame["v_t"] - frame["v_d"]
    frame["consumed_step"] = frame["v_t"]
    return frame
