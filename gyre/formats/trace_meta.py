"""What a trace was recorded under: the sidecar ``<trace>.json`` a real run writes beside its trace.

A real run's trace holds groups of its own N and came from its own cluster
and schedule. The sidecar makes the trace self-describing, so
``gyre sim --trace RUN/trace.csv`` simulates the recorded schedule on the
recorded cluster without any ``--set``, and ``--preset X`` asks what another
schedule would have done on the same executions. Fields::

    {"preset": "gyre-1",
     "shape": {"nodes": 2, "nodes_per_cell": 1, "per_node_capacity": 8, "N": 8, "B": 2},
     "schedule": {"tau": 0.0},          # overrides applied on top of the preset
     "source": "gyre run"}

Invariants: ``read_trace_meta(p)`` is None when no sidecar exists and returns
exactly what ``write_trace_meta`` wrote otherwise; a malformed sidecar raises
ValueError naming the file and the field.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gyre.presets import PRESETS, ClusterShape


@dataclass(frozen=True)
class TraceMeta:
    preset: str
    shape: ClusterShape
    schedule: dict[str, Any] = field(default_factory=dict)
    source: str = ""


def meta_path(trace_path: str | Path) -> Path:
    return Path(trace_path).with_suffix(".json")


def write_trace_meta(trace_path: str | Path, meta: TraceMeta) -> Path:
    path = meta_path(trace_path)
    data = {"preset": meta.preset, "shape": dataclasses.asdict(meta.shape), "schedule": meta.schedule,
            "source": meta.source}
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


def read_trace_meta(trace_path: str | Path) -> TraceMeta | None:
    path = meta_path(trace_path)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable trace description ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a trace description must be a JSON object")
    preset = data.get("preset")
    if preset not in PRESETS:
        raise ValueError(f"{path}: field 'preset' must name a schedule preset, got {preset!r}")
    shape, schedule = data.get("shape"), data.get("schedule", {})
    if not isinstance(shape, dict) or not isinstance(schedule, dict):
        raise ValueError(f"{path}: fields 'shape' and 'schedule' must be objects")
    bad = sorted(k for k, v in shape.items() if isinstance(v, bool) or not isinstance(v, int) or v < 1)
    if bad:
        raise ValueError(f"{path}: field 'shape': {', '.join(bad)} must be positive integers")
    try:
        return TraceMeta(preset, ClusterShape(**shape), dict(schedule), str(data.get("source", "")))
    except TypeError as exc:
        raise ValueError(f"{path}: field 'shape': {exc}") from None
