"""The picture of one real run (``gyre run``): toy reward and staleness, step by step.

``plot_real_run(summary, out_dir)`` reads the summary ``runtime_job.run_job``
returns (``reward_curve``, ``losses``, ``staleness_per_group``,
``staleness_predicted``, ``participants``) and writes ``run.png`` and
``run.svg``: left, the mean reward of the groups trained at each step, with
the means of the first and last five steps drawn as levels; right, the
measured staleness of every trained group beside the prediction
phi + (mu - 1)/2. Steps where a satellite cell took part are marked.

Invariants: pure function of the summary (no clock, no I/O besides the two
files); a summary without steps raises ``ValueError`` naming what is missing.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from gyre.analysis.plotting import house_style, new_figure, save_figure, style_axes


def plot_real_run(summary: dict[str, Any], out_dir: str | Path, stem: str = "run") -> list[Path]:
    curve = list(summary.get("reward_curve") or [])
    if not curve:
        raise ValueError("the run summary has no reward_curve (no step was trained)")
    steps = list(range(1, len(curve) + 1))
    joined = [s for s, cells in zip(steps, summary.get("participants") or []) if len(cells) > 1]
    with house_style():
        fig, (left, right) = new_figure(7.5, 2.8, ncols=2)
        left.plot(steps, curve, marker="o", markersize=3, color="#1f77b4", label="mean reward of trained groups")
        if joined:
            left.plot(joined, [curve[s - 1] for s in joined], "s", markersize=6, markerfacecolor="none",
                      color="#d62728", label="a satellite cell took part")
        k = min(5, len(curve))
        first, last = statistics.fmean(curve[:k]), statistics.fmean(curve[-k:])
        left.hlines([first, last], [1, steps[-k]], [k, steps[-1]], colors="#7f7f7f", linestyles="--")
        left.annotate(f"{first:.3f}", (1, first), textcoords="offset points", xytext=(0, -11), fontsize=7)
        left.annotate(f"{last:.3f} ({last / first:.1f}x)" if first > 0 else f"{last:.3f}", (steps[-k], last),
                      textcoords="offset points", xytext=(0, 5), fontsize=7)
        left.set_xlabel("optimizer step")
        left.set_ylabel("toy reward")
        left.set_title("reward over the run")
        left.legend(loc="upper left", frameon=False)
        staleness = summary.get("staleness_per_group") or []
        right.plot(range(len(staleness)), staleness, ".", color="#2ca02c", label="measured, per group")
        if staleness:
            right.axhline(statistics.fmean(staleness), color="#2ca02c", linewidth=1,
                          label=f"measured mean = {statistics.fmean(staleness):.3g}")
            right.set_ylim(min(staleness) - 0.2, max(staleness) + 0.8)
        predicted = summary.get("staleness_predicted")
        if predicted is not None:
            right.axhline(predicted, color="#7f7f7f", linestyle="--", label=f"phi + (mu-1)/2 = {predicted:g}")
        right.set_xlabel("trained group (feed order)")
        right.set_ylabel("v_t - v_d")
        right.set_title("staleness")
        right.legend(loc="upper left", frameon=False, ncols=2)
        for ax in (left, right):
            style_axes(ax)
        return save_figure(fig, out_dir, stem)
