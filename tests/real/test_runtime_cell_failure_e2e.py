"""End to end: the core training cell dies mid-step, and the run brings it back and finishes (issue 16 item 3).

The small job of ``test_runtime_resume_e2e`` (2 cells, N = B = 2, phi = 0.5, mu = 2,
6 steps) runs as a subprocess of the real CLI with ``GYRE_FAULT_PAUSE=step=15@3``,
so the core cell holds step 3 open for 15 s. Once the durable journal shows batch 3
open (checkpoint v2 complete), the test SIGKILLs the core cell's process (its pid
from ``cells.json``) and nothing else. Checked: the job stops with ``CellFailed``
naming the cell and its exit code, resumes *itself* (same ``gyre run``, no
operator) from checkpoint v2 with a new cell 0, and exits 0 with 6 steps trained
and published; the final event log replays identically; every group was fed to
training exactly once; ``StepDone`` 0..5 once each, in order; staleness within
0.25 of phi + (mu - 1)/2, as a normal run of this shape.
"""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path

import pytest

from gyre import events as ev
from gyre.formats.journal import read_journal
from gyre.real.engines.manager import sglang_python

try:
    from test_runtime_resume_e2e import JOB, complete, start, wait_for
except ImportError:
    from .test_runtime_resume_e2e import JOB, complete, start, wait_for

NO_VENV = f"SGLang CPU venv not found at {sglang_python()} (run tools/setup_sglang_cpu.sh)"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900),
              pytest.mark.skipif(not sglang_python().exists(), reason=NO_VENV)]
STEPS, B = 6, 2


def test_a_dead_training_cell_comes_back_and_the_run_finishes(tmp_path):
    work = tmp_path / "run"
    config = tmp_path / "job.toml"
    config.write_text(JOB.format(work=work, tok=tmp_path / "tok"))
    proc = start(["--config", str(config)], tmp_path, "run", pause="step=15@3")
    try:
        wait_for(proc, work, lambda core: complete(work, 2) and core.version == 3 and core.batch_open,
                 "batch 3 open")
        pid = int(json.loads((work / "cells.json").read_text())["0"]["pid"])
        os.kill(pid, signal.SIGKILL)  # the core cell alone, inside step 3
        proc.wait(600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    err = (tmp_path / "run.stderr").read_text()
    assert proc.returncode == 0, err[-4000:]
    assert "training cell 0 (exit code -9) died" in err and "resuming at version 2" in err, err[-4000:]
    s = json.loads((work / "summary.json").read_text())
    assert s["steps"] == STEPS and s["published"] == STEPS and s["replay_identical"], s
    assert int(json.loads((work / "cells.json").read_text())["0"]["pid"]) != pid  # a new cell 0 trained
    fed = Counter(g for groups in s["groups_fed"].values() for g in groups)
    assert len(fed) == STEPS * B and set(fed.values()) == {1}, fed
    done = [e.version for e in read_journal(work / "log" / "events.jsonl").events if isinstance(e, ev.StepDone)]
    assert done == list(range(STEPS)), done
    assert abs(s["staleness_mean"] - s["staleness_predicted"]) <= 0.25, (s["staleness_mean"], s["staleness_predicted"])
