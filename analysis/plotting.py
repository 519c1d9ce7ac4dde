"""Shared look of the paper figures: colours, figure creation, PNG + SVG output.

Figures are built on ``matplotlib.figure.Figure`` directly, never through
``pyplot``: no global figure state and no GUI backend, so every script runs
headless and in parallel tests. Build and save inside ``house_style()``
so the rc settings (font sizes) apply to every artist. ``save_figure`` writes ``STEM.png`` (150 dpi)
and ``STEM.svg`` and returns both paths.

Invariants: a saved file is never empty (``save_figure`` checks); colours of a
role or a method are the same in every figure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from matplotlib.axes import Axes
from matplotlib.figure import Figure

ROLE_COLORS = {"rollout": "#4C8BD6", "training": "#E07B39", "to_training": "#F4C542", "to_rollout": "#9A7BCB"}
ROLE_LABELS = {"rollout": "rollout", "training": "training", "to_training": "switching to training",
               "to_rollout": "switching to rollout"}
METHOD_COLORS = {"Async": "#7F7F7F", "Colocate": "#4C8BD6", "Gyre": "#D1495B"}
POLICY_COLORS = {"boundary": "#2E86AB", "continuous": "#D1495B"}
FAMILY_COLORS = {"A": "#7F7F7F", "C": "#4C8BD6", "E": "#D1495B"}
HOUR_S = 3600.0

_STYLE = {"font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9, "legend.fontsize": 8,
          "axes.spines.top": False, "axes.spines.right": False, "svg.hashsalt": "gyre"}


def house_style() -> Any:
    """Context manager applying the house rc settings; build and save a figure inside it."""
    import matplotlib

    return matplotlib.rc_context(_STYLE)


def new_figure(width: float, height: float, nrows: int = 1, ncols: int = 1, **subplot_kw: Any) -> tuple[Figure, Any]:
    """A Figure (size in inches, constrained layout) and its axes; call inside ``house_style()``."""
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(nrows, ncols, **subplot_kw)
    return fig, axes


def style_axes(ax: Axes) -> None:
    """Light grid behind the data, no top/right spines."""
    ax.grid(True, color="#DDDDDD", linewidth=0.6)
    ax.set_axisbelow(True)
    ax.spines["top"].set_visible(False)
    ax.spines["right"].set_visible(False)


def save_figure(fig: Figure, out_dir: str | Path, stem: str) -> list[Path]:
    """Write STEM.png and STEM.svg under ``out_dir``; returns the two paths."""
    import matplotlib

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.png", out_dir / f"{stem}.svg"]
    with matplotlib.rc_context({"svg.hashsalt": "gyre", "svg.fonttype": "none"}):
        fig.savefig(paths[0], dpi=150)
        fig.savefig(paths[1], metadata={"Date": None})
    for path in paths:
        if path.stat().st_size == 0:
            raise RuntimeError(f"matplotlib wrote an empty file: {path}")
    return paths


def run_as_script(main: Callable[..., list[Path]]) -> None:
    """The command line of every figure script: ``python FIG.py [OUT_DIR] [--quick]``."""
    import sys

    args = [a for a in sys.argv[1:] if a != "--quick"]
    for path in main(Path(args[0]) if args else Path("figs"), quick="--quick" in sys.argv):
        print(path)
