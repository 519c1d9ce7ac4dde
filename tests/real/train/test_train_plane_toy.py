"""Learning and role changes in the real training plane.

Toy objective: every execution has advantage +1 and a behaviour probability of
e^-30 at each target, so the token weight sits at the ratio cap and, with the
trust-region clip opened (``clip_high = inf``), the execution-level loss (docs/trajectories.md#execution-level-loss) is
``ratio_cap * mean target NLL / (B*N)`` per execution: it must fall as the
cells train on the same rows step after step.

Role changes keep processes and groups alive: a satellite leaves training
(training buffers freed), comes back in the next burst with the same pid,
pulls the core's newer weights and trains again over the same prefix group.
"""

from __future__ import annotations

import pytest

from gyre.real.train.model import LossConfig
from gyre.real.train.plane import PlaneConfig, TrainingPlane
from gyre.real.train.state import OptimConfig
from gyre.real.toy.microsteps import feed, toy_batch

STEPS = 6


def toy(version: int):
    return toy_batch(31, version, 6, advantage=1.0, behavior_logprob=-30.0)


@pytest.mark.timeout(120)
def test_loss_falls_and_roles_change_without_new_processes(tmp_path):
    cfg = PlaneConfig(cells=2, optim=OptimConfig(lr=3e-3), loss=LossConfig(clip_high=float("inf")))
    with TrainingPlane(cfg, tmp_path / "plane") as plane:
        pids = dict(plane.pids)
        entered = [plane.call(c, "enter_training") for c in (0, 1)]
        reports = []
        for v in range(STEPS // 2):  # burst 1: core + satellite
            feed(plane.queues, toy(v))
            reports.append(plane.call(0, "step", version=v, final=v == STEPS // 2 - 1))
        left = plane.call(1, "leave_training")
        for v in range(STEPS // 2, STEPS):  # burst 2: the satellite comes back
            if v == STEPS // 2:
                plane.call(1, "enter_training")
                ticket = plane.send(0, "step", version=v, final=False)
                assert plane.wait_seated(v, 1) == "joined"
                feed(plane.queues, toy(v))
                reports.append(ticket.result())
                continue
            feed(plane.queues, toy(v))
            reports.append(plane.call(0, "step", version=v, final=v == STEPS - 1))
        infos = [plane.call(c, "info") for c in (0, 1)]

    losses = [r["loss"] for r in reports]
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < 0.8 * losses[0]
    assert all(r["participants"] == [0, 1] for r in reports)
    assert reports[STEPS // 2]["joins"]["1"]["transport"] == "mooncake"  # re-entered: pulled again
    assert entered[1]["resident_bytes"] > 0 and left["resident_bytes"] == 0 and left["role"] == "rollout"
    assert {i["cell"]: i["pid"] for i in infos} == pids
