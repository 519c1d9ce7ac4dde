"""The durable event journal: every accepted event, one JSON line each, written as it is fed.

A real run cannot wait for its end to keep its event log: a ``kill -9`` would
lose it. ``JournalLog`` is an ``EventLog`` (``gyre.formats.eventlog``) that
also appends each recorded event to ``events.jsonl`` as one line (the
``EventLog.rows`` dict: ``seq``, ``kind``, ``now`` and the event's fields) and
hands it to the kernel at once (a process killed afterwards loses nothing; a
machine crash can lose what was not yet ``sync``-ed). ``sync()`` forces the
file to disk; the real job calls it at every checkpoint, so the prefix a
checkpoint names survives a power loss too.

``read_journal(path)`` reads it back after any kill: every complete line is
an event, in ``seq`` order from 0; a last line that is incomplete (no final
newline) or does not parse is a *torn tail*: it is left out and named in
``Journal.torn`` (line number, bytes), never raised. Anything else (a bad
line before the last one, a ``seq`` out of order, an unknown event kind) is
damage from outside: ``ValueError`` naming the file and line.

``JournalLog(path, prefix, actions)`` starts a log that already holds a
replayed prefix (the resumed run's ``events[0:P]`` and the actions a fresh
core returned for them) and replaces the file atomically by exactly that
prefix, so the journal never holds events the resumed run's core did not
accept, and a kill while it is replaced leaves the old journal whole.

Invariants: line ``i`` of the file holds the event of ``seq`` ``i``; a line is
written only after the core accepted its event (``DriverLoop.feed`` records
after ``handle`` returned); ``read_journal(p).events`` equals the recorded
events (floats round-trip exactly through JSON).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from gyre import actions as act
from gyre import events as ev
from gyre.formats.eventlog import EventLog

JOURNAL_NAME = "events.jsonl"


@dataclass(frozen=True)
class Journal:
    """What a journal file holds: its events, and the torn tail left out (None: the file ended cleanly)."""

    events: list[ev.Event]
    torn: str | None = None


def _line(row: dict) -> bytes:
    return (json.dumps(row, separators=(",", ":")) + "\n").encode()


class JournalLog(EventLog):
    """An ``EventLog`` whose every recorded event is appended, flushed, to a journal file.

    ``prefix`` (a resumed run: the replayed ``events[0:P]``, with the ``actions`` a fresh core returned for
    them) is recorded first; the file is replaced atomically by exactly that prefix (written to a temporary
    file, fsynced, renamed over it), so a kill at any moment leaves either the old journal or the new one."""

    def __init__(self, path: str | os.PathLike, prefix: Iterable[ev.Event] = (),
                 actions: Iterable[act.Action] = ()) -> None:
        super().__init__()
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for event in prefix:
            super().record_event(event)
        super().record_actions(actions)
        staging = self.path.with_name(f".{self.path.name}.tmp")
        fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, b"".join(_line(row) for row in self.rows))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(staging, self.path)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND)

    def record(self, event: ev.Event, actions: list[act.Action]) -> None:
        self.record_event(event)
        self.record_actions(actions)

    def record_event(self, event: ev.Event) -> None:
        super().record_event(event)
        row = self.rows[-1]
        data = _line(row)
        if self._fd is None:
            raise ValueError(f"journal {self.path} is closed")
        if os.write(self._fd, data) != len(data):  # pragma: no cover - regular files write fully
            raise OSError(f"short write to {self.path}")

    def sync(self) -> None:
        """Force every line written so far to disk."""
        if self._fd is not None:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_journal(path: str | os.PathLike) -> Journal:
    """The events of a journal file; a torn last line is left out and named (module docstring)."""
    path = Path(path)
    data = path.read_bytes()
    lines = data.split(b"\n")
    complete, tail = lines[:-1], lines[-1]  # tail: bytes after the last newline (b"" when none)
    events: list[ev.Event] = []
    torn = None
    for number, raw in enumerate(complete, start=1):
        try:
            events.append(_event(raw, len(events)))
        except ValueError as exc:
            if number == len(complete) and not tail:  # the last line: torn while it was written
                torn = f"{path}: line {number} ({len(raw)} bytes) is torn and left out: {exc}"
                break
            raise ValueError(f"{path}: line {number}: {exc}") from None
    if tail:
        torn = f"{path}: line {len(complete) + 1} ({len(tail)} bytes, no newline) is torn and left out"
    return Journal(events, torn)


def _event(raw: bytes, seq: int) -> ev.Event:
    try:
        row = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a JSON event ({exc})") from None
    if not isinstance(row, dict):
        raise ValueError(f"not a JSON object: {raw[:60]!r}")
    if row.pop("seq", None) != seq:
        raise ValueError(f"expected the event of seq {seq}")
    try:
        return ev.event_from_dict(row)
    except TypeError as exc:
        raise ValueError(f"bad event fields ({exc})") from None


def replay_journal(run_dir: str | os.PathLike) -> tuple[list[dict], Journal]:
    """``replay_run`` for a log folder whose run may have been killed: replay its ``events.jsonl``
    (torn tail left out) under its ``summary.json`` configuration; the actions and the journal read."""
    from gyre.formats.eventlog import replay, run_config

    journal = read_journal(Path(run_dir) / JOURNAL_NAME)
    return replay(run_config(Path(run_dir)), journal.events), journal
