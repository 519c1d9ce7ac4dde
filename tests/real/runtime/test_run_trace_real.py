"""``gyre timeline`` on a real run's log beside its simulation: one trace, two processes.

The real run is the real-time controller (``gyre.real.runtime.controller``,
the same policy core on the wall clock) driving the timed test double of
``test_runtime_controller`` (asyncio timers in place of harnesses, engines and
cells: fakes only at the outer edge); its log folder is what ``gyre run``
writes under ``RUN/log``. The simulated run is ``gyre sim --out``.
"""

from __future__ import annotations

import json

import pytest

from gyre.analysis.run_trace import read_trace, write_trace
from gyre.sim.runner import run_simulation

try:
    from test_runtime_controller import CFG, run
except ImportError:
    from .test_runtime_controller import CFG, run


@pytest.mark.timeout(60)
def test_a_real_runs_log_and_a_simulated_run_open_together(tmp_path):
    ctl = run(CFG, steps=4)
    ctl.write_log(tmp_path / "real" / "log")
    sim = run_simulation("gyre-1", "nl2repo-122b", steps=2).write(tmp_path / "sim")
    path = write_trace([tmp_path / "real", sim], tmp_path / "both.trace.json")
    trace = read_trace(path)
    slices = trace["slices"]
    assert set(slices["process"]) == {"real: real", "simulated: sim"}
    real = slices[slices["process"] == "real: real"]
    assert sorted(real[real["thread"] == "steps"]["name"]) == [f"step {v}" for v in range(4)]
    assert {f"cell {c}" for c in range(CFG.K)} <= set(real["thread"])
    real_reroutes = sum(row["kind"] == "reroute" for row in ctl.log.actions)
    instants = trace["instants"]
    assert (instants["process"] == "real: real").sum() == real_reroutes
    counters = trace["counters"]
    water = counters[(counters["process"] == "real: real") & (counters["series"] == "w")]
    assert water["value"].iloc[-1] == ctl.core.waterlevel
    assert json.loads(path.read_text())["otherData"]["gyre_runs"][0]["world"] == "real"
