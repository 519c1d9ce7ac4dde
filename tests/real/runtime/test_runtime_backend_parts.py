"""``RealBackend``'s parts each own their state: ``snapshot()`` / ``restore()`` round-trip it.

A resumed run (``runtime.restore``) sets the parts only through ``restore()``;
so a snapshot restored into a fresh backend must give the same snapshot back,
survive JSON (it goes beside a checkpoint), and share nothing mutable with the
backend it came from.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from gyre import actions as act
from gyre.config import SchedulerConfig
from gyre.real.runtime.backend import RealBackend
from gyre.real.runtime.proxy_admin import InlineAdmin

CFG = SchedulerConfig(K=3, C_e=2, C_s=0, N=2, B=2, phi=0.0, mu=1, granularity="fine", streaming=True)


def backend(tmp_path) -> RealBackend:
    parts = SimpleNamespace(engine_names={0: "e0", 1: "e1", 2: "e2"}, records_dir=tmp_path / "records",
                            watch=None, runner=SimpleNamespace(budgets=SimpleNamespace(overall_timeout_s=60.0)),
                            task=SimpleNamespace(task=lambda query: SimpleNamespace(task_id=query)))
    admin = InlineAdmin(lambda method, path, body: {"api_keys": {e["execution_id"]: "k"
                                                                 for e in (body or {}).get("executions", [])}})
    reports = []
    b = RealBackend(CFG, parts, seed=0, token_budget=64, admin=admin)
    return b.bind(SimpleNamespace(report=lambda kind, **fields: reports.append(kind.__name__)))


def test_a_snapshot_restored_into_a_fresh_backend_is_the_same(tmp_path):
    source = backend(tmp_path)

    async def drive():
        source.on_dispatch_groups(act.DispatchGroups((0, 1), 0))
        source.on_reroute(act.Reroute(3, 1, 2))
        source.cells.restore({"members": [0, 1], "rollout_ready": [2]})
        source.publisher.restore({"latest": [4, "/ckpt/v000004"]})

    asyncio.run(drive())
    state = json.loads(json.dumps(source.snapshot()))  # it goes beside a checkpoint
    target = backend(tmp_path)
    for name, part in (("proxy", target.proxy), ("executions", target.executions), ("cells", target.cells),
                       ("batches", target.batches), ("publisher", target.publisher)):
        part.restore(state[name])
    assert target.snapshot() == source.snapshot()
    assert target.latest == (4, "/ckpt/v000004") and target.rollout_ready == {2}
    assert state["proxy"]["routes"] == {"3": "e2"} and target.proxy.routes == {3: "e2"}


def test_a_snapshot_shares_nothing_mutable(tmp_path):
    b = backend(tmp_path)
    taken = b.snapshot()
    taken["cells"]["members"].append(2)
    taken["proxy"]["routes"][7] = "e0"
    assert b.cells.members == set() and b.proxy.routes == {}
