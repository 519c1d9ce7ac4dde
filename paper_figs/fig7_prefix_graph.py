"""Figure 7: the trajectory-tree prefix graph of one long execution.

Data: the seeded synthetic execution shaped like docs/trajectories.md#trajectory-trees (main agent with
a compaction, three sub-agents on their own roots, one with a compaction,
retries; ``gyre.trajectory.synthetic``), recorded into a trajectory tree
exactly as the proxy records real calls, and drawn with the same renderer as
``gyre traj show``: each node is a segment from its first to its last token
depth, leaves are rows, colours are the Claude Code role classes of the
leaves below a node (black where roles are mixed). Quick mode uses a smaller
execution with the same structure.

``figure_data(quick)`` computes what the figure draws (a ``PrefixGraphData``:
the tree, its statistics, the role of every leaf and the layout boxes);
``main`` hands those boxes to the shared renderer
(``gyre.analysis.prefix_graph.draw_image``), once per file.

Invariants: the drawing is a pure function of the seed and the shape; there
is one box per tree node (``stats.nodes``), one leaf row per candidate
trajectory (``stats.leaves``), and the title quotes ``stats``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gyre.analysis.plotting import run_as_script

SEED = 0
STEM = "fig7_prefix_graph"


def build_tree(quick: bool = False):
    """The recorded synthetic execution as a closed trajectory tree."""
    from gyre.trajectory.synthetic import ExecutionShape, synthetic_execution
    from gyre.trajectory.tree import TrajectoryTree

    shape = ExecutionShape()
    if quick:
        shape = ExecutionShape(main_segments=(12, 8), subagent_segments=((10, 4), (5,), (4,)),
                               spawn_turns=(3, 9, 9), retry_turns=(("main", 5), ("sub-1", 6)),
                               main_system_tokens=1_200, subagent_system_tokens=300)
    tree = TrajectoryTree.from_records(synthetic_execution(np.random.default_rng(SEED), shape))
    tree.close()
    return tree


@dataclass(frozen=True)
class PrefixGraphData:
    """What figure 7 draws (see the module docstring for the invariants)."""

    tree: Any  # gyre.trajectory.tree.TrajectoryTree, closed
    stats: Any  # gyre.trajectory.tree_stats.TreeStats of the tree
    roles: dict[int, str]  # Claude Code role class of every leaf
    boxes: list  # gyre.analysis.prefix_graph.NodeBox per node, parents before children
    title: str


def figure_data(quick: bool = False) -> PrefixGraphData:
    """The data of figure 7: the recorded synthetic execution and its prefix-graph layout."""
    from gyre.analysis.prefix_graph import prefix_layout
    from gyre.trajectory.harness_roles import leaf_roles, roles_for
    from gyre.trajectory.tree_stats import tree_stats

    tree = build_tree(quick)
    stats = tree_stats(tree)
    title = (f"one execution: {stats.requests} requests, {stats.nodes} nodes, {stats.leaves} candidate "
             f"trajectories (x axis: token depth)")
    roles = leaf_roles(tree, roles_for("claude-code"))
    return PrefixGraphData(tree, stats, roles, prefix_layout(tree, roles), title)


def main(out_dir: Path, quick: bool = False, data: PrefixGraphData | None = None) -> list[Path]:
    """Draw the figure (of ``data``, else of ``figure_data(quick)``) as PNG and SVG into ``out_dir``."""
    from gyre.analysis.prefix_graph import draw_image

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    data = figure_data(quick) if data is None else data
    paths = [out_dir / f"{STEM}{suffix}" for suffix in (".png", ".svg")]
    for path in paths:
        draw_image(data.tree, data.boxes, path, data.title)
        if path.stat().st_size == 0:
            raise RuntimeError(f"empty figure file: {path}")
    return paths


if __name__ == "__main__":
    run_as_script(main)
