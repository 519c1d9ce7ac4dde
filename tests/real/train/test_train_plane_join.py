"""Streaming training with dynamic membership, for real: Megatron cells in separate processes (gloo).

- A satellite that joins a step in flight (pulling the snapshot over Mooncake)
  ends with exactly the weights of a run where every cell was there from the
  start, and of the core training alone, on the same micro-steps.
- The gradient reduced over the prefix group {0, 1} of a three-cell world
  equals the gradient the core computes alone.

Exact equality is expected: weights are frozen during accumulation, each
micro-step's gradient is computed at the same point whichever cell takes it,
and the accumulator is float64, so how the sum is split over cells only moves
float64 rounding, which vanishes when it is rounded to float32 (see
``gyre.real.train.state``).
"""

from __future__ import annotations

import time

import pytest
import torch

from gyre.real.train import keys
from gyre.real.train.plane import PlaneConfig, TrainingPlane
from gyre.real.train.state import OptimConfig
from gyre.real.toy.microsteps import feed, toy_batch, wait_claimed

SEED_A, SEED_B = 7, 8
OPTIM = OptimConfig(lr=1e-3)


def weights(plane: TrainingPlane, path) -> torch.Tensor:
    plane.call(0, "dump", path=str(path))
    return torch.load(path)["weights"]


def burst_all_from_start(plane: TrainingPlane, first: int) -> list[dict]:
    """Two steps (broadcast between them); every cell seated before any data arrives."""
    for cell in range(plane.cfg.cells):
        plane.call(cell, "enter_training")
    ticket = plane.send(0, "step", version=first, final=False)
    for cell in range(1, plane.cfg.cells):
        assert plane.wait_seated(first, cell) == "joined"
    feed(plane.queues, toy_batch(SEED_A, first, 12))
    reports = [ticket.result()]
    feed(plane.queues, toy_batch(SEED_B, first + 1, 12))
    reports.append(plane.call(0, "step", version=first + 1, final=True))
    return reports


def burst_with_late_joiner(plane: TrainingPlane, first: int) -> list[dict]:
    """Cell 2 enters training while step ``first`` is in flight and joins it."""
    plane.call(0, "enter_training")
    plane.call(1, "enter_training")
    ticket = plane.send(0, "step", version=first, final=False)
    plane.wait_seated(first, 1)
    steps = toy_batch(SEED_A, first, 12)
    feed(plane.queues, steps[:3], close=False)
    wait_claimed(plane.queues, first, 3)
    plane.call(2, "enter_training")
    assert plane.wait_seated(first, 2) == "joined"
    feed(plane.queues, steps[3:], close=False)
    plane.queues.close_batch(first, len(steps))
    reports = [ticket.result()]
    feed(plane.queues, toy_batch(SEED_B, first + 1, 12))
    reports.append(plane.call(0, "step", version=first + 1, final=True))
    return reports


def burst_core_alone(plane: TrainingPlane, first: int) -> list[dict]:
    plane.call(0, "enter_training")
    feed(plane.queues, toy_batch(SEED_A, first, 12))
    reports = [plane.call(0, "step", version=first, final=False)]
    feed(plane.queues, toy_batch(SEED_B, first + 1, 12))
    reports.append(plane.call(0, "step", version=first + 1, final=True))
    return reports


def satellites_on_hold(plane: TrainingPlane, version: int) -> dict:
    """``enter_training(hold=True)``: no seat in an open step until ``join``; a held cell sent back never sits.

    The driver holds a satellite until the policy core has acted on its TransitionDone, so a
    cell the core sends straight back (its burst ended) never joins the next burst's step."""
    ticket = plane.send(0, "step", version=version, final=True)
    plane.call(1, "enter_training", hold=True)
    plane.call(2, "enter_training", hold=True)
    time.sleep(1.0)  # the step's join window is open all along
    assert not plane.control.has(keys.seat(version, 1)) and not plane.control.has(keys.seat(version, 2))
    assert plane.call(2, "leave_training")["role"] == "rollout"
    plane.call(1, "join")
    assert plane.wait_seated(version, 1) == "joined"
    feed(plane.queues, toy_batch(SEED_A, version, 4))
    report = ticket.result()
    assert plane.wait_seated(version, 2, timeout=5.0) == "closed"  # the core closed the window without it
    return report


@pytest.mark.timeout(180)
def test_satellite_joining_mid_step_gives_the_same_weights(tmp_path):
    with TrainingPlane(PlaneConfig(cells=3, transport="mooncake", optim=OPTIM), tmp_path / "plane") as plane:
        initial = tmp_path / "initial.pt"
        plane.call(0, "dump", path=str(initial))
        full = burst_all_from_start(plane, 0)
        w_full = weights(plane, tmp_path / "full.pt")

        plane.call(0, "load", path=str(initial))
        late = burst_with_late_joiner(plane, 2)
        w_late = weights(plane, tmp_path / "late.pt")

        for cell in (1, 2):
            assert plane.call(cell, "leave_training")["role"] == "rollout"
        plane.call(0, "load", path=str(initial))
        alone = burst_core_alone(plane, 4)
        w_alone = weights(plane, tmp_path / "alone.pt")
        held = satellites_on_hold(plane, 6)

    assert full[0]["participants"] == [0, 1, 2] and full[1]["participants"] == [0, 1, 2]
    assert late[0]["participants"] == [0, 1, 2] and late[0]["by_cell"]["2"] >= 1
    assert late[0]["joins"]["2"]["transport"] == "mooncake" and "1" in late[0]["joins"]
    assert late[1]["joins"] == {}  # members got the broadcast, nobody pulled
    assert alone[0]["participants"] == [0] and alone[0]["by_cell"] == {"0": 12}
    assert held["participants"] == [0, 1]  # cell 1 joined after "join"; cell 2 left while held
    assert not torch.equal(w_full, torch.load(initial)["weights"])
    assert torch.equal(w_full, w_late)
    assert torch.equal(w_full, w_alone)
    for a, b in zip(full, late):
        assert a["grad_norm"] == b["grad_norm"] and a["microsteps"] == b["microsteps"] == 12


@pytest.mark.timeout(120)
def test_reduction_over_prefix_group_equals_single_process(tmp_path):
    cfg = PlaneConfig(cells=3, transport="mooncake", optim=OPTIM, record_gradients=True)
    with TrainingPlane(cfg, tmp_path / "plane") as plane:
        initial = tmp_path / "initial.pt"
        plane.call(0, "dump", path=str(initial))
        plane.call(0, "enter_training")
        plane.call(1, "enter_training")
        ticket = plane.send(0, "step", version=0, final=True)
        plane.wait_seated(0, 1)
        feed(plane.queues, toy_batch(SEED_A, 0, 10))
        pair = ticket.result()
        two = torch.load(plane.call(0, "dump", path=str(tmp_path / "two.pt"))["path"])

        plane.call(0, "load", path=str(initial))
        feed(plane.queues, toy_batch(SEED_A, 1, 10))
        single = plane.call(0, "step", version=1, final=True)
        one = torch.load(plane.call(0, "dump", path=str(tmp_path / "one.pt"))["path"])

    assert pair["participants"] == [0, 1] and pair["by_cell"]["1"] >= 1 and single["participants"] == [0]
    assert one["gradient"].abs().sum() > 0
    assert torch.equal(two["gradient"], one["gradient"])
    assert torch.equal(two["weights"], one["weights"])
