"""Each engine's record beside its log, ``ID.state.json``: what a later job needs to adopt it running.

``{"pid", "port", "host", "model_path", "cpu", "extra_args", "memory"}``, replaced
atomically (write, then rename) by the engine manager at each launch and around
each memory release and resume: ``memory`` is ``resident`` or ``released`` when
settled, ``releasing`` or ``resuming`` while a call is under way (a job killed
then leaves it so, and nobody knows what the engine holds).

Invariants: a record is read whole or not at all (a missing or damaged one reads
as empty); ``unadoptable`` accepts a running engine only if its record names
that pid, the spec matches but for the port, and its memory state is settled.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SETTLED = ("resident", "released")


def record_path(log_dir: Path, engine_id: str) -> Path:
    return Path(log_dir) / f"{engine_id}.state.json"


def write_record(log_dir: Path, engine_id: str, pid: int, spec: Any, memory: str) -> None:
    record = {"pid": pid, "port": spec.port, "host": spec.host, "model_path": str(spec.model_path), "cpu": spec.cpu,
              "extra_args": list(spec.extra_args), "memory": memory}
    path = record_path(log_dir, engine_id)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record) + "\n")
    tmp.replace(path)


def read_record(log_dir: Path, engine_id: str) -> dict[str, Any]:
    """The engine's record; empty when there is none or it is not a JSON object."""
    try:
        record = json.loads(record_path(log_dir, engine_id).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def unadoptable(record: dict[str, Any], pid: int, spec: Any) -> str | None:
    """Why a running engine ``pid`` with ``record`` cannot serve as ``spec`` (None: it can)."""
    if json.dumps(record.get("pid")) != json.dumps(pid):  # as JSON: true is not 1
        return f"its record names pid {record.get('pid')}, not the running {pid}"
    wanted = {"host": spec.host, "model_path": str(spec.model_path), "cpu": spec.cpu,
              "extra_args": list(spec.extra_args)}
    differs = sorted(k for k, v in wanted.items() if json.dumps(record.get(k)) != json.dumps(v))
    if differs:
        return f"started with another {', '.join(differs)}"
    if record.get("memory") not in SETTLED:
        return f"its memory state is unknown ({record.get('memory')!r}: a release or resume was cut)"
    return None
