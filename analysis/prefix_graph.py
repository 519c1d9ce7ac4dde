"""Drawing a trajectory tree's prefix graph (``gyre traj show``).

Layout (pure, ``prefix_layout``): every node is a horizontal segment from the
token depth where it starts to the token depth where it ends; leaves get rows
0, 1, 2, ... in depth-first order (children by first-token position), an
inner node sits at the mean row of its children. A node's colour is the role
of the leaves below it when they agree, ``shared`` otherwise.

Output by file suffix: ``.dot`` writes Graphviz text (no dependency);
``.png``, ``.svg`` and ``.pdf`` draw with matplotlib (imported on use, Agg
backend). Any other suffix raises ``ValueError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gyre.trajectory.tree import ROOT, TrajectoryTree

SHARED = "shared"
ROLE_COLOURS = {"main": "tab:blue", "main-summary": "tab:cyan", "sub-agent": "tab:orange",
                "sub-agent-summary": "tab:red", "auxiliary": "tab:gray", SHARED: "black"}
DOT_COLOURS = {role: colour.removeprefix("tab:") for role, colour in ROLE_COLOURS.items()}
IMAGE_SUFFIXES = (".png", ".svg", ".pdf")


@dataclass(frozen=True)
class NodeBox:
    node: int
    parent: int
    x0: int  # token depth where the node starts
    x1: int  # token depth where it ends
    row: float
    role: str


def prefix_layout(tree: TrajectoryTree, roles_by_leaf: dict[int, str]) -> list[NodeBox]:
    """One box per node (virtual root excluded), parents before children."""
    order, x0 = _preorder(tree)
    rows: dict[int, float] = {}
    role: dict[int, str] = {}
    next_row = 0
    for node in reversed(order):  # children before parents
        children = tree.children(node)
        if not children:
            rows[node], next_row = float(next_row), next_row + 1
            role[node] = roles_by_leaf.get(node, SHARED)
        else:
            rows[node] = sum(rows[c] for c in children) / len(children)
            child_roles = {role[c] for c in children}
            role[node] = child_roles.pop() if len(child_roles) == 1 else SHARED
    # leaves were numbered in reverse order; flip so the first leaf is row 0
    top = next_row - 1
    return [NodeBox(n, tree.parent(n), x0[n], x0[n] + _length(tree, n), top - rows[n], role[n]) for n in order]


def _length(tree: TrajectoryTree, node: int) -> int:
    start, end = tree.node_range(node)
    return end - start


def _preorder(tree: TrajectoryTree) -> tuple[list[int], dict[int, int]]:
    order: list[int] = []
    x0: dict[int, int] = {}
    stack = [(child, 0) for child in reversed(tree.children(ROOT))]
    while stack:
        node, depth = stack.pop()
        order.append(node)
        x0[node] = depth
        end = depth + _length(tree, node)
        stack.extend((child, end) for child in reversed(tree.children(node)))
    return order, x0


def write_dot(tree: TrajectoryTree, boxes: list[NodeBox], path: Path) -> None:
    lines = [f'digraph "{tree.execution_id}" {{', "  rankdir=LR; node [shape=box, fontsize=9];"]
    for box in boxes:
        requests = len(tree.requests_at(box.node))
        label = f"n{box.node}\\n{box.x1 - box.x0} tok" + (f"\\n{requests} req" if requests else "")
        lines.append(f'  n{box.node} [label="{label}", color="{DOT_COLOURS.get(box.role, "black")}"];')
        if box.parent != ROOT:
            lines.append(f"  n{box.parent} -> n{box.node};")
    lines.append("}")
    path.write_text("\n".join(lines) + "\n")


def draw_image(tree: TrajectoryTree, boxes: list[NodeBox], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import LineCollection

    fig, ax = plt.subplots(figsize=(12, max(3.0, 0.35 * (max((b.row for b in boxes), default=0) + 2))))
    by_id = {b.node: b for b in boxes}
    segments = [[(b.x0 / 1e3, b.row), (b.x1 / 1e3, b.row)] for b in boxes]
    colours = [ROLE_COLOURS.get(b.role, "black") for b in boxes]
    ax.add_collection(LineCollection(segments, colors=colours, linewidths=2.5))
    links = [[(b.x0 / 1e3, by_id[b.parent].row), (b.x0 / 1e3, b.row)] for b in boxes if b.parent in by_id]
    ax.add_collection(LineCollection(links, colors="lightgray", linewidths=0.8))
    parents = {b.parent for b in boxes}
    leaves = [b for b in boxes if b.node not in parents]
    ax.scatter([b.x1 / 1e3 for b in leaves], [b.row for b in leaves], s=18, zorder=3,
               c=[ROLE_COLOURS.get(b.role, "black") for b in leaves])
    for role in sorted({b.role for b in boxes}):
        ax.plot([], [], color=ROLE_COLOURS.get(role, "black"), label=role, linewidth=2.5)
    ax.autoscale()
    ax.set_xlabel("token depth (thousands)")
    ax.set_yticks([])
    ax.set_title(title, fontsize=9)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def render_prefix_graph(tree: TrajectoryTree, roles_by_leaf: dict[int, str], out: str | Path, title: str = "") -> Path:
    """Write the prefix graph to ``out`` (format by suffix, see module docstring)."""
    out = Path(out)
    suffix = out.suffix.lower()
    if suffix != ".dot" and suffix not in IMAGE_SUFFIXES:
        raise ValueError(f"cannot draw to {out.name!r}: use .dot, {', '.join(IMAGE_SUFFIXES)}")
    boxes = prefix_layout(tree, roles_by_leaf)
    if suffix == ".dot":
        write_dot(tree, boxes, out)
    else:
        draw_image(tree, boxes, out, title or tree.execution_id)
    return out
