"""Figure 4: the ablation family (docs/scheduler.md#baselines-and-ablations) against E0.

Each bar is a preset's total time for 12 steps (quick: 3) on the NL2Repo 122B
cluster divided by E0's (above 1: slower than E0), coloured by family (A:
Async variants, C: Colocate variants, E: elastic cells). The label at each bar
gives the ratio and the preset's total hours; the right-hand labels repeat the
preset's description.

``figure_data(quick)`` computes the table the figure draws (one row per
preset, in the order of docs/scheduler.md#baselines-and-ablations: total_h, ratio, description),
``ablation_data(totals_h)`` builds it for any {preset: total hours} that
contains E0, and ``draw(table)`` turns it into a Figure.

Invariants: ``ratio`` = ``total_h`` / E0's ``total_h``, so E0's ratio is
exactly 1; bars are drawn first preset on top.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from gyre.analysis.plotting import FAMILY_COLORS, house_style, new_figure, run_as_script, save_figure, style_axes
from gyre.analysis.runs import run_from_result
from gyre.analysis.timing import total_hours

STEM = "fig4_ablation"


def simulate(quick: bool = False) -> dict[str, float]:
    """Total hours per ablation preset, in the order of docs/scheduler.md#baselines-and-ablations."""
    from gyre.presets import ABLATION_NAMES
    from gyre.sim.runner import run_simulation

    steps = 3 if quick else 12
    return {name: total_hours(run_from_result(run_simulation(name, "nl2repo-122b", steps=steps, seed=0)))
            for name in ABLATION_NAMES}


def figure_data(quick: bool = False) -> pd.DataFrame:
    """The table of figure 4, from the runs of ``simulate(quick)``."""
    return ablation_data(simulate(quick))


def ablation_data(totals_h: dict[str, float]) -> pd.DataFrame:
    """One row per preset (given order): total_h, ratio to E0, description; ValueError without E0."""
    from gyre.presets import PRESETS

    if "E0" not in totals_h:
        raise ValueError("the ablation figure needs E0 as its reference")
    names = list(totals_h)
    return pd.DataFrame({"total_h": [totals_h[n] for n in names],
                         "ratio": [totals_h[n] / totals_h["E0"] for n in names],
                         "description": [PRESETS[n].description for n in names]},
                        index=pd.Index(names, name="preset"))


def draw(table: pd.DataFrame) -> Figure:
    """Figure 4 from its table: one horizontal bar per preset, first preset on top."""
    rows = table.iloc[::-1]
    names, ratios = list(rows.index), list(rows["ratio"])
    with house_style():
        fig, ax = new_figure(7.5, 4.6)
        bars = ax.barh(names, ratios, color=[FAMILY_COLORS.get(n[0], "#999999") for n in names], height=0.65)
        for bar, ratio, total in zip(bars, ratios, rows["total_h"]):
            ax.text(bar.get_width() + 0.01, bar.get_y() + bar.get_height() / 2,
                    f"{ratio:.2f}x  ({total:.1f} h)", va="center", fontsize=7.5)
        for family, label in (("A", "Async family"), ("C", "Colocate family"), ("E", "elastic cells (Gyre)")):
            ax.bar(0, 0, color=FAMILY_COLORS[family], label=label)
        fig.legend(loc="outside lower center", ncol=3, frameon=False)
        ax.axvline(1.0, color="black", lw=0.8, ls=":")
        ax.set_xlim(0, max(ratios) * 1.25)
        ax.set_xlabel("total time relative to E0 (x; above 1 = slower than E0)")
        ax.set_ylabel("preset")
        ax.set_title("Ablations at E[d] = 1.5: total time for the same steps, relative to E0")
        secondary = ax.secondary_yaxis("right")
        secondary.set_yticks(range(len(names)), [_short(d) for d in rows["description"]], fontsize=6.5)
        secondary.tick_params(length=0)
        style_axes(ax)
        return fig


def _short(text: str, width: int = 46) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def main(out_dir: Path, quick: bool = False, data=None, save=save_figure) -> list[Path]:
    """Draw the figure (of ``data``, else of ``figure_data(quick)``) and ``save`` it as PNG and SVG."""
    with house_style():
        return save(draw(figure_data(quick) if data is None else data), Path(out_dir), STEM)


if __name__ == "__main__":
    run_as_script(main)
