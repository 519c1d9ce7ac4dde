"""Figure 1: role timeline of one burst of Gyre (E0).

Top: one row per cell, coloured by role over time (rollout, training, and the
two transition directions), with step spans, publications (dashed lines: the
core publishes to the rollout engines) and satellites joining a step already
in flight (triangles, labelled with the step they join). Bottom: executions
running in rollout over the same window, which shows why cells may switch:
the waterlevel falls as long executions finish.

Data: ``gyre sim --preset E0 --steps 12`` (quick: 6 steps); the burst shown
is the one after the first with the most satellite joins (``busiest_burst``). ``plot(run, out_dir)`` draws any run.
"""

from __future__ import annotations

from pathlib import Path

from gyre.analysis.plotting import HOUR_S, ROLE_COLORS, ROLE_LABELS, house_style, new_figure, save_figure, style_axes, run_as_script
from gyre.analysis.runs import Run, run_from_result
from gyre.analysis.timeline import burst_span, publications, running_executions, satellite_joins

STEM = "fig1_role_timeline"
#: Switches last seconds in a burst of hours; draw each at least this share of the window wide.
MIN_SWITCH_WIDTH = 0.008


def simulate(quick: bool = False) -> Run:
    from gyre.sim.runner import run_simulation

    return run_from_result(run_simulation("E0", "nl2repo-122b", steps=6 if quick else 12, seed=0), name="E0")


def _draw_roles(ax, run: Run, t0: float, t1: float) -> None:
    switches_last = run.roles.assign(is_switch=run.roles["role"].str.startswith("to_")).sort_values("is_switch")
    for row in switches_last.itertuples():
        start, end = max(row.start_s, t0), min(row.end_s, t1)
        if end <= start:
            continue
        if row.role.startswith("to_"):  # widen few-second switches so they stay visible
            start, end = start, start + max(end - start, (t1 - t0) * MIN_SWITCH_WIDTH)
        width = end - start
        ax.broken_barh([((start - t0) / HOUR_S, width / HOUR_S)], (row.cell - 0.4, 0.8),
                       facecolors=ROLE_COLORS[row.role], edgecolor="none")
    for role, colour in ROLE_COLORS.items():
        ax.bar(0, 0, color=colour, label=ROLE_LABELS[role])


def _draw_markers(ax, run: Run, t0: float, t1: float, cells: int, shown: range) -> None:
    steps = run.steps[run.steps["step"].isin(list(shown)) & run.steps["end_s"].notna()]
    for s in steps.itertuples():
        left, right = (max(s.start_s, t0) - t0) / HOUR_S, (min(s.end_s, t1) - t0) / HOUR_S
        ax.annotate("", xy=(left, cells - 0.2), xytext=(right, cells - 0.2),
                    arrowprops={"arrowstyle": "|-|", "color": "#444444", "lw": 0.8, "mutation_scale": 3})
        ax.text((left + right) / 2, cells + 0.2, f"step {int(s.step)}", ha="center", va="center", fontsize=7)
    pubs = publications(run)
    for i, p in enumerate(pubs[(pubs["start_s"] >= t0) & (pubs["start_s"] <= t1)].itertuples()):
        ax.axvline((p.start_s - t0) / HOUR_S, color="black", ls="--", lw=1.0,
                   label="publication (new weights to rollout)" if i == 0 else None)
    joins = satellite_joins(run)
    joins = joins[(joins["joined_at_s"] >= t0) & (joins["joined_at_s"] <= t1)]
    ax.scatter((joins["joined_at_s"] - t0) / HOUR_S, joins["cell"], marker=">", s=40, color="black", zorder=5,
               label="satellite joins an in-flight step")
    for j in joins.itertuples():
        ax.text((j.joined_at_s - t0) / HOUR_S, j.cell + 0.45, f"joins step {j.step}", fontsize=6.5, va="bottom")


def busiest_burst(run: Run) -> int:
    """The completed burst after the first with the most satellite joins (earliest on ties; 0 if none)."""
    mu = int(run.config.get("mu", 1))
    done = int(run.steps["end_s"].notna().sum()) // mu
    joins = satellite_joins(run)["step"] // mu
    candidates = list(range(1, done)) or [0]
    return max(candidates, key=lambda b: (int((joins == b).sum()), -b))


def plot(run: Run, out_dir: Path, burst: int | None = None) -> list[Path]:
    burst = busiest_burst(run) if burst is None else burst
    start, end = burst_span(run, burst)
    t0, t1 = start - 0.02 * (end - start), end + 0.02 * (end - start)  # margins show both publications
    cells = int(run.roles["cell"].max()) + 1
    with house_style():
        fig, (ax, ax_load) = new_figure(7.5, 5.2, 2, 1, sharex=True, height_ratios=(3, 1.2))
        _draw_roles(ax, run, t0, t1)
        mu = int(run.config.get("mu", 1))
        _draw_markers(ax, run, t0, t1, cells, range(burst * mu, (burst + 1) * mu))
        ax.set_yticks(range(cells), [f"cell {c}" + (" (core)" if c == 0 else "") for c in range(cells)])
        ax.set_ylim(-0.6, cells + 0.5)
        ax.invert_yaxis()
        ax.set_title(f"{run.name or 'run'}: cell roles over burst {burst} (steps {burst * mu}..{(burst + 1) * mu - 1})")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=3, frameon=False,
                  title=f"switches (a few seconds) are drawn at least {MIN_SWITCH_WIDTH:.1%} of the window wide",
                  title_fontsize=7)
        load = running_executions(run)
        ax_load.step((load["time_s"] - t0) / HOUR_S, load["running"], where="post", color=ROLE_COLORS["rollout"])
        ax_load.set_xlim(0, (t1 - t0) / HOUR_S)
        ax_load.set_ylim(bottom=0)
        ax_load.set_xlabel(f"time (h) from {t0 / HOUR_S:.2f} h into the run; the burst starts at "
                           f"{(start - t0) / HOUR_S:.2f} h on this axis")
        ax_load.set_ylabel("running\nexecutions")
        style_axes(ax_load)
        return save_figure(fig, out_dir, STEM)


def main(out_dir: Path, quick: bool = False) -> list[Path]:
    return plot(simulate(quick), Path(out_dir))


if __name__ == "__main__":
    run_as_script(main)
