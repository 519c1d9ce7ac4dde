"""The backend's part for publications: new weights to the rollout engines, with a fallback.

``Publish(v)`` first runs ``on_burst_end(v)`` (the resume checkpoint is sent
to the core cell while it still holds exactly version v: ``runtime.restore``),
then sends ``publish`` to the core cell: version v swapped into every rollout
engine taking work that the engine watch does not report down (a dead one is
revived with the newest weights), from memory or from disk as the job's
``publication`` says (``Parts.publication``; ``train.cell``), and an HF
checkpoint of v written either way. When an engine dies while the core cell loads the checkpoint into
it, the publisher loads it into the engines still alive itself. Then the
proxy learns the policy version and ``PublishDone`` is reported.

State it owns (``snapshot()`` / ``restore()``): ``latest``, the newest
published (version, path); ``publishing`` is the publication in flight (a
cell going back to rollout waits for it).

Invariants: ``latest`` only moves forward, once the checkpoint is written and
loaded; ``PublishDone(v)`` is reported after the proxy was told version v.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from gyre import actions as act
from gyre import events as ev
from gyre.real.runtime.backend_context import BackendContext
from gyre.real.runtime.proxy_admin import ProxyAdmin

PUBLISH_WAIT_S = 600.0


class Publisher:
    def __init__(self, ctx: BackendContext, proxy: ProxyAdmin, *, rollout_ready: Callable[[], set[int]]) -> None:
        self.ctx, self.proxy, self._rollout_ready = ctx, proxy, rollout_ready
        self.latest: tuple[int, str] | None = None  # newest published (version, path)
        self.publishing: asyncio.Task | None = None
        # a burst's end, before its publication is sent (the resume checkpoint: runtime.restore)
        self.on_burst_end: Callable[[int], None] = lambda version: None

    def publish(self, a: act.Publish) -> None:
        self.on_burst_end(a.version)  # sent to the core cell first: it still holds exactly this version
        parts = self.ctx.parts
        skip = parts.watch.unavailable() if parts.watch is not None else set()  # dead: revived later
        names = [n for n in (parts.engine_names[c] for c in sorted(self._rollout_ready())) if n not in skip]
        ticket = self.ctx.send_to_cell(0, "publish", version=a.version,
                                       endpoints=[parts.engines.engines[n].url for n in names],
                                       directory=str(parts.checkpoint_dir), route=parts.publication,
                                       engine_tp=parts.engine_tp)
        self.publishing = self.ctx.spawn(self._await_publish(a.version, ticket, names))

    async def _await_publish(self, version: int, ticket, names: list[str]) -> None:
        t0, n = self.ctx.clock(), len(names)
        try:
            answer = await asyncio.to_thread(ticket.result, PUBLISH_WAIT_S)
        except Exception as exc:  # an engine died while the cell loaded the checkpoint into it: load the rest here
            answer = await self._publish_past_dead_engine(version, names, exc)
        self.latest = (version, answer["path"])
        self.ctx.metrics.publishes.append({"version": version, "engines": n, "wall_s": self.ctx.clock() - t0,
                                           **{k: answer[k] for k in ("route", "swap_s", "write_s") if k in answer}})
        await self.proxy.call("POST", "/admin/policy_version", {"version": version})
        self.ctx.report(ev.PublishDone, version=version)

    async def _publish_past_dead_engine(self, version: int, names: list[str], error: Exception) -> dict:
        """The checkpoint of ``version`` is written; load it into the engines still alive (the engine watch
        revives the dead one with it). Re-raises the publish's error when no engine of ``names`` died."""
        watch = self.ctx.parts.watch
        if watch is None or not set(names) & watch.unavailable():
            raise error
        from gyre.real.train.publish import checkpoint_folder

        path = checkpoint_folder(self.ctx.parts.checkpoint_dir, version)
        if not path.is_dir():
            raise error
        self.ctx.progress(f"publish {version}: engine(s) {sorted(set(names) & watch.unavailable())} died during "
                          f"the load; loading the rest from {path}")
        for name in names:
            if name not in watch.unavailable():
                await asyncio.to_thread(self.ctx.parts.engines.update_weights_from_disk, name, str(path),
                                        weight_version=str(version))
        return {"path": str(path)}

    def snapshot(self) -> dict[str, Any]:
        return {"latest": None if self.latest is None else list(self.latest)}

    def restore(self, state: dict[str, Any]) -> None:
        self.latest = None if state["latest"] is None else (int(state["latest"][0]), str(state["latest"][1]))
