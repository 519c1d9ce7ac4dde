"""``train.fence``: a cell of an older attempt never acts on a run folder a newer attempt holds.

- ``write_attempt`` never lowers the folder's number; ``stale`` is None exactly for a cell of the
  folder's attempt (or an unfenced one) and a command naming that attempt (Hypothesis);
- for real (two cell processes of attempt 1): a command naming another attempt, and any command
  once attempt 2 holds the folder, make the cell exit with ``FENCED_EXIT`` having written nothing:
  no dump, no change to any file of the plane's folder.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre.real.train.fence import FENCED_EXIT, StaleAttempt, current_attempt, stale, write_attempt


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=8), st.integers(0, 7), st.one_of(st.none(), st.integers(0, 7)))
def test_the_folder_number_only_rises_and_only_its_attempt_may_act(tmp_path_factory, writes, cell, named):
    folder = tmp_path_factory.mktemp("plane")
    held = None
    for attempt in writes:
        if held is not None and attempt < held:
            with pytest.raises(StaleAttempt):
                write_attempt(folder, attempt)
        else:
            write_attempt(folder, attempt)
            held = attempt
        assert current_attempt(folder) == held
    may_act = cell == 0 or ((named is None or named == cell) and cell == held)
    assert (stale(folder, cell, named) is None) is may_act


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _exit_code(plane, cell: int, timeout: float = 30.0) -> int | None:
    deadline = time.monotonic() + timeout
    while cell not in plane.crashes and time.monotonic() < deadline:
        time.sleep(0.05)
    return plane.crashes.get(cell)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_cell_of_an_older_attempt_refuses_and_writes_nothing(tmp_path):
    from gyre.real.train import keys
    from gyre.real.train.plane import PlaneConfig, TrainingPlane
    from gyre.real.train.state import OptimConfig

    work = tmp_path / "plane"
    with TrainingPlane(PlaneConfig(cells=2, optim=OptimConfig(lr=1e-3), attempt=1), work) as plane:
        assert current_attempt(work) == 1 and plane.call(0, "info")["role"]
        before = _snapshot(work)
        n = plane._next[0]  # a command of attempt 0 (an old driver's) on cell 0's own channel
        plane.control.set(keys.command(0, n), {"op": "dump", "args": {"path": str(tmp_path / "dump0")},
                                               "attempt": 0})
        plane._next[0] += 1
        assert _exit_code(plane, 0) == FENCED_EXIT
        assert _snapshot(work) == before
        write_attempt(work, 2)  # a newer attempt takes the folder: cell 1 is now the stale one
        before = _snapshot(work)
        plane.send(1, "dump", path=str(tmp_path / "dump1"))
        assert _exit_code(plane, 1) == FENCED_EXIT
        assert _snapshot(work) == before
    assert not (tmp_path / "dump0").exists() and not (tmp_path / "dump1").exists()
