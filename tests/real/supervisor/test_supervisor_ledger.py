"""The supervisor's ledger (``supervisor.ledger``) as a state machine against a model.

Rules start, end and lose keys (legal or not), tear the file's last line as
a crash mid-write would, and reopen it. Invariants after every step: the
ledger's entries equal the model's; folding the file again gives the same; an
illegal record raised ``LedgerError`` and left the file as it was.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from hypothesis_budget import examples

from gyre.real.supervisor.ledger import (
    ENDED,
    LOST,
    RUNNING,
    Ledger,
    LedgerError,
    fold,
    read_ledger,
    read_records,
    restarts,
)

KEYS = st.sampled_from(["x0", "x1", "x2", "proxy"])


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="ledger-"))
        self.path = self.folder / "ledger.jsonl"
        self.ledger = Ledger(self.path)
        self.model: dict[str, dict] = {}  # key -> {"state", "pid", "starts", "exit_code"}
        self.pid = 100

    def teardown(self) -> None:
        self.ledger.close()
        shutil.rmtree(self.folder)

    def _refused(self, record: dict) -> None:
        before = self.path.read_bytes()
        with pytest.raises(LedgerError):
            self.ledger.append(record)
        assert self.path.read_bytes() == before

    @rule(key=KEYS)
    def start(self, key: str) -> None:
        self.pid += 1
        record = {"kind": "started", "key": key, "pid": self.pid, "started_unix_s": 1.0, "started_mono_s": 2.0}
        if self.model.get(key, {}).get("state") == RUNNING:
            return self._refused(record)
        self.ledger.append(record)
        self.model[key] = {"state": RUNNING, "pid": self.pid, "starts": self.model.get(key, {}).get("starts", 0) + 1,
                           "exit_code": None}

    @rule(key=KEYS, code=st.integers(-15, 3), killed=st.booleans())
    def end(self, key: str, code: int, killed: bool) -> None:
        record = {"kind": "ended", "key": key, "exit_code": code, "ended_unix_s": 3.0, "ended_mono_s": 4.0,
                  "killed": killed}
        if self.model.get(key, {}).get("state") != RUNNING:
            return self._refused(record)
        self.ledger.append(record)
        self.model[key].update(state=ENDED, exit_code=code)

    @rule(key=KEYS)
    def lose(self, key: str) -> None:
        record = {"kind": "lost", "key": key, "reason": "its supervisor is gone"}
        if self.model.get(key, {}).get("state") != RUNNING:
            return self._refused(record)
        self.ledger.append(record)
        self.model[key]["state"] = LOST

    @precondition(lambda self: self.path.stat().st_size > 0)
    @rule(cut=st.integers(1, 30))
    def crash_mid_write_and_reopen(self, cut: int) -> None:
        """A torn record after the last complete one: left out, and cut off when the ledger reopens."""
        self.ledger.close()
        with open(self.path, "ab") as f:
            f.write(json.dumps({"kind": "started", "key": "x9", "pid": 1})[:cut].encode())
        assert "x9" not in read_ledger(self.path)
        self.ledger = Ledger(self.path)
        assert self.path.read_bytes().endswith(b"\n")

    @invariant()
    def entries_match_the_model(self) -> None:
        got = {k: {"state": e.state, "pid": e.pid, "starts": e.starts, "exit_code": e.exit_code}
               for k, e in self.ledger.entries.items()}
        assert got == self.model
        assert fold(read_records(self.path)) == self.ledger.entries


TestLedgerMachine = LedgerMachine.TestCase
TestLedgerMachine.settings = settings(max_examples=examples(60), stateful_step_count=25, deadline=None)


def test_a_damaged_line_before_the_last_is_named(tmp_path):
    path = tmp_path / "ledger.jsonl"
    path.write_text('{"kind": "started", "key": "x1", "pid": 5, "started_unix_s": 1, "started_mono_s": 1}\n'
                    'garbage\n{"kind": "lost", "key": "x1"}\n')
    with pytest.raises(LedgerError, match="line 2 is not JSON"):
        read_ledger(path)


def test_an_unknown_kind_is_named():
    with pytest.raises(LedgerError, match="record 1: unknown kind 'paused'"):
        fold([{"kind": "paused", "key": "x1"}])


def test_restarts_name_why_each_earlier_run_did_not_count():
    started = {"kind": "started", "pid": 1, "started_unix_s": 1.0, "started_mono_s": 1.0}
    ended = {"kind": "ended", "exit_code": -15, "ended_unix_s": 2.0, "ended_mono_s": 2.0}
    records = [dict(started, key="x1"), {"kind": "lost", "key": "x1", "reason": "its supervisor is gone (pid 7)"},
               dict(started, key="x1"), dict(ended, key="x1", killed=True), dict(started, key="x1"),
               dict(started, key="x2"), dict(ended, key="x2")]
    assert fold(records)["x1"].starts == 3
    assert restarts(records) == {"x1": ["its supervisor is gone (pid 7)",
                                        "stopped by a driver (cancelled, timed out, or not adopted on a resume)"]}


FIELD = st.one_of(st.none(), st.integers(-3, 3), st.floats(allow_nan=True), st.text(max_size=3), st.booleans())
RECORD = st.one_of(
    st.fixed_dictionaries({"kind": st.sampled_from(["started", "ended", "lost", "other"]), "key": KEYS},
                          optional={"pid": FIELD, "started_unix_s": FIELD, "started_mono_s": FIELD,
                                    "exit_code": FIELD, "ended_unix_s": FIELD, "ended_mono_s": FIELD,
                                    "killed": FIELD, "reason": FIELD}),
    st.integers(), st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), FIELD, max_size=3))


@settings(max_examples=examples(300), deadline=None)
@given(records=st.lists(RECORD, max_size=8))
def test_any_ledger_content_folds_or_names_the_bad_record(records):
    """A ledger file is outside input (hand-edited, damaged): fold gives a state or one LedgerError, nothing else."""
    try:
        state = fold(records)
    except LedgerError as exc:
        assert str(exc).startswith("ledger record ")
        return
    assert all(e.state in (RUNNING, ENDED, LOST) for e in state.values())
