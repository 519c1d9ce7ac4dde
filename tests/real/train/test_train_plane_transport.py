"""Weight pulls between cell processes: Mooncake (tcp) is byte-exact; the torch.distributed fallback
delivers the same bytes.

The core is loaded with random weights (so a pull that did nothing would fail:
every cell starts from the same seeded initialisation); a satellite joins a
final step, pulls, accumulates (which never writes weights) and is released;
its dumped buffer is then exactly what it pulled.
"""

from __future__ import annotations

import pytest
import torch

from gyre.real.train.plane import PlaneConfig, TrainingPlane
from gyre.real.toy.microsteps import feed, toy_batch


def pulled_weights(tmp_path, transport: str, random_weights: torch.Tensor | None) -> tuple[torch.Tensor, dict, torch.Tensor]:
    with TrainingPlane(PlaneConfig(cells=2, transport=transport), tmp_path / transport) as plane:
        if random_weights is None:
            numel = torch.load(plane.call(0, "dump", path=str(tmp_path / "init.pt"))["path"])["weights"].numel()
            random_weights = torch.randn(numel, generator=torch.Generator().manual_seed(3))
        torch.save({"weights": random_weights}, tmp_path / "random.pt")
        plane.call(0, "load", path=str(tmp_path / "random.pt"))
        plane.call(0, "enter_training")
        plane.call(1, "enter_training")
        ticket = plane.send(0, "step", version=0, final=True)
        assert plane.wait_seated(0, 1) == "joined"
        feed(plane.queues, toy_batch(5, 0, 4))
        report = ticket.result()
        satellite = torch.load(plane.call(1, "dump", path=str(tmp_path / f"{transport}-sat.pt"))["path"])
    return satellite["weights"], report, random_weights


@pytest.mark.timeout(120)
def test_mooncake_pull_is_byte_exact_and_fallback_matches(tmp_path):
    via_mooncake, report_m, sent = pulled_weights(tmp_path, "mooncake", None)
    via_torch, report_t, _ = pulled_weights(tmp_path, "torch", sent)
    assert report_m["joins"]["1"]["transport"] == "mooncake" and report_t["joins"]["1"]["transport"] == "torch"
    assert report_m["joins"]["1"]["bytes"] == sent.numel() * 4
    assert via_mooncake.numpy().tobytes() == sent.numpy().tobytes()
    assert via_torch.numpy().tobytes() == sent.numpy().tobytes()
    assert report_m["grad_norm"] == report_t["grad_norm"]  # same snapshot, same gradients
