"""Publishing the core's weights to SGLang rollout engines after a burst's final update.

Two paths, both against SGLang's HTTP weight-update endpoints (contracts read
from sglang ``srt/entrypoints/http_server.py`` and ``srt/managers/io_struct.py``):

- **from disk** (works with SGLang's CPU engine): ``save_hf_checkpoint`` writes
  the Megatron weights as a Hugging Face Qwen2/Qwen3 checkpoint (``config.json`` +
  ``model.safetensors``, with the tokenizer files and chat template of the model's
  ``tokenizer`` folder, default its ``checkpoint``; folders 0755 and files 0644
  whatever the umask, so a user can load or serve it as it is: docs/gpu.md,
  "Checkpoints"; written to a temporary folder and renamed into place,
  so an engine never sees a half-written checkpoint); then
  ``POST /update_weights_from_disk`` with ``{"model_path", "load_format",
  "abort_all_requests", "weight_version"}``. The engine answers
  ``{"success", "message", "num_paused_requests"}`` with 200, or 400 on failure.
- **distributed** (GPU path): ``POST /init_weights_update_group`` with
  ``{"master_address", "master_port", "rank_offset", "world_size",
  "group_name", "backend"}`` once, then per bucket ``POST
  /update_weights_from_distributed`` with ``{"names", "dtypes", "shapes",
  "group_name", "flush_cache", "weight_version"}`` while the trainer
  broadcasts each tensor, in that order, from rank 0 of the update group. The
  caller supplies the broadcast (it owns the trainer-engine process group).

A cell of several TP ranks gathers its shards into full tensors first
(``train.ranks``: mbridge's export all-gathers over the TP group) and writes
them with ``save_hf_tensors``. The checkpoint is exported through ``train.bridge`` (mbridge's Qwen2/Qwen3
converter with the local-spec name rules): no Megatron -> Hugging Face mapping
lives here. ``hf_state_dict`` and ``qwen2_config`` keep their names for
callers; ``qwen2_config`` is the ``config.json`` of whichever family ``cfg``
describes (Qwen2 for the default toy model).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

import torch

from gyre.real.train.bridge import export_hf, hf_config_dict, save_hf_folder
from gyre.real.train.model import ModelConfig


class PublishError(RuntimeError):
    """An engine refused or could not be reached; the message names the engine and its answer."""


class EngineUnreachable(PublishError):
    """No answer at all from an engine (dead, or not up yet), as opposed to a refusal."""


def qwen2_config(cfg: ModelConfig) -> dict:
    """``config.json`` of a published checkpoint (``train.bridge.hf_config_dict``; the name is historical)."""
    return hf_config_dict(cfg)


def hf_state_dict(named: list[tuple[str, torch.Tensor]], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Megatron GPT (``train.model.build_gpt``) tensors under Hugging Face names (copies, contiguous),
    converted by the bridge (``train.bridge.export_hf``)."""
    return export_hf(named, cfg)


def save_hf_checkpoint(directory: str | os.PathLike, named: list[tuple[str, torch.Tensor]], cfg: ModelConfig,
                       version: int) -> Path:
    """Write ``directory/v{version:06d}`` atomically from a TP = 1 model's tensors; returns its path."""
    return save_hf_tensors(directory, hf_state_dict(named, cfg), cfg, version)


def checkpoint_folder(directory: str | os.PathLike, version: int) -> Path:
    """Where ``save_hf_tensors`` puts version ``version`` under ``directory``."""
    return Path(directory) / f"v{version:06d}"


def save_hf_tensors(directory: str | os.PathLike, tensors: dict[str, torch.Tensor], cfg: ModelConfig,
                    version: int) -> Path:
    """Write Hugging Face ``tensors`` (already converted, e.g. gathered from TP shards by
    ``train.bridge.export_hf_model``) as ``directory/v{version:06d}`` atomically; returns its path."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    final = checkpoint_folder(root, version)
    if final.exists():
        raise FileExistsError(f"checkpoint of version {version} already exists at {final}")
    tmp = Path(tempfile.mkdtemp(prefix=f".v{version:06d}-", dir=root))
    try:
        save_hf_folder(tmp, tensors, cfg, metadata={"gyre_version": str(version)})
        copy_tokenizer(cfg.tokenizer or cfg.checkpoint, tmp)
        make_readable(tmp)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


# Tokenizer, chat template and generation defaults of a Hugging Face folder (never weights or config.json).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "merges.txt",
                   "special_tokens_map.json", "added_tokens.json", "chat_template.jinja", "chat_template.json",
                   "generation_config.json")


def copy_tokenizer(source: str | os.PathLike | None, folder: Path) -> list[str]:
    """Copy ``source``'s tokenizer files (``TOKENIZER_FILES``) into ``folder``; the names copied."""
    if source is None:
        return []
    copied = [name for name in TOKENIZER_FILES if (Path(source) / name).is_file()]
    for name in copied:
        shutil.copyfile(Path(source) / name, folder / name)
    return copied


def make_readable(folder: Path) -> None:
    """Folders 0755, files 0644 (``mkdtemp`` makes 0700, a strict umask 0600)."""
    for path in folder.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    folder.chmod(0o755)


def post_json(url: str, payload: dict, timeout: float) -> dict:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as err:
        raise PublishError(f"{url} answered {err.code}: {err.read()[:500]!r}") from err
    except (urllib.error.URLError, OSError) as err:
        raise EngineUnreachable(f"{url} unreachable: {err}") from err
    if body.get("success") is False:
        raise PublishError(f"{url} refused: {body.get('message')!r}")
    return body


def publish_from_disk(endpoints: list[str], path: Path, version: int, *, timeout: float = 120.0,
                      abort_all_requests: bool = False) -> list[dict]:
    """Ask every engine to load ``path``; all answers, or PublishError naming the first failure."""
    payload = {"model_path": str(path), "load_format": None, "abort_all_requests": abort_all_requests,
               "weight_version": str(version)}
    return [post_json(f"{e.rstrip('/')}/update_weights_from_disk", payload, timeout) for e in endpoints]


def init_update_group(endpoint: str, *, master_address: str, master_port: int, rank_offset: int,
                      world_size: int, group_name: str = "weight_update_group", backend: str = "nccl",
                      timeout: float = 120.0) -> dict:
    payload = {"master_address": master_address, "master_port": master_port, "rank_offset": rank_offset,
               "world_size": world_size, "group_name": group_name, "backend": backend}
    return post_json(f"{endpoint.rstrip('/')}/init_weights_update_group", payload, timeout)


def publish_distributed(endpoint: str, named: list[tuple[str, torch.Tensor]], version: int,
                        broadcast: Callable[[torch.Tensor], None], *, group_name: str = "weight_update_group",
                        bucket_bytes: int = 256 << 20, timeout: float = 120.0) -> list[dict]:
    """Per bucket: POST the metadata in a thread while ``broadcast`` sends each tensor in order."""
    answers = []
    for bucket in _buckets(named, bucket_bytes):
        payload = {"names": [n for n, _ in bucket], "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in bucket],
                   "shapes": [list(t.shape) for _, t in bucket], "group_name": group_name,
                   "flush_cache": True, "weight_version": str(version)}
        result: dict = {}
        poster = threading.Thread(target=_post_into, args=(f"{endpoint.rstrip('/')}/update_weights_from_distributed",
                                                           payload, timeout, result))
        poster.start()
        for _, tensor in bucket:
            broadcast(tensor)
        poster.join(timeout)
        if "error" in result or "answer" not in result:
            raise PublishError(f"distributed update of version {version} failed: {result.get('error', 'no answer')}")
        answers.append(result["answer"])
    return answers


def _post_into(url: str, payload: dict, timeout: float, result: dict) -> None:
    try:
        result["answer"] = post_json(url, payload, timeout)
    except PublishError as err:
        result["error"] = str(err)


def _buckets(named, limit: int):
    bucket, size = [], 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > limit:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket
