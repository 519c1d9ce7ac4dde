"""Named, calibrated synthetic trace presets, and the trace generator.

A preset is a ``DurationModel`` (``traces.model``, which states the model)
plus the statistics (``traces.stats`` keys) its fitted parameters reproduce
for N = 16: ``targets`` (to meet within the stated tolerance) and ``bounds``
(upper limits not to exceed). ``sources`` says, for every target and bound,
where it comes from: ``paper: ...`` (docs/workload.md, the paper's
measured runs) or ``ours: ...`` (an assumption, with its reason). Other N
work but change the slowest-of-N statistics.

Fitting (``gyre trace fit``, ``traces.fit.fit_model``): the six shape
parameters solve six duration targets with scipy.optimize.least_squares on
fixed common random numbers (100,000 queries x 16, seed 20240601), then
``tokens_per_call`` is set so that the mean token count matches, and
``calls_per_branch`` and ``branch_weight`` so that capping admission at
J_max = 1 and 5 keeps (docs/workload.md#training-cost-and-slack) 41.4 % and 74.8 % of the trained tokens
(``traces.trajectories.fit_trajectory_model``). The ceiling, budget,
failure rate and call/token shape are set by hand, as assumptions.

Invariants: generation draws every random number from the generator passed
in (equal seeds, equal traces) and is vectorised (10,000 queries x 16 in
well under a second); every registered preset meets its targets and bounds
on a large sample (tests/sim/test_trace_presets.py, test_trace_spec51.py).
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Mapping

import numpy as np

from gyre.formats.trace import HARNESS_COLUMN, TRAJECTORY_COLUMN, Trace
from gyre.sim.traces.model import (  # re-exported: the generator's public surface
    HOUR_S,
    DurationModel,
    Variates,
    draw_variates,
    realize_counts,
    realize_durations,
)
from gyre.sim.traces.trajectories import realize_trajectories

__all__ = [
    "HOUR_S", "DurationModel", "Variates", "draw_variates", "realize_counts", "realize_durations",
    "TracePreset", "PRESETS", "UnknownPresetError", "get_preset", "generate_trace", "default_trace",
]


@dataclass(frozen=True, kw_only=True)
class TracePreset:
    """A named generator setting: model parameters plus the targets they reproduce."""

    name: str
    model: DurationModel
    targets: Mapping[str, float]
    sources: Mapping[str, str]
    bounds: Mapping[str, float] = field(default_factory=dict)
    summary: str = ""
    N: int = 16

    def __post_init__(self) -> None:
        unsourced = (set(self.targets) | set(self.bounds)) - set(self.sources)
        if unsourced:
            raise ValueError(f"preset {self.name}: no source for {sorted(unsourced)}")
        if any(not s.startswith(("paper:", "ours:")) for s in self.sources.values()):
            raise ValueError(f"preset {self.name}: a source must start with 'paper:' or 'ours:'")

    def describe(self) -> str:
        """Distribution, assumptions, parameters, targets and their sources as plain text."""
        lines = [f"preset {self.name} (N = {self.N})", "", self.summary, "", "parameters:"]
        for f in dataclasses.fields(self.model):
            lines.append(f"  {f.name:<20} = {getattr(self.model, f.name):.6g}")
        lines += ["targets and bounds (trace_stats keys):"]
        for key, value in [*self.targets.items(), *self.bounds.items()]:
            op = "<=" if key in self.bounds and key not in self.targets else "="
            lines.append(f"  {key:<30} {op:<2} {value:<10.6g} {self.sources[key]}")
        return "\n".join(lines)


PRESETS: dict[str, TracePreset] = {}


class UnknownPresetError(ValueError):
    """A preset name that is not in ``PRESETS``; the message lists the known ones."""


def _preset(builder: Callable[[], TracePreset]) -> Callable[[], TracePreset]:
    """Register the preset a function builds; its docstring becomes the summary."""
    preset = builder()
    preset = dataclasses.replace(preset, summary=inspect.getdoc(builder) or "",
                                 targets=MappingProxyType(dict(preset.targets)),
                                 sources=MappingProxyType(dict(preset.sources)),
                                 bounds=MappingProxyType(dict(preset.bounds)))
    PRESETS[preset.name] = preset
    return builder


def get_preset(name: str | TracePreset) -> TracePreset:
    if isinstance(name, TracePreset):
        return name
    if name not in PRESETS:
        known = ", ".join(sorted(PRESETS))
        raise UnknownPresetError(f"unknown trace preset {name!r}; known presets: {known}")
    return PRESETS[name]


def generate_trace(preset: str | TracePreset, queries: int, rng: np.random.Generator, N: int = 16) -> Trace:
    """Draw a synthetic trace of ``queries`` groups of N executions from a preset."""
    chosen = get_preset(preset)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    if int(queries) != queries or queries < 1 or int(N) != N or N < 1:
        raise ValueError(f"queries and N must be positive integers, got {queries!r} and {N!r}")
    variates = draw_variates(rng, int(queries), int(N))
    durations_s, codes, active_s = realize_durations(chosen.model, variates)
    counts = realize_counts(chosen.model, variates, active_s)
    split = realize_trajectories(chosen.model.trajectory_model(), rng, counts["call_count"],
                                 counts["input_tokens"] + counts["output_tokens"])
    columns = {  # the normalized table Trace(frame) would make of them, built without pandas
        "query_id": np.repeat(np.arange(queries, dtype=np.int64), N),
        "execution_index": np.tile(np.arange(N, dtype=np.int64), queries),
        "duration_s": durations_s.ravel(),
        HARNESS_COLUMN: active_s.ravel(),  # the ceiling for an overall timeout; else its duration
        "outcome": codes.ravel(),  # codes into OUTCOMES
        **{k: v.ravel() for k, v in counts.items()},
        TRAJECTORY_COLUMN: split.as_json(),
    }
    return Trace.from_columns(columns, int(N), f"preset:{chosen.name}", trajectories=(split.sizes, split.counts))


def default_trace() -> Trace:
    """The simulator's built-in trace: nl2repo-122b, 400 queries, seed 0."""
    return generate_trace("nl2repo-122b", 400, np.random.default_rng(0))


# Importing the catalogue registers the four presets.
from gyre.sim.traces import catalogue as _catalogue  # noqa: E402,F401
