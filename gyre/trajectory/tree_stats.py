"""Statistics of one trajectory tree (``gyre traj stats``).

Definitions (all computed in one pass over the nodes, never by expanding
paths):
- ``nodes``: nodes of the tree, virtual root excluded; ``roots``: children of
  the virtual root; ``leaves``: nodes without children (candidate trajectories);
- ``unique_tokens``: positions stored once; ``trainable_tokens``: positions
  whose provenance is SAMPLED;
- ``expanded_tokens``: tokens if every root-to-leaf path were stored
  separately (sum over leaves of the path length);
- ``node_occurrences``: sum over leaves of the path length in nodes;
  ``repeated_node_occurrences = node_occurrences - nodes`` (every node lies on
  at least one path, so this counts the repeats expansion would store);
- ``shared_prefixes``: one entry per branch node (two or more children, the
  virtual root excluded): the prefix all its branches share, in nodes and
  tokens, deepest first.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from gyre.trajectory.tree import ROOT, TrajectoryTree


@dataclass(frozen=True)
class SharedPrefix:
    node: int
    depth_nodes: int
    depth_tokens: int
    branches: int


@dataclass(frozen=True)
class TreeStats:
    execution_id: str
    requests: int
    nodes: int
    roots: int
    leaves: int
    unique_tokens: int
    trainable_tokens: int
    expanded_tokens: int
    node_occurrences: int
    repeated_node_occurrences: int
    path_nodes: tuple[int, ...]  # per leaf, leaves in id order
    path_tokens: tuple[int, ...]
    shared_prefixes: tuple[SharedPrefix, ...]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def format(self) -> str:
        lines = [
            f"execution          {self.execution_id}",
            f"requests           {self.requests}",
            f"nodes              {self.nodes} ({self.roots} roots, {self.leaves} leaves)",
            f"unique tokens      {self.unique_tokens} ({self.trainable_tokens} trainable)",
            f"expanded tokens    {self.expanded_tokens} ({_ratio(self.expanded_tokens, self.unique_tokens)} of unique)",
            f"node occurrences   {self.node_occurrences} ({self.repeated_node_occurrences} repeats)",
        ]
        if self.path_nodes:
            lines.append(f"path nodes         {min(self.path_nodes)}..{max(self.path_nodes)}")
            lines.append(f"path tokens        {min(self.path_tokens)}..{max(self.path_tokens)}")
        shown = ", ".join(f"{p.depth_nodes} nodes/{p.depth_tokens} tok x{p.branches}" for p in self.shared_prefixes[:8])
        more = f" (+{len(self.shared_prefixes) - 8} more)" if len(self.shared_prefixes) > 8 else ""
        lines.append(f"shared prefixes    {shown or 'none'}{more}")
        return "\n".join(lines)


def _ratio(a: int, b: int) -> str:
    return f"{a / b:.2f}x" if b else "n/a"


def node_depths(tree: TrajectoryTree) -> tuple[dict[int, int], dict[int, int]]:
    """Depth of every node in nodes and in tokens (end of its range), virtual root 0."""
    depth_nodes = {ROOT: 0}
    depth_tokens = {ROOT: 0}
    stack = [ROOT]
    while stack:
        node = stack.pop()
        for child in tree.children(node):
            start, end = tree.node_range(child)
            depth_nodes[child] = depth_nodes[node] + 1
            depth_tokens[child] = depth_tokens[node] + end - start
            stack.append(child)
    return depth_nodes, depth_tokens


def tree_stats(tree: TrajectoryTree) -> TreeStats:
    depth_nodes, depth_tokens = node_depths(tree)
    leaves = tree.leaves()
    path_nodes = tuple(depth_nodes[leaf] for leaf in leaves)
    path_tokens = tuple(depth_tokens[leaf] for leaf in leaves)
    branch_nodes = [n for n in depth_nodes if n != ROOT and len(tree.children(n)) >= 2]
    shared = sorted(
        (SharedPrefix(n, depth_nodes[n], depth_tokens[n], len(tree.children(n))) for n in branch_nodes),
        key=lambda p: (-p.depth_nodes, p.node),
    )
    occurrences = sum(path_nodes)
    return TreeStats(
        execution_id=tree.execution_id,
        requests=tree.num_requests,
        nodes=tree.num_nodes,
        roots=len(tree.roots()),
        leaves=len(leaves),
        unique_tokens=tree.num_tokens,
        trainable_tokens=int(tree.trainable.sum()),
        expanded_tokens=sum(path_tokens),
        node_occurrences=occurrences,
        repeated_node_occurrences=occurrences - tree.num_nodes,
        path_nodes=path_nodes,
        path_tokens=path_tokens,
        shared_prefixes=tuple(shared),
    )
