"""Resume checkpoints of the core cell (``train.checkpoint``), in this process.

A core that trained two updates is saved; a fresh core (in training, or
offloaded as a resumed cell starts) loads it and the next update gives
bit-identical weights to the original's (weights *and* Adam moments came
back exactly), and the RNG streams go on where they were saved. A layout that
differs is refused naming it; a folder without its manifest is never listed
as a checkpoint, one made by ``finalize`` is.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from gyre.real.train.checkpoint import (MANIFEST, checkpoint_name, complete_checkpoints, finalize, load_rank,
                                        save_rank)
from gyre.real.train.cpu_compat import seed_model_rng
from gyre.real.train.model import FlatParameters, LossConfig, ModelConfig, build_gpt
from gyre.real.train.state import OptimConfig, TrainingState
from gyre.real.toy.microsteps import toy_batch

CFG = ModelConfig()
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def new_state(setup, cfg=CFG) -> TrainingState:
    seed_model_rng(cfg.init_seed, setup)
    model = build_gpt(cfg, setup.device)
    return TrainingState(model, FlatParameters(model), OptimConfig(lr=1e-2), LossConfig(), owns_optimizer=True)


def update(state, seed: int) -> None:
    for step in toy_batch(seed, 0, 2):
        state.accumulate(step)
    state.apply_update()


@pytest.mark.parametrize("offloaded", [False, True])
def test_a_loaded_core_takes_the_same_next_update_as_the_saved_one(megatron, tmp_path, offloaded):
    saved = new_state(megatron)
    update(saved, 1)
    update(saved, 2)
    save_rank(saved, tmp_path, 0, 1)
    draws = (torch.rand(3), np.random.random(3), random.random())
    fresh = new_state(megatron)
    update(fresh, 9)  # a different history, to be overwritten
    if offloaded:
        fresh.offload()
    load_rank(fresh, tmp_path, 0, 1)
    assert (torch.equal(torch.rand(3), draws[0]) and np.array_equal(np.random.random(3), draws[1])
            and random.random() == draws[2])
    if offloaded:
        fresh.restore()
    assert torch.equal(fresh.flat.data, saved.flat.data)
    update(saved, 3)
    update(fresh, 3)
    assert torch.equal(fresh.flat.data, saved.flat.data)
    moments = fresh.optimizer.state[fresh.flat.params[0]]
    assert all(torch.equal(v, saved.optimizer.state[saved.flat.params[0]][k]) for k, v in moments.items())


def test_a_checkpoint_of_another_layout_is_refused(megatron, tmp_path):
    save_rank(new_state(megatron), tmp_path, 0, 1)
    with pytest.raises(ValueError, match="tp = 2"):
        load_rank(new_state(megatron), tmp_path, 0, 2)


def test_only_a_folder_with_its_manifest_is_a_checkpoint(megatron, tmp_path):
    root = tmp_path / "checkpoints"
    tmp = root / f".{checkpoint_name(4)}.tmp"
    save_rank(new_state(megatron), tmp, 0, 1)
    half = root / checkpoint_name(6)  # renamed into place, killed before its manifest
    save_rank(new_state(megatron), half, 0, 1)
    assert complete_checkpoints(root) == []
    final = finalize(tmp, {"version": 4, "events": 17})
    assert [(v, f.name) for v, f, _ in complete_checkpoints(root)] == [(4, "resume-v000004")]
    assert json.loads((final / MANIFEST).read_text())["events"] == 17 and not tmp.exists()
    (half / MANIFEST).write_text('{"version": 6, "eve')  # a torn manifest is no manifest
    assert [v for v, _, _ in complete_checkpoints(root)] == [4]
