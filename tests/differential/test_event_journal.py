"""The durable event journal (``gyre.formats.journal``): read back after any kill, damage named.

A simulated run's accepted events (a legal sequence) are journalled; reading
the file back gives them exactly and replays to the run's own actions; a file
cut at any byte of its last line (a kill mid-write) loses only that line and
names it; damage before the last line, or a line out of sequence, is a
ValueError naming the line; a resumed journal holds exactly its prefix.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from gyre.formats.eventlog import replay
from gyre.formats.journal import JournalLog, read_journal, replay_journal
from gyre.loop import HANDLER_METHODS, ActionHandler, DriverLoop
from gyre.scheduler import Scheduler
from gyre.sim.runner import run_simulation


@pytest.fixture(scope="module")
def simulated():
    result = run_simulation("E0", "deepswe", steps=4, seed=0, breakdown=False)
    return result.cfg, result.record.log.events(), result.record.log.actions


def write(tmp_path, events):
    log = JournalLog(tmp_path / "events.jsonl")
    for event in events:
        log.record_event(event)
    log.sync()
    log.close()
    return tmp_path / "events.jsonl"


def test_a_journal_reads_back_every_event_and_replays_to_the_runs_actions(tmp_path, simulated):
    cfg, events, actions = simulated
    path = write(tmp_path, events)
    journal = read_journal(path)
    assert journal.torn is None and journal.events == events
    (tmp_path / "summary.json").write_text(json.dumps({"config": cfg.__dict__}))
    replayed, _ = replay_journal(tmp_path)
    assert replayed == actions == replay(cfg, events)


def test_a_line_torn_at_any_byte_is_left_out_and_named(tmp_path, simulated):
    _, events, _ = simulated
    data = write(tmp_path, events).read_bytes()
    last = data.rstrip(b"\n").rfind(b"\n") + 1  # where the last line starts
    rng = np.random.default_rng(7)
    for cut in sorted(set(rng.integers(last + 1, len(data) - 1, size=12).tolist())):
        (tmp_path / "torn.jsonl").write_bytes(data[:cut])
        journal = read_journal(tmp_path / "torn.jsonl")
        assert journal.events == events[:-1]
        assert f"line {len(events)}" in journal.torn and "torn" in journal.torn


def test_a_garbled_last_line_is_a_torn_tail_but_damage_before_it_is_an_error(tmp_path, simulated):
    _, events, _ = simulated
    lines = write(tmp_path, events[:6]).read_bytes().splitlines(keepends=True)
    (tmp_path / "tail.jsonl").write_bytes(b"".join(lines[:-1]) + b"\x00\xffgarbage\n")
    journal = read_journal(tmp_path / "tail.jsonl")
    assert journal.events == events[:5] and "line 6" in journal.torn
    (tmp_path / "middle.jsonl").write_bytes(b"".join(lines[:2]) + b"{not json\n" + b"".join(lines[3:]))
    with pytest.raises(ValueError, match=r"middle.jsonl: line 3: not a JSON event"):
        read_journal(tmp_path / "middle.jsonl")
    (tmp_path / "gap.jsonl").write_bytes(b"".join(lines[:2] + lines[3:]))
    with pytest.raises(ValueError, match=r"gap.jsonl: line 3: expected the event of seq 2"):
        read_journal(tmp_path / "gap.jsonl")
    (tmp_path / "kind.jsonl").write_bytes(b"".join(lines[:5]) + b'{"seq":5,"kind":"nonsense","now":1.0}\n' + lines[5])
    with pytest.raises(ValueError, match=r"line 6: unknown event kind 'nonsense'"):
        read_journal(tmp_path / "kind.jsonl")


def test_a_resumed_journal_holds_exactly_its_prefix_then_goes_on(tmp_path, simulated):
    cfg, events, actions = simulated
    write(tmp_path, events)  # the killed attempt's whole journal
    prefix = len(events) // 2
    log = JournalLog(tmp_path / "events.jsonl", events[:prefix], [])
    assert read_journal(tmp_path / "events.jsonl").events == events[:prefix]
    for event in events[prefix:]:
        log.record_event(event)
    assert read_journal(tmp_path / "events.jsonl").events == events and len(log) == len(events)
    assert [p.name for p in tmp_path.iterdir()] == ["events.jsonl"]  # the staging file was renamed away


def test_a_driver_loop_journals_each_event_it_feeds(tmp_path, simulated):
    """The loop records through ``EventLog.record`` (one call per event): a journal must write there too."""
    cfg, events, actions = simulated
    ignoring = type("Ignoring", (ActionHandler,), {name: lambda self, a: None for name in HANDLER_METHODS.values()})
    log = JournalLog(tmp_path / "events.jsonl")
    loop = DriverLoop(Scheduler(cfg), ignoring(), log)
    for event in events:
        loop.feed(event)
    log.close()
    assert read_journal(tmp_path / "events.jsonl").events == events
    assert log.actions == actions
