"""The supervisor's ledger: what it started, what ended and how, durable across any crash.

One JSON object a line in ``RUN_DIR/supervisor/ledger.jsonl``, each written and
fsynced before the supervisor acts on it (``Ledger.append``):

- ``{"kind": "started", "key", "pid", "started_unix_s", "started_mono_s", "supervisor"}``:
  a process the supervisor spawned (its process group id is its pid);
- ``{"kind": "ended", "key", "exit_code", "ended_unix_s", "ended_mono_s", "killed"}``: its
  exit, as the supervisor reaped it (``exit_code`` negative: the signal that ended it;
  ``killed``: a driver's ``kill`` ended it, a cancellation or a timeout, not its own exit);
- ``{"kind": "lost", "key", "reason"}``: a process started by a supervisor that is gone
  (its node rebooted, or it was killed): a new supervisor writes it for each key its
  predecessor left running, because nobody can wait for that exit any more.

``fold(lines)`` is the state: one ``Entry`` per key, the newest start's. The
``*_mono_s`` times are ``time.monotonic()`` of the node (Linux: the same clock
in every process of a boot), so a resumed driver on the node compares them
with its own.

Invariants (``fold`` raises ``LedgerError`` on a line that breaks them, naming
it): a key ends or is lost only after it started and at most once per start; a
key starts again only once its last start ended or was lost; a torn last line
(a crash mid-write) is left out and never any other line.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

LEDGER_NAME = "ledger.jsonl"
RUNNING, ENDED, LOST = "running", "ended", "lost"


class LedgerError(ValueError):
    """A ledger line that breaks the ledger's invariants or is not JSON (the message names the line)."""


@dataclass(frozen=True)
class Entry:
    key: str
    pid: int
    state: str                      # running | ended | lost
    started_unix_s: float
    started_mono_s: float
    starts: int = 1                 # how often the key was started (a re-run after a lost supervisor: 2)
    exit_code: int | None = None
    ended_unix_s: float | None = None
    ended_mono_s: float | None = None
    reason: str = ""                # lost: why
    killed: bool = False            # ended by a driver's kill (cancelled, timed out), not by itself

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def fold(records: Iterable[dict[str, Any]]) -> dict[str, Entry]:
    """The state the ledger's records leave (module docstring); LedgerError names a record that breaks it."""
    state: dict[str, Entry] = {}
    for n, record in enumerate(records, 1):
        state[record.get("key")] = step(state, record, n)
    return state


def step(state: dict[str, Entry], record: dict[str, Any], n: int = 0) -> Entry:
    """The entry of ``record``'s key once ``record`` (the ``n``-th) is applied to ``state``; LedgerError if
    it breaks the invariants or lacks a field (or one has the wrong type)."""
    if not isinstance(record, dict) or not isinstance(record.get("key"), str):
        raise LedgerError(f"ledger record {n}: not an object with a string key: {str(record)[:80]}")
    try:
        return _step(state, record, n)
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, LedgerError):
            raise
        raise LedgerError(f"ledger record {n} ({record.get('kind')} {record['key']}): bad or missing field: "
                          f"{type(exc).__name__}: {exc}") from None


def _step(state: dict[str, Entry], record: dict[str, Any], n: int) -> Entry:
    kind, key = record.get("kind"), record.get("key")
    last = state.get(key)
    if kind == "started":
        if last is not None and last.state == RUNNING:
            raise LedgerError(f"ledger record {n}: {key} started again while still running (pid {last.pid})")
        return Entry(str(key), int(record["pid"]), RUNNING, float(record["started_unix_s"]),
                     float(record["started_mono_s"]), starts=(last.starts + 1) if last else 1)
    if kind not in ("ended", "lost"):
        raise LedgerError(f"ledger record {n}: unknown kind {kind!r}")
    if last is None or last.state != RUNNING:
        raise LedgerError(f"ledger record {n}: {key} {kind} but it is not running "
                          f"({'never started' if last is None else last.state})")
    if kind == "lost":
        return _replace(last, state=LOST, reason=str(record.get("reason", "")))
    return _replace(last, state=ENDED, exit_code=int(record["exit_code"]), ended_unix_s=float(record["ended_unix_s"]),
                    ended_mono_s=float(record["ended_mono_s"]), killed=bool(record.get("killed", False)))


def _replace(entry: Entry, **changes: Any) -> Entry:
    return Entry(**{**entry.as_dict(), **changes})


def read_records(path: Path) -> list[dict[str, Any]]:
    """The ledger's records; a torn last line (no newline, or not JSON at the end) is left out."""
    if not path.is_file():
        return []
    text = path.read_text()
    complete = text.split("\n")[:-1]  # the last piece: "" after a final newline, else a torn write
    records = []
    for n, line in enumerate(complete, 1):
        try:
            records.append(json.loads(line))
        except ValueError:
            raise LedgerError(f"{path}: line {n} is not JSON (damaged before its last line): {line[:80]!r}") from None
    return records


def read_ledger(path: Path) -> dict[str, Entry]:
    """``fold`` of the ledger at ``path`` (empty when there is none)."""
    return fold(read_records(path))


class Ledger:
    """The supervisor's append-only ledger; each record is on disk (fsynced) when ``append`` returns."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._drop_torn_tail()
        records = read_records(self.path)
        self.entries, self._count = fold(records), len(records)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def _drop_torn_tail(self) -> None:
        if self.path.is_file():
            data = self.path.read_bytes()
            if data and not data.endswith(b"\n"):
                with open(self.path, "r+b") as f:
                    f.truncate(data.rfind(b"\n") + 1)

    def append(self, record: dict[str, Any]) -> Entry:
        """Check ``record`` against the state (LedgerError, nothing written), write and fsync it; its key's entry."""
        entry = step(self.entries, record, self._count + 1)
        os.write(self._fd, (json.dumps(record, sort_keys=True) + "\n").encode())
        os.fsync(self._fd)
        self.entries[entry.key] = entry
        self._count += 1
        return entry

    def close(self) -> None:
        os.close(self._fd)


def restarts(records: Iterable[dict[str, Any]]) -> dict[str, list[str]]:
    """Per key started more than once, why each earlier run did not count: its supervisor was lost (the
    reason recorded) or a driver stopped it (cancelled, timed out, or an engine a resume did not adopt: the
    summary's ``supervisor.engines`` says why)."""
    last: dict[str, dict[str, Any]] = {}
    found: dict[str, list[str]] = {}
    for record in records:
        key, before = record.get("key"), last.get(record.get("key"))
        if record.get("kind") == "started" and before is not None:
            why = before.get("reason", "lost") if before["kind"] == "lost" else \
                "stopped by a driver (cancelled, timed out, or not adopted on a resume)" if before.get("killed") \
                else "ended by itself"
            found.setdefault(str(key), []).append(why)
        last[key] = record
    return found
