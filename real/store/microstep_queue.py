"""Micro-step queues with atomic claims: one in memory, one on a directory.

Both queues have the same interface: ``put(step)``, ``close_batch(batch_id,
num_steps)``, ``claim(worker) -> MicroStep | None`` (None when nothing is
ready now), ``batch_closed(batch_id)``, ``ready_count()``.

Invariants:
- every micro-step put is claimed at most once, by exactly one claimer, also
  with many threads (``InMemoryMicroStepQueue``, a lock) or many processes
  (``DirectoryMicroStepQueue``: a claim is one atomic ``os.rename`` from
  ``ready/`` to ``claimed/``; the loser of a race gets ``FileNotFoundError``
  and tries the next file);
- claims come in put order (names sort by batch, then index);
- a micro-step becomes visible only complete: it is written under ``tmp/`` and
  renamed into ``ready/``;
- ``close_batch`` is recorded after the batch's last ``put``; a claimer that
  sees the batch closed and nothing ready knows the batch is fully handed out.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections import deque
from pathlib import Path

import numpy as np

from gyre.trajectory.packing import MicroStep
from gyre.trajectory.rows import TokenRow

_WORKER = re.compile(r"^[A-Za-z0-9_.-]+$")
_ROW_META = ("execution_id", "group_id", "leaf", "advantage", "weight", "execution_targets")


def save_microstep(step: MicroStep, file) -> None:
    """Write a micro-step as an ``.npz`` (no pickle) to a path or binary file."""
    meta = {"batch_id": step.batch_id, "index": step.index, "batch_executions": step.batch_executions,
            "rows": [{**{k: getattr(r, k) for k in _ROW_META}, "length": r.num_tokens} for r in step.rows]}
    np.savez(file, meta=np.array(json.dumps(meta)), input_ids=_concat(step, "input_ids", np.int32),
             target_mask=_concat(step, "target_mask", bool),
             behavior_logprobs=_concat(step, "behavior_logprobs", np.float64))


def _concat(step: MicroStep, field: str, dtype) -> np.ndarray:
    if not step.rows:
        return np.zeros(0, dtype=dtype)
    return np.concatenate([getattr(row, field) for row in step.rows]).astype(dtype)


def load_microstep(file) -> MicroStep:
    with np.load(file, allow_pickle=False) as data:
        meta = json.loads(str(data["meta"]))
        arrays = {k: data[k] for k in ("input_ids", "target_mask", "behavior_logprobs")}
    rows, offset = [], 0
    for row in meta["rows"]:
        end = offset + row.pop("length")
        rows.append(TokenRow(**row, **{k: v[offset:end] for k, v in arrays.items()}))
        offset = end
    return MicroStep(meta["batch_id"], meta["index"], tuple(rows), meta["batch_executions"])


def _check_worker(worker: str) -> None:
    if not isinstance(worker, str) or not _WORKER.match(worker):
        raise ValueError(f"worker must be a non-empty string of [A-Za-z0-9_.-], got {worker!r}")


class InMemoryMicroStepQueue:
    """Thread-safe queue inside one process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready: deque[MicroStep] = deque()
        self._closed: dict[int, int] = {}
        self.claims: dict[str, str] = {}  # micro-step name -> worker

    def put(self, step: MicroStep) -> None:
        with self._lock:
            if step.batch_id in self._closed:
                raise ValueError(f"batch {step.batch_id} is closed; micro-step {step.name} refused")
            self._ready.append(step)

    def close_batch(self, batch_id: int, num_steps: int) -> None:
        with self._lock:
            self._closed[batch_id] = num_steps

    def claim(self, worker: str) -> MicroStep | None:
        _check_worker(worker)
        with self._lock:
            if not self._ready:
                return None
            step = self._ready.popleft()
            self.claims[step.name] = worker
            return step

    def batch_closed(self, batch_id: int) -> bool:
        with self._lock:
            return batch_id in self._closed

    def ready_count(self) -> int:
        with self._lock:
            return len(self._ready)


class DirectoryMicroStepQueue:
    """Queue on a shared directory; claims are atomic renames (works across processes)."""

    def __init__(self, root: str | os.PathLike, *, fsync: bool = False) -> None:
        self.root = Path(root)
        self.fsync = fsync
        for sub in ("tmp", "ready", "claimed", "closed"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    def put(self, step: MicroStep) -> None:
        if self.batch_closed(step.batch_id):
            raise ValueError(f"batch {step.batch_id} is closed; micro-step {step.name} refused")
        target = self.root / "ready" / f"{step.name}.npz"
        if target.exists() or any((self.root / "claimed").glob(f"{step.name}.npz.*")):
            raise ValueError(f"micro-step {step.name} was already put")
        self._publish(target, lambda f: save_microstep(step, f))

    def close_batch(self, batch_id: int, num_steps: int) -> None:
        self._publish(self.root / "closed" / f"{batch_id:08d}", lambda f: f.write(str(num_steps).encode()))

    def _publish(self, target: Path, write) -> None:
        tmp = self.root / "tmp" / f"{target.name}.{os.getpid()}.{threading.get_ident()}"
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        os.rename(tmp, target)

    def claim(self, worker: str) -> MicroStep | None:
        _check_worker(worker)
        for name in sorted(os.listdir(self.root / "ready")):
            claimed = self.root / "claimed" / f"{name}.{worker}"
            try:
                os.rename(self.root / "ready" / name, claimed)
            except FileNotFoundError:
                continue  # another claimer won this one
            return load_microstep(claimed)
        return None

    def batch_closed(self, batch_id: int) -> bool:
        return (self.root / "closed" / f"{batch_id:08d}").exists()

    def ready_count(self) -> int:
        return len(os.listdir(self.root / "ready"))

    def claims(self) -> dict[str, str]:
        """Micro-step name -> worker, for every claimed micro-step."""
        result = {}
        for path in (self.root / "claimed").iterdir():
            stem, _, worker = path.name.partition(".npz.")
            result[stem] = worker
        return result
