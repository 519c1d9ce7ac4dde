"""The schedule space ``gyre plan`` searches, on one cluster, and how a point becomes a schedule.

A ``Cluster`` is what a user books: ``nodes`` nodes, the cell sizes the
model's training layout allows (``cell_sizes``, in nodes), the concurrent
executions one node serves (``per_node``), and the batch geometry (``N``,
``B``) of the workload. A point of the ``SearchSpace`` is a dict of

| parameter       | meaning                                                                   |
|-----------------|---------------------------------------------------------------------------|
| nodes_per_cell  | cell size, one of ``cell_sizes``                                          |
| cells@S         | K, the number of cells when the cell size is S (1 .. nodes // S)          |
| phi, mu         | dispatch depth and burst length (the staleness knobs)                     |
| rho_min, tau    | the supply check of the transition test                                   |
| streaming       | streaming training on or off                                              |
| granularity     | fine (cells switch one by one), coarse (the cells as one block), global   |

The nodes not in a cell form the separate rollout pool: C_s = (nodes - K *
cell size) * per_node (an idle node never shortens a run, so the pool is not
a free parameter). ``schedule_of(cluster, point)`` turns a point into the
``SchedulerConfig`` field overrides of a ``gyre sim`` run; a point that cannot
be a schedule (cells that do not fit, phi * B not whole, any check of the
policy core's configuration) raises ``Refused`` naming the reason.

Invariants: ``points(space, cluster)`` enumerates every point the sampler can
propose exactly once, in a fixed order (``cells@S`` present only for the
chosen S); ``schedule_of`` is a pure function; a point it accepts builds a
valid ``SchedulerConfig``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Iterator

from gyre.config import ConfigError, SchedulerConfig
from gyre.presets import WORKLOAD_SHAPES, ClusterShape


class Refused(ValueError):
    """A point that cannot be a schedule on the cluster; the message says why."""


@dataclass(frozen=True, kw_only=True)
class Cluster:
    nodes: int
    cell_sizes: tuple[int, ...]
    per_node: int
    N: int
    B: int

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.per_node < 1 or self.N < 1 or self.B < 1:
            raise ValueError(f"nodes, per_node, N and B must be >= 1, got {self.nodes}, {self.per_node}, "
                             f"{self.N}, {self.B}")
        if not self.cell_sizes or any(s < 1 for s in self.cell_sizes):
            raise ValueError(f"cell sizes must be >= 1 node each, got {self.cell_sizes}")
        too_big = [s for s in self.cell_sizes if s > self.nodes]
        if too_big:
            raise ValueError(f"cell size(s) {too_big} exceed the cluster's {self.nodes} nodes")

    def shape(self, nodes_per_cell: int) -> ClusterShape:
        """The presets' cluster shape with cells of ``nodes_per_cell`` (for the Async/Colocate baselines)."""
        return ClusterShape(nodes=self.nodes, nodes_per_cell=nodes_per_cell, per_node_capacity=self.per_node,
                            N=self.N, B=self.B)


def workload_cluster(workload: str, shape: ClusterShape | None = None, cell_sizes: tuple[int, ...] | None = None,
                     nodes: int | None = None) -> Cluster:
    """The cluster of a workload preset (or of a trace's recorded ``shape``), with optional changes."""
    shape = shape or WORKLOAD_SHAPES.get(workload) or WORKLOAD_SHAPES["nl2repo-122b"]
    total = nodes or shape.nodes
    if cell_sizes is None:  # half, the workload's own and twice its cell size, where they fit
        defaults = (shape.nodes_per_cell // 2, shape.nodes_per_cell, shape.nodes_per_cell * 2)
        cell_sizes = tuple(s for s in defaults if 1 <= s <= total) or (total,)
    return Cluster(nodes=total, cell_sizes=tuple(sorted(set(cell_sizes))), per_node=shape.per_node_capacity,
                   N=shape.N, B=shape.B)


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """The values each parameter may take (module docstring); cell counts come from the cluster."""

    phi: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0)
    mu: tuple[int, ...] = (1, 2, 3, 4)
    rho_min: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
    tau: tuple[float, ...] = (0.0, 30.0, 120.0, 600.0)
    streaming: tuple[bool, ...] = (True, False)
    granularity: tuple[str, ...] = ("fine", "coarse", "global")
    fixed: dict[str, Any] = field(default_factory=dict)  # parameters held at one value (not searched)

    def choices(self) -> dict[str, tuple[Any, ...]]:
        """The searched parameters other than the layout, each with its values (fixed ones left out)."""
        return {name: getattr(self, name) for name in ("phi", "mu", "rho_min", "tau", "streaming", "granularity")
                if name not in self.fixed}


def cells_key(size: int) -> str:
    return f"cells@{size}"


def points(space: SearchSpace, cluster: Cluster) -> Iterator[dict[str, Any]]:
    """Every point of the space on the cluster, layout first (module docstring)."""
    choices = space.choices()
    for size in cluster.cell_sizes:
        for cells in range(1, cluster.nodes // size + 1):
            for combo in itertools.product(*choices.values()):
                yield {"nodes_per_cell": size, cells_key(size): cells, **dict(zip(choices, combo)), **space.fixed}


def schedule_of(cluster: Cluster, point: dict[str, Any]) -> dict[str, Any]:
    """``SchedulerConfig`` field overrides for ``point``; ``Refused`` naming why it cannot be a schedule."""
    size = point["nodes_per_cell"]
    cells = point.get(cells_key(size))
    if cells is None:
        raise Refused(f"no cell count {cells_key(size)} in the point")
    if size * cells > cluster.nodes:
        raise Refused(f"layout does not fit: {cells} cells of {size} nodes need {size * cells} of "
                      f"{cluster.nodes} nodes")
    phi = point["phi"]
    if abs(phi * cluster.B - round(phi * cluster.B)) > 1e-9:
        raise Refused(f"phi * B = {phi} * {cluster.B} is not a whole number of groups")
    overrides = {"K": cells, "C_e": size * cluster.per_node, "C_s": (cluster.nodes - size * cells) * cluster.per_node,
                 "nodes_per_cell": size, "N": cluster.N, "B": cluster.B, "static_train_cells": 0,
                 **{k: v for k, v in point.items() if k in ("phi", "mu", "rho_min", "tau", "streaming",
                                                          "granularity")}}
    try:
        SchedulerConfig(**overrides)
    except (ConfigError, TypeError) as exc:
        raise Refused(f"the policy core refuses it: {exc}") from None
    return overrides


def describe(overrides: dict[str, Any], cluster: Cluster) -> str:
    """One line naming a schedule, e.g. ``8 cells x 4 nodes + 0 separate, fine, phi 0.5, mu 3, ...``."""
    separate = cluster.nodes - overrides["K"] * overrides["nodes_per_cell"]
    return (f"{overrides['K']} cells x {overrides['nodes_per_cell']} nodes + {separate} separate, "
            f"{overrides['granularity']}, phi {overrides['phi']:g}, mu {overrides['mu']}, "
            f"rho_min {overrides['rho_min']:g}, tau {overrides['tau']:g} s, "
            f"streaming {'on' if overrides['streaming'] else 'off'}")
