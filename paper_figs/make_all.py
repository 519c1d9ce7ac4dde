"""Regenerate every paper figure headlessly: ``gyre figs --out DIR [--quick]``.

Runs the figure scripts in order, one progress line per figure, and returns
the written paths. Each script is loaded as a sibling module, so this works
both as ``gyre.paper_figs.make_all`` and as ``python paper_figs/make_all.py``.
Quick mode uses tiny runs (the test suite's setting); the full set takes
about two minutes on 2 cores, most of it the Theorem A.1 grid of figure 6.

Invariant: every figure writes a non-empty PNG and SVG or the run fails.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Callable

FIGURES: tuple[str, ...] = (
    "fig1_role_timeline",
    "fig2_durations",
    "fig3_step_speedup",
    "fig4_ablation",
    "fig5_staleness",
    "fig6_theorem",
    "fig7_prefix_graph",
)


def load_figure(name: str) -> ModuleType:
    """The figure script ``name`` from this folder, as a module."""
    if name not in FIGURES:
        raise ValueError(f"unknown figure {name!r}; known: {', '.join(FIGURES)}")
    if __package__:
        return importlib.import_module(f"{__package__}.{name}")
    path = Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"paper_figs_{name}", path)
    if spec.name not in sys.modules:  # registered before it runs: dataclasses look their module up there
        sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(sys.modules[spec.name])
        except BaseException:
            del sys.modules[spec.name]
            raise
    return sys.modules[spec.name]


def make_all(out_dir: Path, quick: bool = False, only: tuple[str, ...] | None = None,
             progress: Callable[[str], None] | None = print) -> list[Path]:
    """Run the chosen figures (all by default) into ``out_dir``; returns every written file."""
    out_dir = Path(out_dir)
    written: list[Path] = []
    chosen = only or FIGURES
    for i, name in enumerate(chosen, start=1):
        t0 = time.perf_counter()
        paths = load_figure(name).main(out_dir, quick=quick)
        written += paths
        if progress:
            progress(f"[{i}/{len(chosen)}] {name}: {', '.join(p.name for p in paths)} "
                     f"({time.perf_counter() - t0:.1f} s)")
    return written


if __name__ == "__main__":
    make_all(Path(sys.argv[1]) if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else Path("figs"),
             quick="--quick" in sys.argv)
