"""``gyre run`` with tensor-parallel training cells (issue 15 item 2): the job's ``tp`` reaches the plane.

One real run on the CPU stack: one cell of ``tp = 2`` ranks (two Megatron-core
processes, TP group = the cell), one SGLang CPU engine, the proxy, the scripted
harness, N = B = 2 and two steps (one burst of ``gyre-1``). Checked: the run
completes both steps and publishes them (the initial engine model and every
publication are exports gathered over the cell's two shards), the event log
replays identically, the summary says ``cell_tp = 2`` and the cell's leader
itself reports ``tp = 2``, and rank 1 of the cell really ran (its own log says
it came up, with a shard the size of rank 0's); the job hid the proxy's record
store from its harnesses wherever they got a mount namespace. Slow: ``make
test`` only (about 4 min wall, ~57 s CPU in the test process, on a shared 2-core machine).
"""

from __future__ import annotations

import json
import re
import resource
import time

import pytest

from gyre.real.engines.manager import sglang_python
from gyre.real.harness.sandbox import mountns_problem
from gyre.real.runtime.job import load_job_config, run_job

try:
    from jobs import small_job, write_job
except ImportError:
    from ..jobs import small_job, write_job


UP = re.compile(r"cell 0 rank (\d) up: (\d+) parameters .* tp 2,")


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(not sglang_python().exists(), reason="SGLang CPU venv not built")
def test_a_job_trains_on_a_two_rank_cell_and_replays(model, tmp_path):
    job = load_job_config(write_job(tmp_path, small_job(tmp_path / "run", model_dir=model, tp=2, timeout_s=240.0)))
    assert job.cell_tp() == 2
    cpu0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    summary = run_job(job)
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"tp=2 run: wall {time.monotonic() - t0:.1f} s, children CPU "
          f"{cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime:.1f} s, timings {summary['timings']}")
    assert summary["backend_errors"] == [] and summary["steps"] == 2 and summary["published"] == 2
    assert summary["replay_identical"] and len(summary["step_reports"]) == 2
    assert summary["cell_tp"] == 2 and [c["tp"] for c in summary["cells"]] == [2]
    assert summary["harness_paths_hidden"] == (summary["harnesses_isolated"] and mountns_problem() is None)
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert written["cell_tp"] == 2 and written["config"]["tp"] == 2
    plane = tmp_path / "run" / "plane"
    ups = {int(m[1]): int(m[2]) for f in ("cell0.log", "cell0.rank1.log")
           for m in UP.finditer((plane / f).read_text())}
    assert sorted(ups) == [0, 1] and ups[0] == ups[1]  # two ranks came up, with equal shards
    engine_model = json.loads((tmp_path / "run" / "engine-model" / "config.json").read_text())
    assert engine_model["num_attention_heads"] == 4  # the gathered export is the whole model, not a shard
