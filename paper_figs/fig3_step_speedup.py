"""Figure 3: per-step time of each method and Gyre's cumulative speedup.

Async (1.5, 1), Colocate (0, 4) and Gyre (0.5, 3), all at E[d] = 1.5 on the
NL2Repo 122B cluster, 48 steps (quick: 6). Top: each step's share of the wall
clock (``timing.step_durations`` ``wall_s``: waiting for rollout plus the
training span), in hours. Bottom: cumulative speedup of Gyre over Async and
over Colocate at each step, i.e. the other method's time to finish step s
divided by Gyre's (``timing.cumulative_speedup``); above 1 means Gyre is ahead.

``plot(runs, out_dir)`` draws any {"Async": Run, "Colocate": Run, "Gyre": Run}.
"""

from __future__ import annotations

from pathlib import Path

from gyre.analysis.plotting import HOUR_S, METHOD_COLORS, house_style, new_figure, save_figure, style_axes, run_as_script
from gyre.analysis.runs import Run, run_from_result
from gyre.analysis.timing import cumulative_speedup, step_durations

STEM = "fig3_step_speedup"
METHODS = {"Async": "async-1.5", "Colocate": "colocate-1.5", "Gyre": "gyre-1.5"}


def simulate(quick: bool = False, steps: int = 48) -> dict[str, Run]:
    from gyre.sim.runner import run_simulation

    steps = 6 if quick else steps
    return {label: run_from_result(run_simulation(preset, "nl2repo-122b", steps=steps, seed=0), name=label)
            for label, preset in METHODS.items()}


def plot(runs: dict[str, Run], out_dir: Path) -> list[Path]:
    with house_style():
        fig, (top, bottom) = new_figure(7.0, 5.6, 2, 1, sharex=True)
        for label, run in runs.items():
            steps = step_durations(run)
            top.plot(steps["step"], steps["wall_s"] / HOUR_S, marker="o", ms=3, lw=1.2,
                     color=METHOD_COLORS.get(label), label=f"{label} (total {steps['end_s'].max() / HOUR_S:.1f} h)")
        top.set_ylabel("time per step (h)")
        top.set_title("Per-step wall-clock time (rollout wait + training), E[d] = 1.5")
        top.legend(frameon=False, ncol=3, loc="upper center")
        top.set_ylim(0, top.get_ylim()[1] * 1.18)  # headroom for the legend
        style_axes(top)
        for other in ("Async", "Colocate"):
            if other in runs and "Gyre" in runs:
                speed = cumulative_speedup(runs["Gyre"], runs[other])
                bottom.plot(speed["step"], speed["speedup"], lw=1.6, color=METHOD_COLORS[other],
                            label=f"over {other} (final {speed['speedup'].iloc[-1]:.2f}x)")
        bottom.axhline(1.0, color="black", lw=0.8, ls=":")
        bottom.set_xlabel("step")
        bottom.set_ylabel("Gyre cumulative speedup (x)")
        bottom.set_title("Time to finish step s: other method / Gyre")
        bottom.legend(frameon=False, loc="lower right")
        style_axes(bottom)
        return save_figure(fig, out_dir, STEM)


def main(out_dir: Path, quick: bool = False) -> list[Path]:
    return plot(simulate(quick), Path(out_dir))


if __name__ == "__main__":
    run_as_script(main)
