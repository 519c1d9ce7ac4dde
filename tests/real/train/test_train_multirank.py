"""Multi-rank cells, for real: each cell is two Megatron tensor-parallel ranks (two processes, gloo).

Two planes run once per module (``tp1`` and ``tp2`` fixtures), both loading
the same tiny Hugging Face checkpoint built here from a config (seeded random
weights, nothing downloaded): one cell of TP1, and two cells of TP2 (core and
satellite, four processes). Checked:

- A TP2 cell and a TP1 cell train two steps on the same micro-steps: their
  losses, clip norms and final weights (gathered into Hugging Face tensors
  through mbridge) agree within the stated tolerances, and each rank of the
  TP2 cell holds only its shard.
- Publication from the TP2 cell (shards gathered by the bridge) writes the
  same Hugging Face checkpoint as the TP1 cell's, within TP_TOL, and exactly
  the tensors its own gathered dump holds.
- A TP2 satellite that joins a step in flight pulls its two shards over
  Mooncake (keys per version and rank) and reduces per shard with the core's
  ranks; the core ends with exactly the weights of the core training alone
  and of both cells from the start (per shard, bit for bit: same TP layout in
  both cells, float64 accumulation; see ``gyre.real.train.state``).
- A cell config with PP > 1, a TP that does not divide the model, or TP < 1
  is refused with an error naming the field.

TP_TOL: TP splits the matrix products and sums the partial results with an
all-reduce, so float32 rounding differs from TP1 (gradients differ by ~1e-6
relative, measured); after two Adam steps at lr LR (eps raised, see OPTIM)
the weights differed by at most 6.1e-8 (measured; TP_TOL = 1e-6) and the clip
norms by 7e-8 relative (GRAD_NORM_RTOL = 1e-6).
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

try:
    from test_train_bridge import random_checkpoint
except ImportError:
    from .test_train_bridge import random_checkpoint

from gyre.real.train.bridge import model_config_from_hf
from gyre.real.train.context import CellConfig
from gyre.real.train.plane import CellError, PlaneConfig, TrainingPlane
from gyre.real.train.state import OptimConfig
from gyre.real.toy.microsteps import feed, toy_batch, wait_claimed

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SEED_A, SEED_B, MICROSTEPS = 7, 8, 6
LR = 1e-3
# Adam's eps is raised from 1e-8 so the update is a smooth function of the gradient: with eps = 1e-8
# an element whose gradient is ~1e-8 moves by anything in [-LR, LR] depending on float32 rounding,
# which would hide whether TP2 computes the same step as TP1.
OPTIM = OptimConfig(lr=LR, eps=1e-4)
TP_TOL = 1e-6  # absolute, on weights of scale ~0.05 after two Adam steps of up to LR each
GRAD_NORM_RTOL = 1e-6


def two_steps(plane: TrainingPlane, first: int) -> list[dict]:
    plane.call(0, "enter_training")
    feed(plane.queues, toy_batch(SEED_A, first, MICROSTEPS))
    reports = [plane.call(0, "step", version=first, final=False)]
    feed(plane.queues, toy_batch(SEED_B, first + 1, MICROSTEPS))
    reports.append(plane.call(0, "step", version=first + 1, final=True))
    return reports


def satellite_from_start(plane: TrainingPlane, first: int) -> list[dict]:
    for cell in (0, 1):
        plane.call(cell, "enter_training")
    ticket = plane.send(0, "step", version=first, final=False)
    assert plane.wait_seated(first, 1) == "joined"
    feed(plane.queues, toy_batch(SEED_A, first, MICROSTEPS))
    reports = [ticket.result()]
    feed(plane.queues, toy_batch(SEED_B, first + 1, MICROSTEPS))
    reports.append(plane.call(0, "step", version=first + 1, final=True))
    return reports


def satellite_joins_late(plane: TrainingPlane, first: int) -> list[dict]:
    """The satellite (holding stale weights) enters training while step ``first`` is in flight."""
    plane.call(0, "enter_training")
    ticket = plane.send(0, "step", version=first, final=False)
    steps = toy_batch(SEED_A, first, MICROSTEPS)
    feed(plane.queues, steps[:2], close=False)
    wait_claimed(plane.queues, first, 2)
    plane.call(1, "enter_training")
    assert plane.wait_seated(first, 1) == "joined"
    feed(plane.queues, steps[2:], close=False)
    plane.queues.close_batch(first, len(steps))
    reports = [ticket.result()]
    feed(plane.queues, toy_batch(SEED_B, first + 1, MICROSTEPS))
    reports.append(plane.call(0, "step", version=first + 1, final=True))
    return reports


def dump(plane: TrainingPlane, path, tp: int, *, hf: bool = False) -> dict:
    answer = plane.call(0, "dump", path=str(path), hf=hf)
    shards = [torch.load(str(path) if r == 0 else f"{path}.rank{r}") for r in range(tp)]
    return {"shards": shards, "weights": [s["weights"] for s in shards],
            "hf": torch.load(answer["hf"]) if hf else None}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    ckpt, _ = random_checkpoint(tmp_path_factory.mktemp("ckpt") / "qwen2", "qwen2", False, "float32")
    return ckpt, model_config_from_hf(ckpt, max_sequence_length=64)


@pytest.fixture(scope="module")
def tp1(checkpoint, tmp_path_factory):
    """One TP1 cell: two steps, a gathered dump and a publication."""
    _, cfg = checkpoint
    work = tmp_path_factory.mktemp("tp1")
    with TrainingPlane(PlaneConfig(cells=1, tp=1, model=cfg, optim=OPTIM), work / "plane") as plane:
        reports = two_steps(plane, 0)
        after = dump(plane, work / "after.pt", 1, hf=True)
        published = plane.call(0, "publish", version=1, endpoints=[], directory=str(work / "published"))
        info = plane.call(0, "info")
    return {"reports": reports, "after": after, "published": published["path"], "info": info}


@pytest.fixture(scope="module")
def tp2(checkpoint, tmp_path_factory):
    """Two TP2 cells: satellite from the start, then a late joiner, then the core alone (same data)."""
    _, cfg = checkpoint
    work = tmp_path_factory.mktemp("tp2")
    with TrainingPlane(PlaneConfig(cells=2, tp=2, transport="mooncake", model=cfg, optim=OPTIM),
                       work / "plane") as plane:
        initial = work / "initial.pt"
        out = {"initial": dump(plane, initial, 2)}
        out["full_reports"] = satellite_from_start(plane, 0)
        out["full"] = dump(plane, work / "full.pt", 2, hf=True)
        out["published"] = plane.call(0, "publish", version=1, endpoints=[], directory=str(work / "published"))["path"]

        plane.call(0, "load", path=str(initial))  # the satellite keeps step 0's broadcast: stale
        out["late_reports"] = satellite_joins_late(plane, 2)
        out["late"] = dump(plane, work / "late.pt", 2)

        out["left"] = plane.call(1, "leave_training")
        plane.call(0, "load", path=str(initial))
        out["alone_reports"] = two_steps(plane, 4)
        out["alone"] = dump(plane, work / "alone.pt", 2)
        out["info"] = plane.call(0, "info")

        (work / "blocked.pt.rank1").mkdir()  # rank 1 alone cannot write its shard
        with pytest.raises(CellError) as refused:
            plane.call(0, "dump", path=str(work / "blocked.pt"))
        out["blocked"] = str(refused.value)
        out["again"] = dump(plane, work / "again.pt", 2)  # the cell still serves, every rank in step
    return out


@pytest.mark.timeout(600)
def test_tp2_cell_trains_like_tp1(checkpoint, tp1, tp2):
    ckpt, _ = checkpoint
    initial = load_file(str(ckpt / "model.safetensors"))
    assert tp1["info"]["tp"] == 1 and tp2["info"]["tp"] == 2
    full = tp1["after"]["weights"][0].numel()
    assert [s["rank"] for s in tp2["full"]["shards"]] == [0, 1]
    assert all(w.numel() < full for w in tp2["full"]["weights"])  # each rank holds a shard only
    assert sum(w.numel() for w in tp2["full"]["weights"]) > full  # replicated norms held twice
    for a, b in zip(tp1["reports"], tp2["alone_reports"]):
        assert a["microsteps"] == b["microsteps"] == MICROSTEPS and b["participants"] == [0]
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=GRAD_NORM_RTOL)
    one, two = tp1["after"]["hf"], tp2["full"]["hf"]
    assert one.keys() == two.keys() == initial.keys()
    moved = max(float((one[k] - initial[k]).abs().max()) for k in initial)
    assert moved > 0.5 * LR  # the steps moved the weights by far more than the tolerance
    for name in initial:
        assert one[name].shape == two[name].shape
        torch.testing.assert_close(two[name], one[name], rtol=0, atol=TP_TOL, msg=name)


@pytest.mark.timeout(600)
def test_tp2_publication_equals_tp1_publication(checkpoint, tp1, tp2):
    ckpt, _ = checkpoint
    initial = load_file(str(ckpt / "model.safetensors"))
    pub_one = load_file(os.path.join(tp1["published"], "model.safetensors"))
    pub_two = load_file(os.path.join(tp2["published"], "model.safetensors"))
    assert pub_two.keys() == pub_one.keys() == initial.keys()
    for name in initial:
        assert torch.equal(pub_two[name], tp2["full"]["hf"][name]), name
        torch.testing.assert_close(pub_two[name], pub_one[name], rtol=0, atol=TP_TOL, msg=name)
    configs = [json.loads(open(os.path.join(p, "config.json")).read()) for p in (tp1["published"], tp2["published"])]
    assert configs[0] == configs[1] and configs[0]["model_type"] == "qwen2"


@pytest.mark.timeout(600)
def test_tp2_satellite_joining_mid_step_gives_the_same_weights(tp2):
    full, late, alone = tp2["full_reports"], tp2["late_reports"], tp2["alone_reports"]
    assert full[0]["participants"] == [0, 1] and late[0]["participants"] == [0, 1]
    assert 1 <= late[0]["by_cell"]["1"] <= MICROSTEPS - 2
    join = late[0]["joins"]["1"]
    w0 = tp2["initial"]["weights"]
    assert join["transport"] == "mooncake" and join["ranks"] == 2 and join["bytes"] == w0[0].numel() * 4
    assert alone[0]["participants"] == [0] and tp2["left"]["role"] == "rollout"
    for shard in (0, 1):
        assert not torch.equal(tp2["full"]["weights"][shard], w0[shard])
        assert torch.equal(tp2["full"]["weights"][shard], tp2["late"]["weights"][shard]), f"shard {shard}"
        assert torch.equal(tp2["full"]["weights"][shard], tp2["alone"]["weights"][shard]), f"shard {shard}"
    for a, b in zip(full, late):
        assert a["grad_norm"] == b["grad_norm"]


@pytest.mark.timeout(600)
def test_tp2_dump_returns_after_every_shard_and_names_a_failing_rank(tp2):
    # the leader answers a dump only once each rank wrote its file: every shard loads at once (the fixture)
    assert "'dump' failed on rank 1:" in tp2["blocked"] and "rank 0" not in tp2["blocked"], tp2["blocked"]
    for shard in (0, 1):
        assert torch.equal(tp2["again"]["weights"][shard], tp2["alone"]["weights"][shard]), f"shard {shard}"


@pytest.mark.parametrize("fields, message", [({"pp": 2}, "pp must be 1"), ({"tp": 3}, "not divisible by tp = 3"),
                                             ({"tp": 0}, "tp must be a positive int")])
def test_cell_config_refuses_layouts_it_cannot_run(fields, message):
    with pytest.raises(ValueError, match=message):
        CellConfig(cells=2, store_port=1, queue_root="q", workdir="w", **fields)
