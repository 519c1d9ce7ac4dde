"""Publication from memory: the core broadcasts its weights to SGLang engines over a weight-update group.

SGLang 0.5.23's engines join a process group the trainer opens
(``POST /init_weights_update_group``: ``master_address``, ``master_port``,
``rank_offset``, ``world_size``, ``group_name``, ``backend``; the engine's TP rank
r takes rank ``rank_offset + r``), then per bucket receive a broadcast from
rank 0 (``POST /update_weights_from_distributed`` with the bucket's names,
dtypes and shapes, posted to every engine before the trainer broadcasts the
bucket's tensors in that order), all of it inside one weight-update session
(``POST /begin_weight_update`` ... ``/end_weight_update``: 0.5.23 refuses an
update outside one). The trainer is rank 0; engine i takes ranks
``1 + sum(tp of engines before i)``. Backend: NCCL when the weights are on CUDA,
gloo otherwise (the CPU engines). The engine holds its scheduler only while a
bucket's tensors load (SGLang pauses generation for the swap); nothing is
written to disk, which stays the checkpoint path (``train.publish``).

Invariants (tested against a live SGLang CPU engine): after ``publish`` the
engine serves exactly the published tensors (its log-probabilities equal a
transformers forward of the same tensors); a refusal or a dead engine is a
``PublishError`` naming the engine.
"""

from __future__ import annotations

import datetime
import socket
import threading
from typing import Iterable

import torch

from gyre.real.train.publish import PublishError, _buckets, post_json

GROUP = "gyre_weights"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _join(rank: int, world: int, host: str, port: int, backend: str, timeout: datetime.timedelta):
    """This process's member of a new process group beside (not inside) any default group: what SGLang's
    ``init_custom_process_group`` does on the engines' side, with the same torch."""
    from torch.distributed.distributed_c10d import (Backend, PrefixStore, _new_process_group_helper, _world,
                                                    rendezvous)

    store, rank, world = next(rendezvous(f"tcp://{host}:{port}", rank, world, timeout=timeout))
    store.set_timeout(timeout)
    pg, _ = _new_process_group_helper(world, rank, [], Backend(backend), PrefixStore(GROUP, store), group_name=GROUP,
                                      backend_options=None, timeout=timeout)
    _world.pg_group_ranks[pg] = {i: i for i in range(world)}
    return pg


def _post_all(urls: Iterable[str], path: str, payload_of, timeout: float) -> tuple[list, list[dict]]:
    """POST to every engine at once, each in a thread (a call returns once the group's collective is done)."""
    urls = list(urls)
    results: list[dict] = [{} for _ in urls]

    def post(i: int, url: str) -> None:
        try:
            results[i]["answer"] = post_json(f"{url.rstrip('/')}{path}", payload_of(i), timeout)
        except PublishError as err:
            results[i]["error"] = str(err)

    threads = [threading.Thread(target=post, args=(i, url), daemon=True) for i, url in enumerate(urls)]
    for thread in threads:
        thread.start()
    return threads, results


def _finish(threads, results, urls, what: str, timeout: float) -> list[dict]:
    """The engines' answers, or PublishError naming each engine that refused or did not answer."""
    for thread in threads:
        thread.join(timeout)
    failed = [f"{url}: {r.get('error', 'no answer')}" for url, r in zip(urls, results) if "answer" not in r]
    if failed:
        raise PublishError(f"{what} failed on " + "; ".join(failed))
    return [r["answer"] for r in results]


class MemoryPublisher:
    """Rank 0 of one weight-update group with ``engines`` (url -> TP size); open once, publish every burst."""

    def __init__(self, engines: dict[str, int], *, host: str = "127.0.0.1", backend: str | None = None,
                 bucket_bytes: int = 256 << 20, timeout: float = 300.0) -> None:
        self.urls, self.tps = list(engines), list(engines.values())
        self.host, self.backend = host, backend
        self.bucket_bytes, self.timeout = bucket_bytes, timeout
        self.group = None

    def open(self, device: torch.device) -> "MemoryPublisher":
        backend = self.backend or ("nccl" if device.type == "cuda" else "gloo")
        port, world = free_port(self.host), 1 + sum(self.tps)
        offsets = [1 + sum(self.tps[:i]) for i in range(len(self.tps))]
        threads, results = _post_all(self.urls, "/init_weights_update_group", lambda i: {
            "master_address": self.host, "master_port": port, "rank_offset": offsets[i], "world_size": world,
            "group_name": GROUP, "backend": backend}, self.timeout)
        try:
            self.group = _join(0, world, self.host, port, backend, datetime.timedelta(seconds=self.timeout))
        finally:
            _finish(threads, results, self.urls, "joining the weight-update group", self.timeout)
        return self

    def publish(self, named: list[tuple[str, torch.Tensor]], version: int) -> int:
        """Broadcast ``named`` (Hugging Face names, full tensors) bucket by bucket; returns the bytes sent."""
        if self.group is None:
            raise RuntimeError("MemoryPublisher.publish before open()")
        self._all("/begin_weight_update", {}, f"opening the weight update of version {version}")
        try:
            return self._send(named, version)
        finally:
            self._all("/end_weight_update", {}, f"closing the weight update of version {version}")

    def _all(self, path: str, payload: dict, what: str) -> list[dict]:
        threads, results = _post_all(self.urls, path, lambda i: payload, self.timeout)
        return _finish(threads, results, self.urls, what, self.timeout)

    def _send(self, named: list[tuple[str, torch.Tensor]], version: int) -> int:
        sent = 0
        for bucket in _buckets(named, self.bucket_bytes):
            payload = {"names": [n for n, _ in bucket],
                       "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in bucket],
                       "shapes": [list(t.shape) for _, t in bucket], "group_name": GROUP,
                       "flush_cache": True, "weight_version": str(version)}
            threads, results = _post_all(self.urls, "/update_weights_from_distributed", lambda i: payload,
                                         self.timeout)
            try:
                for _, tensor in bucket:
                    torch.distributed.broadcast(tensor.contiguous(), src=0, group=self.group)
                    sent += tensor.numel() * tensor.element_size()
            finally:
                _finish(threads, results, self.urls, f"in-memory update of version {version}", self.timeout)
        return sent

    def close(self) -> None:
        if self.group is None:
            return
        for url in self.urls:
            try:
                post_json(f"{url.rstrip('/')}/destroy_weights_update_group", {"group_name": GROUP}, 30.0)
            except PublishError:
                pass  # an engine that is gone holds no group
        torch.distributed.destroy_process_group(self.group)
        self.group = None
