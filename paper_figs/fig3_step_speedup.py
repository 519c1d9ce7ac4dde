"""Figure 3: per-step time of each method and Gyre's cumulative speedup.

Async (1.5, 1), Colocate (0, 4) and Gyre (0.5, 3), all at E[d] = 1.5 on the
NL2Repo 122B cluster, 48 steps (quick: 6). Top: each step's share of the wall
clock (``timing.step_durations`` ``wall_s``: waiting for rollout plus the
training span), in hours. Bottom: cumulative speedup of Gyre over Async and
over Colocate at each step, i.e. the other method's time to finish step s
divided by Gyre's (``timing.cumulative_speedup``); above 1 means Gyre is ahead.

``figure_data(quick)`` computes what the figure draws (a ``SpeedupData``),
``speedup_data(runs)`` does so for any {"Async": Run, "Colocate": Run,
"Gyre": Run} and ``draw(data)`` turns it into a Figure.

Invariants: per method, ``wall_h`` accumulates to ``end_h`` (the step's end
time); ``speedup`` = the other method's ``end_h`` / Gyre's ``end_h`` at the
same step, over the steps both completed; ``totals_h`` is each method's last
``end_h``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from gyre.analysis.plotting import (
    HOUR_S,
    METHOD_COLORS,
    house_style,
    new_figure,
    run_as_script,
    save_figure,
    style_axes,
)
from gyre.analysis.runs import Run, run_from_result
from gyre.analysis.timing import cumulative_speedup, step_durations

STEM = "fig3_step_speedup"
METHODS = {"Async": "async-1.5", "Colocate": "colocate-1.5", "Gyre": "gyre-1.5"}


def simulate(quick: bool = False, steps: int = 48) -> dict[str, Run]:
    from gyre.sim.runner import run_simulation

    steps = 6 if quick else steps
    return {label: run_from_result(run_simulation(preset, "nl2repo-122b", steps=steps, seed=0), name=label)
            for label, preset in METHODS.items()}


@dataclass(frozen=True)
class SpeedupData:
    """What figure 3 draws (see the module docstring for the invariants)."""

    per_step: pd.DataFrame  # method, step, wall_h, end_h: one row per completed step, methods in order
    totals_h: dict[str, float]  # method -> hours to its last completed step
    speedup: pd.DataFrame  # over, step, run_end_s (Gyre), baseline_end_s (the other method), speedup


def figure_data(quick: bool = False) -> SpeedupData:
    """The data of figure 3, from the three runs of ``simulate(quick)``."""
    return speedup_data(simulate(quick))


def speedup_data(runs: dict[str, Run]) -> SpeedupData:
    """Per-step times of every run, and Gyre's cumulative speedup over Async and Colocate when present."""
    per_step = pd.concat([_per_step(label, run) for label, run in runs.items()], ignore_index=True)
    totals = {label: float(rows["end_h"].max()) for label, rows in per_step.groupby("method", sort=False)}
    return SpeedupData(per_step, totals, _speedups(runs))


def _speedups(runs: dict[str, Run]) -> pd.DataFrame:
    columns = ["over", "step", "run_end_s", "baseline_end_s", "speedup"]
    frames = [cumulative_speedup(runs["Gyre"], runs[other]).assign(over=other)[columns]
              for other in ("Async", "Colocate") if other in runs and "Gyre" in runs]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def _per_step(label: str, run: Run) -> pd.DataFrame:
    steps = step_durations(run)
    return pd.DataFrame({"method": label, "step": steps["step"], "wall_h": steps["wall_s"] / HOUR_S,
                         "end_h": steps["end_s"] / HOUR_S})


def draw(data: SpeedupData) -> Figure:
    """Figure 3 from its data: per-step times on top, cumulative speedups below."""
    with house_style():
        fig, (top, bottom) = new_figure(7.0, 5.6, 2, 1, sharex=True)
        for label, steps in data.per_step.groupby("method", sort=False):
            top.plot(steps["step"], steps["wall_h"], marker="o", ms=3, lw=1.2, color=METHOD_COLORS.get(label),
                     label=f"{label} (total {data.totals_h[label]:.1f} h)")
        top.set_ylabel("time per step (h)")
        top.set_title("Per-step wall-clock time (rollout wait + training), E[d] = 1.5")
        top.legend(frameon=False, ncol=3, loc="upper center")
        top.set_ylim(0, top.get_ylim()[1] * 1.18)  # headroom for the legend
        style_axes(top)
        for other, speed in data.speedup.groupby("over", sort=False):
            bottom.plot(speed["step"], speed["speedup"], lw=1.6, color=METHOD_COLORS[other],
                        label=f"over {other} (final {speed['speedup'].iloc[-1]:.2f}x)")
        bottom.axhline(1.0, color="black", lw=0.8, ls=":")
        bottom.set_xlabel("step")
        bottom.set_ylabel("Gyre cumulative speedup (x)")
        bottom.set_title("Time to finish step s: other method / Gyre")
        bottom.legend(frameon=False, loc="lower right")
        style_axes(bottom)
        return fig


def main(out_dir: Path, quick: bool = False, data=None, save=save_figure) -> list[Path]:
    """Draw the figure (of ``data``, else of ``figure_data(quick)``) and ``save`` it as PNG and SVG."""
    with house_style():
        return save(draw(figure_data(quick) if data is None else data), Path(out_dir), STEM)


if __name__ == "__main__":
    run_as_script(main)
