"""No orphan outlives a killed job: the forkserver, its cells and the proxy die with ``gyre run``.

Each test starts a stand-in job as its own Python process and SIGKILLs it:
- a child of a real multiprocessing forkserver, armed like a training cell
  (``cell_main``: parent-death signal, then ``release_forkserver``), ends with
  the forkserver shortly after the job; the same child that keeps its copy of
  the forkserver's alive pipe keeps the forkserver and itself alive (the
  control: what left the forkserver and two cells behind a killed run);
- the job's proxy process (``ProxyProcess``) ends with the job, also with a call held in it waiting
  for an engine (its stop is bounded: ``proxy.cli.STOP_GRACE_S``);
- a stand-in job with real training cells (the core mid-step, waiting for micro-steps in the run
  folder) and the proxy leaves none of them, nor the forkserver or multiprocessing's resource
  tracker, alive 20 s after its kill -9.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

try:
    from processes import alive, all_gone, wait_until
    from proxy_fixtures import free_port
except ImportError:
    from ..processes import alive, all_gone, wait_until
    from .proxy_fixtures import free_port

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")

CELL_MODULE = """
import os, sys, time
from gyre.real.runtime.lifetime import die_with_parent, release_forkserver

def cell(path, release):
    die_with_parent()
    if release:
        release_forkserver()
    open(path, "w").write(f"{os.getpid()} {os.getppid()}")
    time.sleep(300)
"""

FORKSERVER_JOB = """
import multiprocessing as mp, sys, time
sys.path.insert(0, {folder!r})
import orphan_cell
if __name__ == "__main__":
    ctx = mp.get_context("forkserver")
    for n in range(2):
        ctx.Process(target=orphan_cell.cell, args=({folder!r} + f"/cell{{n}}", {release}), daemon=True).start()
    print("started", flush=True)
    time.sleep(300)
"""


def _job(script: str, cwd) -> subprocess.Popen:
    path = cwd / "job.py"
    path.write_text(textwrap.dedent(script))
    job = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, text=True, cwd=cwd)
    return job


def _pids(folder, names, timeout=60.0) -> list[int]:
    assert wait_until(lambda: all((folder / n).is_file() and (folder / n).read_text() for n in names), timeout)
    return [int(p) for n in names for p in (folder / n).read_text().split()]


def _reap(job: subprocess.Popen, pids: list[int]) -> None:
    """What a test leaves behind, whatever it asserted: the job, and each of its pids still alive."""
    job.kill()
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("release", [True, False])
def test_forkserver_cells_die_with_a_killed_job_only_when_they_release_its_pipe(tmp_path, release):
    (tmp_path / "orphan_cell.py").write_text(CELL_MODULE)
    job = _job(FORKSERVER_JOB.format(folder=str(tmp_path), release=release), tmp_path)
    pids: list[int] = []
    try:
        assert job.stdout.readline().strip() == "started"
        pids = sorted(set(_pids(tmp_path, ["cell0", "cell1"])))  # two cells and their forkserver
        assert len(pids) == 3 and all(alive(pid) for pid in pids)
        job.kill()
        job.wait(10)
        assert all_gone(pids, within_s=10.0 if release else 3.0) is release  # the control: 3 s shows it stays
    finally:
        _reap(job, pids)


PROXY_JOB = """
import sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
from proxy_fixtures import proxy_config
from gyre.real.proxy.config import RetryPolicy
from gyre.real.runtime.proxy_process import ProxyProcess
folder = Path({folder!r})
config = proxy_config({model!r}, folder / "records", {{"e0": "http://127.0.0.1:9"}}, port={port},
                      retry=RetryPolicy(hold_s=300.0))  # as in gyre run: a call with no engine waits for one
proxy = ProxyProcess(config, folder / "proxy").start()
print("started", flush=True)
time.sleep(300)
"""


def _call_in_flight(url: str) -> None:
    """A harness's call, left waiting in the proxy for an engine (none answers)."""
    import json
    import threading
    import urllib.request

    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    request = urllib.request.Request(url + "/v1/messages", data=json.dumps(body).encode(), method="POST",
                                     headers={"x-api-key": "key-a", "content-type": "application/json"})

    def call() -> None:
        try:
            urllib.request.urlopen(request, timeout=120).read()
        except OSError:
            pass

    threading.Thread(target=call, daemon=True).start()


def test_the_proxy_dies_with_a_killed_job_even_with_a_call_held_in_it(model, tmp_path):
    tests, port = os.path.dirname(os.path.dirname(os.path.abspath(__file__))), free_port()
    job = _job(PROXY_JOB.format(tests=tests, folder=str(tmp_path), model=str(model), port=port), tmp_path)
    pids: list[int] = []
    try:
        assert job.stdout.readline().strip() == "started"
        pids = _pids(tmp_path / "proxy", ["proxy.pid"])
        assert alive(pids[0])
        _call_in_flight(f"http://127.0.0.1:{port}")  # held waiting for an engine: kept the proxy alive before
        time.sleep(1.0)
        job.kill()
        job.wait(10)
        assert all_gone(pids, within_s=15.0), (tmp_path / "proxy" / "proxy.log").read_text()[-2000:]
    finally:
        _reap(job, pids)


PLANE_JOB = """
import json, os, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
from proxy_fixtures import proxy_config
from gyre.real.proxy.config import RetryPolicy
from gyre.real.runtime.proxy_process import ProxyProcess
from gyre.real.train.plane import PlaneConfig, TrainingPlane
from gyre.real.train.state import OptimConfig
if __name__ == "__main__":  # the forkserver imports this script
    folder = Path({folder!r})
    plane = TrainingPlane(PlaneConfig(cells=2, optim=OptimConfig(lr=1e-3), attempt=1, timeout_s=300.0),
                          folder / "plane").start()
    config = proxy_config({model!r}, folder / "records", {{"e0": "http://127.0.0.1:9"}}, port={port},
                          retry=RetryPolicy(hold_s=300.0))
    proxy = ProxyProcess(config, folder / "proxy").start()
    cells = [plane.call(c, "info")["pid"] for c in range(2)]
    plane.call(0, "enter_training")
    plane.send(0, "step", version=0, final=True)  # mid-burst: the core waits for micro-steps in the run folder
    forkserver = {{int(Path(f"/proc/{{pid}}/stat").read_text().rsplit(")", 1)[1].split()[1]) for pid in cells}}
    from multiprocessing import resource_tracker
    tracker = resource_tracker._resource_tracker._pid  # started with the forkserver, by the job
    print(json.dumps({{"cells": cells, "forkserver": sorted(forkserver), "proxy": proxy.pid, "tracker": tracker}}),
          flush=True)
    time.sleep(300)
"""


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_killed_job_leaves_no_forkserver_cell_or_proxy(model, tmp_path):
    """The stand-in job owns what ``gyre run`` starts directly: real cells through the forkserver, and the
    proxy with a call in flight (what outlived a kill -9 of ``gyre run``)."""
    import json

    tests, port = os.path.dirname(os.path.dirname(os.path.abspath(__file__))), free_port()
    job = _job(PLANE_JOB.format(tests=tests, folder=str(tmp_path), model=str(model), port=port), tmp_path)
    pids: list[int] = []
    try:
        lines = [job.stdout.readline()]
        while lines[-1] and not lines[-1].startswith("{"):  # whatever a library prints first
            lines.append(job.stdout.readline())
        assert lines[-1], f"the stand-in job ended before its cells and proxy were up: {lines}"
        started = json.loads(lines[-1])
        assert started["tracker"], "the job started no multiprocessing resource tracker"
        pids = started["cells"] + started["forkserver"] + [started["proxy"], started["tracker"]]
        assert len(started["forkserver"]) == 1 and os.getpid() not in pids and job.pid not in pids
        assert all(alive(pid) for pid in pids)
        _call_in_flight(f"http://127.0.0.1:{port}")
        time.sleep(1.0)
        job.kill()
        job.wait(10)
        assert all_gone(pids, within_s=20.0), [pid for pid in pids if alive(pid)]
    finally:
        _reap(job, pids)
