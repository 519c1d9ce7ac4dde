"""Resume checkpoints of the core cell: model, optimizer and RNG states, one file per TP rank.

A checkpoint is a folder ``resume-v{version:06d}`` under the run's
``checkpoints/``. It holds ``rank{r}.pt`` for every TP rank r of the core
cell (``save_rank``: the rank's flat parameter shard, its Adam state, the
names and shapes of the shard's tensors, and the rank's torch / numpy /
Python RNG states) and, written last, ``manifest.json`` (the driver's
record: which version, the event-log position the core was at, the last
published version, ``tp``; ``runtime.resume``) beside the driver's
``metrics.json`` (the run's measurements up to then: ``runtime.restore``).
The cell writes into a temporary folder ``.resume-v{version:06d}.tmp``; the
driver fsyncs it,
renames it into place and then writes the manifest (temp file + rename), so
a folder without a manifest is an interrupted write and is never taken
(``complete_checkpoints``).

Why not ``megatron.core.dist_checkpointing``: its ``save``/``load`` are
collectives over the *default* process group (its coordinator is global rank 0
and it exchanges sharding metadata with ``all_gather_object`` over the whole
world), and here the world spans all K cells' ranks while only the core
holds the optimizer; the satellites are busy with their own commands (going
back to rollout) when the core checkpoints. The core's state is also not a
Megatron ``sharded_state_dict`` but one flat shard per TP rank (``train.model.
FlatParameters``) under a plain ``torch.optim.Adam``. So each rank saves its
own shard and optimizer, which is what dist_checkpointing's sharded layout
would hold for a fixed TP degree; a resume needs the same ``tp`` (checked).

Satellites are not checkpointed: they hold no state of their own between
bursts (they pull the core's weights when they join; the model has no dropout,
so no step draws from their RNG streams).

Invariants: a checkpoint restores exactly the saved weights and Adam state
(bit for bit: both are copied, never recomputed) and each rank's RNG states;
loading works whether the cell is in training or offloaded (an offloaded
core keeps the loaded optimizer state on the host until ``restore``).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import torch

from gyre.real.store.durable import fsync_path

PREFIX = "resume-v"
MANIFEST = "manifest.json"


def checkpoint_name(version: int) -> str:
    return f"{PREFIX}{version:06d}"


def rank_file(folder: str | os.PathLike, rank: int) -> Path:
    return Path(folder) / f"rank{rank}.pt"


def rng_states() -> dict:
    states = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    np.random.set_state(states["numpy"])
    random.setstate(states["python"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def save_rank(state, folder: str | os.PathLike, rank: int, tp: int) -> str:
    """Write rank ``rank``'s shard, Adam state and RNG states to ``folder/rank{rank}.pt``."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    data = {"weights": state.flat.data.detach().cpu().clone(), "names": list(state.flat.names),
            "shapes": [list(s) for s in state.flat.shapes], "optimizer": state.optimizer_state_dict(),
            "rng": rng_states(), "rank": rank, "tp": tp}
    target = rank_file(folder, rank)
    torch.save(data, target)
    return str(target)


def load_rank(state, folder: str | os.PathLike, rank: int, tp: int) -> None:
    """Restore rank ``rank`` from ``folder``; ValueError naming the mismatch when the layout differs."""
    data = torch.load(rank_file(folder, rank), weights_only=False)
    if data["tp"] != tp or list(data["names"]) != list(state.flat.names):
        raise ValueError(f"checkpoint {folder} was written by a cell of tp = {data['tp']} with "
                         f"{len(data['names'])} tensors; this cell has tp = {tp} and {len(state.flat.names)}")
    if data["weights"].numel() != state.flat.numel:
        raise ValueError(f"checkpoint {folder}: rank {rank} holds {data['weights'].numel()} values, "
                         f"the cell's shard {state.flat.numel}")
    state.load_weights(data["weights"], reset_optimizer=True)
    state.load_optimizer_state(data["optimizer"])
    set_rng_states(data["rng"])


def read_manifest(folder: str | os.PathLike) -> dict | None:
    """The manifest of a checkpoint folder, or None when it has none (an interrupted write) or it is unreadable."""
    path = Path(folder) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and isinstance(manifest.get("version"), int) else None


def complete_checkpoints(root: str | os.PathLike) -> list[tuple[int, Path, dict]]:
    """(version, folder, manifest) of every complete checkpoint under ``root``, oldest first."""
    found = []
    for folder in sorted(Path(root).glob(f"{PREFIX}*")) if Path(root).is_dir() else ():
        manifest = read_manifest(folder)
        if folder.is_dir() and manifest is not None and folder.name == checkpoint_name(manifest["version"]):
            found.append((manifest["version"], folder, manifest))
    return sorted(found, key=lambda item: item[0])


def fsync_tree(folder: str | os.PathLike) -> None:
    """Force every file in ``folder`` and the folder itself to disk."""
    for path in Path(folder).iterdir():
        if path.is_file():
            fsync_path(path)
    fsync_path(folder)


def finalize(tmp: str | os.PathLike, manifest: dict) -> Path:
    """Make the cell's temporary folder checkpoint ``manifest['version']``: fsync, rename, manifest last."""
    tmp = Path(tmp)
    final = tmp.parent / checkpoint_name(manifest["version"])
    fsync_tree(tmp)
    os.rename(tmp, final)
    fsync_path(final.parent)
    staging = final / f".{MANIFEST}.tmp"
    staging.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    fsync_path(staging)
    os.rename(staging, final / MANIFEST)
    fsync_path(final)
    return final
