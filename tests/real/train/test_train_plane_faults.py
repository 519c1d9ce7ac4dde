"""Bad input and failures of the training plane, for real (separate cell processes, gloo).

- A satellite that asks to join after the step's window closed is told so,
  logs it, leaves its weights alone and joins the next step.
- A cell that crashes mid-step is reported with its exit code; the core
  requeues every micro-step the dead cell claimed, finishes the step with the
  remaining cells, and the weights equal those of the core training alone on
  the same micro-steps (nothing recorded is lost). A healthy cell behind the
  crashed one cannot reduce over a prefix group: its work is redone and it is
  barred from later steps.
"""

from __future__ import annotations

import time

import pytest
import torch

from gyre.real.train.context import FAULT_EXIT_CODE
from gyre.real.train.plane import CellError, PlaneConfig, TrainingPlane
from gyre.real.train.state import OptimConfig
from gyre.real.toy.microsteps import feed, toy_batch

OPTIM = OptimConfig(lr=1e-3)


def wait_for_log(plane: TrainingPlane, cell: int, text: str, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while text not in plane.log_text(cell):
        if time.monotonic() > deadline:
            raise AssertionError(f"cell {cell} never logged {text!r}:\n{plane.log_text(cell)}")
        time.sleep(0.01)
    return plane.log_text(cell)


@pytest.mark.timeout(90)
def test_late_joiner_waits_for_the_next_step(tmp_path):
    with TrainingPlane(PlaneConfig(cells=2, transport="mooncake", optim=OPTIM), tmp_path / "plane") as plane:
        plane.call(0, "enter_training")
        feed(plane.queues, toy_batch(1, 0, 4))
        first = plane.call(0, "step", version=0, final=False)
        plane.call(1, "enter_training")
        log = wait_for_log(plane, 1, "join window of step 0 closed")
        assert "waiting for step 1" in log and "joined step 0" not in log
        ticket = plane.send(0, "step", version=1, final=True)
        assert plane.wait_seated(1, 1) == "joined"
        feed(plane.queues, toy_batch(2, 1, 6))
        second = ticket.result()
    assert first["participants"] == [0] and first["seated"] == []
    assert second["participants"] == [0, 1] and second["joins"]["1"]["transport"] == "mooncake"


def crashed_run(plane: TrainingPlane, crashing: int) -> tuple[dict, dict]:
    for cell in range(3):
        plane.call(cell, "enter_training")
    ticket = plane.send(0, "step", version=0, final=False)
    for cell in (1, 2):
        plane.wait_seated(0, cell)
    feed(plane.queues, toy_batch(21, 0, 16))
    first = ticket.result()
    with pytest.raises(CellError, match=f"exited with code {FAULT_EXIT_CODE}"):
        plane.call(crashing, "info")
    feed(plane.queues, toy_batch(22, 1, 8))
    second = plane.call(0, "step", version=1, final=True)
    return first, second


@pytest.mark.timeout(120)
@pytest.mark.parametrize("crashing, survivors, discarded", [(2, [0, 1], []), (1, [0], [2])])
def test_crashed_cell_is_reported_and_the_core_finishes_the_step(tmp_path, crashing, survivors, discarded):
    cfg = PlaneConfig(cells=3, transport="mooncake", optim=OPTIM, crash_after=((crashing, 2),))
    with TrainingPlane(cfg, tmp_path / "plane") as plane:
        initial = tmp_path / "initial.pt"
        plane.call(0, "dump", path=str(initial))
        first, second = crashed_run(plane, crashing)
        after_crash = torch.load(plane.call(0, "dump", path=str(tmp_path / "crash.pt"))["path"])["weights"]
        assert plane.crashes == {crashing: FAULT_EXIT_CODE}

        plane.call(0, "load", path=str(initial))
        for cell in (1, 2):
            if cell != crashing:
                plane.call(cell, "leave_training")
        feed(plane.queues, toy_batch(21, 2, 16))
        plane.call(0, "step", version=2, final=False)
        feed(plane.queues, toy_batch(22, 3, 8))
        plane.call(0, "step", version=3, final=True)
        alone = torch.load(plane.call(0, "dump", path=str(tmp_path / "alone.pt"))["path"])["weights"]
        log0 = plane.log_text(0)

    assert first["failed"] == {str(crashing): {"exitcode": FAULT_EXIT_CODE, "pid": plane.pids[crashing]}}
    assert first["participants"] == survivors and first["discarded"] == discarded
    assert len(first["redone"]) >= 2  # the crashed cell claimed two micro-steps
    assert first["microsteps"] == 16 and sum(first["by_cell"].values()) == 16
    assert second["participants"] == survivors and second["barred"] == list(range(crashing, 3))
    assert f"cell {crashing} failed" in log0 and "requeued" in log0
    assert torch.equal(after_crash, alone)
