"""Named schedules: the ablation family of docs/scheduler.md#baselines-and-ablations and the three methods.

A preset is a function of a cluster shape returning a ``SchedulerConfig``; the
registry ``PRESETS`` maps names to them. ``build_preset(name, shape, **over)``
applies field overrides (``--set phi=0.5``) on top and validates.

Shapes: ``PAPER_SHAPE`` is the Qwen of docs/workload.md#workload-profile 3.6 122B NL2Repo cluster (32 nodes,
4-node cells, 144 concurrent executions per cell = 36 per node, B = 32,
N = 16). Ablation allocations are stated as fractions of the nodes, so they
scale to other shapes (rounded down to whole cells): A0 trains on 1/2 of the nodes, A1 on 1/4, C1/C2 colocate
7/8 and keep 1/8 separate, C3 colocates 1/2, E2 uses cells twice as large.

Invariant: every registered preset builds a valid configuration on every
shape in ``WORKLOAD_SHAPES``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from gyre.config import ConfigError, Granularity, SchedulerConfig


@dataclass(frozen=True, kw_only=True)
class ClusterShape:
    """Hardware and batch geometry that the presets allocate."""

    nodes: int = 32
    nodes_per_cell: int = 4
    per_node_capacity: int = 36
    N: int = 16
    B: int = 32

    def cells(self, nodes: int, nodes_per_cell: int | None = None) -> int:
        npc = nodes_per_cell or self.nodes_per_cell
        if nodes % npc:
            raise ConfigError(f"{nodes} nodes do not split into cells of {npc} nodes")
        return nodes // npc

    def cells_for(self, fraction: float) -> int:
        """Whole cells covering ``fraction`` of the nodes, rounded down, at least one."""
        return max(1, int(self.nodes * fraction + 1e-9) // self.nodes_per_cell)


PAPER_SHAPE = ClusterShape()
#: Cluster geometry per workload (docs/workload.md#workload-profile). nl2repo-2.4t: 4 cells of 48 nodes
#: and 384 concurrent executions in all; its B is not given by the paper, we use 16.
WORKLOAD_SHAPES: dict[str, ClusterShape] = {
    "nl2repo-122b": PAPER_SHAPE,
    "nl2repo-2.4t": ClusterShape(nodes=192, nodes_per_cell=48, per_node_capacity=2, B=16),
    "deepswe": ClusterShape(nodes=24, per_node_capacity=48, B=48),
    "terminalbench": ClusterShape(nodes=24, per_node_capacity=48, B=48),
}


def async_split(shape: ClusterShape, *, phi: float, mu: int, train_fraction: float = 0.5,
                streaming: bool = False) -> SchedulerConfig:
    """Static split: a prefix of cells trains forever, the rest roll out (Async)."""
    return SchedulerConfig(
        K=shape.cells(shape.nodes), C_e=shape.nodes_per_cell * shape.per_node_capacity, C_s=0,
        N=shape.N, B=shape.B, phi=phi, mu=mu, granularity="none", streaming=streaming,
        static_train_cells=shape.cells_for(train_fraction), nodes_per_cell=shape.nodes_per_cell)


def colocated(shape: ClusterShape, *, phi: float, mu: int, colocated_fraction: float = 1.0,
              streaming: bool = False, granularity: Granularity = "coarse") -> SchedulerConfig:
    """One colocated block switching as a unit, beside a separate rollout pool."""
    block_cells = shape.cells_for(colocated_fraction)
    return SchedulerConfig(
        K=block_cells, C_e=shape.nodes_per_cell * shape.per_node_capacity,
        C_s=(shape.nodes - block_cells * shape.nodes_per_cell) * shape.per_node_capacity, N=shape.N, B=shape.B,
        phi=phi, mu=mu, granularity=granularity, streaming=streaming,
        nodes_per_cell=shape.nodes_per_cell)


def elastic(shape: ClusterShape, *, phi: float, mu: int, cell_scale: int = 1,
            streaming: bool = True) -> SchedulerConfig:
    """Fine-grained elastic cells switching one by one by the waterlevel rule (Gyre)."""
    npc = shape.nodes_per_cell * cell_scale
    return SchedulerConfig(
        K=shape.cells(shape.nodes, npc), C_e=npc * shape.per_node_capacity, C_s=0,
        N=shape.N, B=shape.B, phi=phi, mu=mu, granularity="fine", streaming=streaming,
        nodes_per_cell=npc)


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    build: Callable[[ClusterShape], SchedulerConfig]


def _p(name: str, description: str, build: Callable[[ClusterShape], SchedulerConfig]) -> Preset:
    return Preset(name, description, build)


_ABLATION = (
    _p("A0", "vanilla Async: 1/2 train, 1/2 rollout, (1.5, 1), no streaming",
       lambda s: async_split(s, phi=1.5, mu=1)),
    _p("A1", "A0 repartitioned: 1/4 train, 3/4 rollout",
       lambda s: async_split(s, phi=1.5, mu=1, train_fraction=0.25)),
    _p("A2", "A0 + multi-step burst (0.5, 3)", lambda s: async_split(s, phi=0.5, mu=3)),
    _p("A3", "A0 + streaming", lambda s: async_split(s, phi=1.5, mu=1, streaming=True)),
    _p("C0", "vanilla Colocate: all nodes switch globally, (0, 4)",
       lambda s: colocated(s, phi=0.0, mu=4, granularity="global")),
    _p("C1", "C0 + separate rollout nodes: 7/8 colocated, 1/8 separate, (0.5, 3)",
       lambda s: colocated(s, phi=0.5, mu=3, colocated_fraction=0.875)),
    _p("C2", "C1 + streaming",
       lambda s: colocated(s, phi=0.5, mu=3, colocated_fraction=0.875, streaming=True)),
    _p("C3", "C2 reallocated: 1/2 colocated, 1/2 separate",
       lambda s: colocated(s, phi=0.5, mu=3, colocated_fraction=0.5, streaming=True)),
    _p("E0", "C2 + fine-grained elastic cells (0.5, 3)", lambda s: elastic(s, phi=0.5, mu=3)),
    _p("E1", "E0 with single-step bursts (1.5, 1)", lambda s: elastic(s, phi=1.5, mu=1)),
    _p("E2", "E0 with cells twice as large", lambda s: elastic(s, phi=0.5, mu=3, cell_scale=2)),
)

_METHODS = (
    _p("async-1.5", "Async at E[d]=1.5: (1.5, 1), static half split",
       lambda s: async_split(s, phi=1.5, mu=1)),
    _p("colocate-1.5", "Colocate at E[d]=1.5: (0, 4), global switch",
       lambda s: colocated(s, phi=0.0, mu=4, granularity="global")),
    _p("gyre-1.5", "Gyre at E[d]=1.5: (0.5, 3), fine elastic cells, streaming",
       lambda s: elastic(s, phi=0.5, mu=3)),
    _p("async-1", "Async at E[d]=1: (1, 1), static half split",
       lambda s: async_split(s, phi=1.0, mu=1)),
    _p("colocate-1", "Colocate at E[d]=1: (0, 3), global switch",
       lambda s: colocated(s, phi=0.0, mu=3, granularity="global")),
    _p("gyre-1", "Gyre at E[d]=1: (0.5, 2), fine elastic cells, streaming",
       lambda s: elastic(s, phi=0.5, mu=2)),
)

_ALIASES = (
    _p("async", "alias of async-1.5", _METHODS[0].build),
    _p("colocate", "alias of colocate-1.5", _METHODS[1].build),
    _p("gyre", "alias of gyre-1.5", _METHODS[2].build),
)

PRESETS: dict[str, Preset] = {p.name: p for p in (*_ABLATION, *_METHODS, *_ALIASES)}
ABLATION_NAMES: tuple[str, ...] = tuple(p.name for p in _ABLATION)
METHOD_NAMES: tuple[str, ...] = tuple(p.name for p in _METHODS)


def build_preset(name: str, shape: ClusterShape = PAPER_SHAPE, **overrides: Any) -> SchedulerConfig:
    """The named preset on ``shape`` with field overrides applied and validated."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    cfg = PRESETS[name].build(shape)
    return cfg.replace_fields(**overrides) if overrides else cfg
