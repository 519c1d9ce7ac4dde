"""Instructions per simulated event: the sweep's throughput in a measure that the machine's load does not move.

On a shared machine, CPU seconds move by ~10% from run to run with the other
jobs' load (caches, hyper-threads), more than most single speed-ups. This
counts the instructions a simulation executes under valgrind (cachegrind
without its cache model): four schedules of ``bench_sweep``'s sweep (phi in
{0, 2} x K in {4, 32}, mu 3, 12 steps, seed 0) run in one process, each followed
by the collection a sweep worker makes after a job (``gyre.sim.workers.collecting``;
a full one in trees without it), minus the same process running none of them
(imports, the trace and one warm-up run), divided by the events the four simulated. Repeated runs agreed within ~0.3% at
first, and later differed by up to 2.5% with Python's random hash seed (string hashes lay out dicts and sets
differently); both processes now run with ``PYTHONHASHSEED=0``, so a tree's count depends on its code alone (address
layout aside). Skipped where valgrind is not installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

SCHEDULES = [{"phi": phi, "mu": 3, "K": k} for k in (4, 32) for phi in (0.0, 2.0)]
PROGRAM = """
import gc, json, sys
from gyre.sim.sweep import _one
try:  # a sweep worker's collection after each job, where the tree has one (a48ed0f collects in full)
    from gyre.sim.workers import collecting
    one = collecting(_one)
except ImportError:
    def one(job):
        row = _one(job)
        gc.collect()
        return row
jobs = [("E0", "nl2repo-122b", 12, 0, p) for p in json.loads(sys.argv[1])]
gc.freeze(); gc.disable()
one(("E0", "nl2repo-122b", 12, 0, {"phi": 1.0, "mu": 3, "K": 8})); gc.collect()
events = 0
for job in jobs:
    events += one(job)["events"] or 0
print(json.dumps({"events": events}))
"""


def main() -> dict:
    if shutil.which("valgrind") is None:
        print("   valgrind is not installed: skipped")
        return {"skipped": "valgrind is not installed"}
    base, base_events = _instructions([])
    total, events = _instructions(SCHEDULES)
    assert base_events == 0 and events > 0
    figures = {"schedules": len(SCHEDULES), "events": events,
               "instructions_per_event": round((total - base) / events),
               "start_up_instructions": base}
    for key, value in figures.items():
        print(f"   {key:32s} {value}")
    return figures


def _instructions(schedules: list[dict]) -> tuple[int, int]:
    """(instructions, events) of PROGRAM simulating ``schedules`` after its warm-up."""
    out = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
                          sys.executable, "-c", PROGRAM, json.dumps(schedules)],
                         capture_output=True, text=True, check=True, env={**os.environ, "PYTHONHASHSEED": "0"})
    refs = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
    if refs is None:
        raise RuntimeError(f"valgrind gave no instruction count: {out.stderr[-500:]}")
    return int(refs.group(1).replace(",", "")), json.loads(out.stdout.strip().splitlines()[-1])["events"]
