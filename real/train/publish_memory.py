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

``MemoryRoute`` is what the core cell keeps across bursts (``train.cell``,
``publication = "memory"``): one open group per set of engines, reopened when
the set changes (an engine back from training, or revived); when the group
cannot be opened because an engine refuses ``/init_weights_update_group`` it
says why in one log line and the run publishes from disk from then on; an
engine that does not answer at all (dead, being revived) sends only that
publication through the disk.

Invariants (tested against a live SGLang CPU engine): after ``publish`` the
engine serves exactly the published tensors (its log-probabilities equal a
transformers forward of the same tensors); a refusal or a dead engine is a
``PublishError`` naming the engine; a route that failed holds no group.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from typing import Iterable

import torch

from gyre.real.runtime.ports import free_port
from gyre.real.train.publish import EngineUnreachable, PublishError, _buckets, post_json

GROUP = "gyre_weights"


def _join(rank: int, world: int, host: str, port: int, backend: str, timeout: datetime.timedelta):
    """This process's member of a new process group beside (not inside) any default group: what SGLang's
    ``init_custom_process_group`` does on the engines' side, with the same torch."""
    from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world, rendezvous

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
            results[i]["error"] = err

    threads = [threading.Thread(target=post, args=(i, url), daemon=True) for i, url in enumerate(urls)]
    for thread in threads:
        thread.start()
    return threads, results


def _finish(threads, results, urls, what: str, timeout: float) -> list[dict]:
    """The engines' answers, or PublishError naming each engine that refused or did not answer
    (``EngineUnreachable`` when none refused: every failed engine was simply not there)."""
    for thread in threads:
        thread.join(timeout)
    failed = [(url, r.get("error")) for url, r in zip(urls, results) if "answer" not in r]
    if failed:
        kind = EngineUnreachable if all(isinstance(e, EngineUnreachable) for _, e in failed) else PublishError
        raise kind(f"{what} failed on " + "; ".join(f"{url}: {e or 'no answer'}" for url, e in failed))
    return [r["answer"] for r in results]


def _refused_early(results: list[dict]) -> bool:
    return any("error" in r for r in results)


class MemoryPublisher:
    """Rank 0 of one weight-update group with ``engines`` (url -> TP size); open once, publish every burst."""

    def __init__(self, engines: dict[str, int], *, host: str = "127.0.0.1", backend: str | None = None,
                 bucket_bytes: int = 256 << 20, timeout: float = 300.0) -> None:
        self.urls, self.tps = list(engines), list(engines.values())
        self.host, self.backend = host, backend
        self.bucket_bytes, self.timeout = bucket_bytes, timeout
        self.group = None

    def open(self, device: torch.device) -> MemoryPublisher:
        backend = self.backend or ("nccl" if device.type == "cuda" else "gloo")
        port, world = free_port(self.host), 1 + sum(self.tps)
        offsets = [1 + sum(self.tps[:i]) for i in range(len(self.tps))]
        threads, results = _post_all(self.urls, "/init_weights_update_group", lambda i: {
            "master_address": self.host, "master_port": port, "rank_offset": offsets[i], "world_size": world,
            "group_name": GROUP, "backend": backend}, self.timeout)
        joined: dict = {}

        def join() -> None:
            try:
                joined["group"] = _join(0, world, self.host, port, backend, datetime.timedelta(seconds=self.timeout))
            except Exception as exc:  # the rendezvous timed out: an engine never came
                joined["error"] = exc

        joiner = threading.Thread(target=join, name="gyre-weight-group", daemon=True)
        joiner.start()
        deadline = time.monotonic() + self.timeout
        while joiner.is_alive() and not _refused_early(results) and time.monotonic() < deadline:
            joiner.join(0.05)  # an engine that refuses (or is gone) ends the wait at once, not at the timeout
        self.group = joined.get("group")
        wait = 1.0 if _refused_early(results) else self.timeout  # the others may wait on the refused one's rank
        _finish(threads, results, self.urls, "joining the weight-update group", wait)
        if self.group is None:
            raise PublishError(f"joining the weight-update group: {joined.get('error', 'timed out')}")
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
            threads, results = _post_all(self.urls, "/update_weights_from_distributed", lambda i, body=payload: body,
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


class MemoryRoute:
    """The core cell's publications from memory over a run: ``publish`` answers the engines' swap seconds,
    or None when this publication goes through the disk instead (memory refused once: logged, for good)."""

    def __init__(self, host: str, log: logging.Logger, *, bucket_bytes: int = 256 << 20,
                 open_timeout: float = 60.0, timeout: float = 300.0) -> None:
        self.host, self.log = host, log
        self.bucket_bytes, self.open_timeout, self.timeout = bucket_bytes, open_timeout, timeout
        self.publisher: MemoryPublisher | None = None
        self.engines: dict[str, int] = {}
        self.refused: str | None = None  # why memory cannot work here; set once, disk from then on

    def publish(self, engines: dict[str, int], named: list[tuple[str, torch.Tensor]], version: int,
                device: torch.device) -> float | None:
        if self.refused is not None or not engines:
            return None
        if engines != self.engines:
            self.close()
            try:
                self.publisher = MemoryPublisher(engines, host=self.host, bucket_bytes=self.bucket_bytes,
                                                 timeout=self.open_timeout).open(device)
            except EngineUnreachable as exc:  # an engine not there now: this publication only (it names it)
                self.close()
                self.log.warning("publication of version %d from disk: %s", version, exc)
                return None
            except Exception as exc:  # an engine that refuses the group: memory cannot work here
                self.close()
                self.refused = f"{type(exc).__name__}: {exc}"
                self.log.warning("publication from memory unavailable (%s); publishing from disk from now on",
                                 self.refused)
                return None
            self.publisher.timeout, self.engines = self.timeout, dict(engines)
        t0 = time.perf_counter()
        try:
            self.publisher.publish(named, version)
        except BaseException:
            self.close()  # a group an engine left mid-broadcast is not reused
            raise
        return time.perf_counter() - t0

    def close(self) -> None:
        if self.publisher is not None:
            try:
                self.publisher.close()
            except Exception:  # a broken group: nothing more to release
                self.log.debug("closing the weight-update group failed", exc_info=True)
        self.publisher, self.engines = None, {}
