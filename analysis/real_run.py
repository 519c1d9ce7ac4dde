"""The picture of one real run (``gyre run``): toy reward and staleness, step by step.

``plot_real_run(summary, out_dir)`` reads the summary ``runtime.job.run_job``
returns (``reward_curve``, ``losses``, ``staleness_per_group``,
``staleness_predicted``, ``participants``) and writes ``run.png`` and
``run.svg``: left, the mean reward of the groups trained at each step, with
the means of the first and last five steps drawn as levels; right, the
measured staleness of every trained group beside the prediction
phi + (mu - 1)/2. Steps where a satellite cell took part are marked, and the
reward panel's title gives the reward's trend (``reward_trend``: least-squares
slope per step and its t statistic, the measure the Ray e2e test asserts on).
It is ``draw_real_run(real_run_data(summary))`` saved: ``real_run_data``
computes every number the picture shows, ``draw_real_run`` only draws them.

Invariants: pure function of the summary (no clock, no I/O besides the two
files); a summary without steps raises ``ValueError`` naming what is missing;
steps are numbered from 1; the level means cover ``min(5, steps)`` steps;
the trend is None below three steps (no residual degree of freedom).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from gyre.analysis.plotting import house_style, new_figure, save_figure, style_axes

LEVEL_STEPS = 5


@dataclass(frozen=True)
class RealRunData:
    """What the real-run picture shows (see the module docstring)."""

    steps: list[int]  # 1..len(reward)
    reward: list[float]  # mean reward of the groups trained at each step
    joined: list[int]  # steps where more than one cell trained (a satellite took part)
    level_steps: int  # k: the levels average the first and the last k steps
    first_mean: float
    last_mean: float
    staleness: list[float]  # per trained group, feed order
    staleness_mean: float | None  # None without groups
    predicted: float | None
    trend: tuple[float, float] | None  # reward_trend(reward); None below three steps


def reward_trend(values: list[float]) -> tuple[float, float]:
    """Least-squares slope of ``values`` against their index, and its t statistic (slope / its standard
    error, n - 2 degrees of freedom): +inf or -inf for an exact line, 0 for a constant."""
    n = len(values)
    if n < 3:
        raise ValueError(f"a trend needs at least 3 values, got {n}")
    x_mean, y_mean = (n - 1) / 2, statistics.fmean(values)
    sxx = sum((x - x_mean) ** 2 for x in range(n))
    slope = sum((x - x_mean) * (y - y_mean) for x, y in enumerate(values)) / sxx
    residual = sum((y - y_mean - slope * (x - x_mean)) ** 2 for x, y in enumerate(values))
    stderr = (residual / (n - 2) / sxx) ** 0.5
    if stderr > 0:
        return slope, slope / stderr
    return slope, math.copysign(math.inf, slope) if slope else 0.0


def real_run_data(summary: dict[str, Any]) -> RealRunData:
    """Every series and level the picture draws; ValueError when no step was trained."""
    curve = list(summary.get("reward_curve") or [])
    if not curve:
        raise ValueError("the run summary has no reward_curve (no step was trained)")
    steps = list(range(1, len(curve) + 1))
    k = min(LEVEL_STEPS, len(curve))
    staleness = list(summary.get("staleness_per_group") or [])
    return RealRunData(
        steps=steps, reward=curve,
        joined=[s for s, cells in zip(steps, summary.get("participants") or []) if len(cells) > 1],
        level_steps=k, first_mean=statistics.fmean(curve[:k]), last_mean=statistics.fmean(curve[-k:]),
        staleness=staleness, staleness_mean=statistics.fmean(staleness) if staleness else None,
        predicted=summary.get("staleness_predicted"),
        trend=reward_trend(curve) if len(curve) >= 3 else None)


def _draw_reward(ax, data: RealRunData) -> None:
    ax.plot(data.steps, data.reward, marker="o", markersize=3, color="#1f77b4", label="mean reward of trained groups")
    if data.joined:
        ax.plot(data.joined, [data.reward[s - 1] for s in data.joined], "s", markersize=6, markerfacecolor="none",
                color="#d62728", label="a satellite cell took part")
    k, first, last = data.level_steps, data.first_mean, data.last_mean
    ax.hlines([first, last], [1, data.steps[-k]], [k, data.steps[-1]], colors="#7f7f7f", linestyles="--")
    ax.annotate(f"{first:.3f}", (1, first), textcoords="offset points", xytext=(0, -11), fontsize=7)
    ax.annotate(f"{last:.3f} ({last / first:.1f}x)" if first > 0 else f"{last:.3f}", (data.steps[-k], last),
                textcoords="offset points", xytext=(0, 5), fontsize=7)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("toy reward")
    ax.set_title("reward over the run" + (f"\ntrend {data.trend[0]:+.4f}/step, t = {data.trend[1]:.1f}"
                                          if data.trend is not None else ""))
    ax.legend(loc="upper left", frameon=False)


def _draw_staleness(ax, data: RealRunData) -> None:
    staleness = data.staleness
    ax.plot(range(len(staleness)), staleness, ".", color="#2ca02c", label="measured, per group")
    if staleness:
        ax.axhline(data.staleness_mean, color="#2ca02c", linewidth=1,
                   label=f"measured mean = {data.staleness_mean:.3g}")
        ax.set_ylim(min(staleness) - 0.2, max(staleness) + 0.8)
    if data.predicted is not None:
        ax.axhline(data.predicted, color="#7f7f7f", linestyle="--", label=f"phi + (mu-1)/2 = {data.predicted:g}")
    ax.set_xlabel("trained group (feed order)")
    ax.set_ylabel("v_t - v_d")
    ax.set_title("staleness")
    ax.legend(loc="upper left", frameon=False, ncols=2)


def draw_real_run(data: RealRunData) -> Figure:
    """The two panels (reward left, staleness right) as a matplotlib Figure."""
    with house_style():
        fig, (left, right) = new_figure(7.5, 2.8, ncols=2)
        _draw_reward(left, data)
        _draw_staleness(right, data)
        for ax in (left, right):
            style_axes(ax)
        return fig


def plot_real_run(summary: dict[str, Any], out_dir: str | Path, stem: str = "run") -> list[Path]:
    """Write STEM.png and STEM.svg of the run under ``out_dir``; returns both paths."""
    data = real_run_data(summary)
    with house_style():
        return save_figure(draw_real_run(data), out_dir, stem)
