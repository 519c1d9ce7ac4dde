"""End to end: an SGLang engine, then the proxy, die during ``gyre run`` and the run survives both (issue 16 item 3).

``gyre run`` on configs/cpu_demo.toml (only ``--set`` overrides: work
folders, a shorter run, a tool-work pause) runs as a subprocess of the real CLI. After the first
publication, the test reads ``metrics.jsonl`` for an engine in the rollout role with
executions placed on it and ``engines.json`` for its process group, and kills
the whole group with SIGKILL. In this shape the killed engine is often the
only one in the rollout role (the other cells train), so its calls cannot move:
the proxy holds them until the engine is back (``runtime.job.ENGINE_HOLD_S``;
the scripted harness's own retries, ``harness_options.retries``, are a second
line); the step waiting on them waits for the restart. Checked:
- the run finishes every step and exits 0, and the replay differential check holds;
- summary.json lists exactly one restart, of that engine, killed by SIGKILL,
  with a positive time to come back and published weights loaded (not the
  initial model), and no backend error;
- no execution failed (outcomes only completed or cancelled: calls were held, or retried);
- the staleness identity still holds (measured mean within 0.25 of phi + (mu - 1)/2);
- the restarted engine served model calls after its restart (the proxy's
  records name it as the engine of calls started after it came back);
- once the engine is back, the proxy process is killed with SIGKILL as well: the
  summary lists one proxy restart, every record file written before the kill
  still begins with exactly the bytes it had, and calls were served after it
  (harnesses retried the calls it cut; ``runtime.proxy_process``).
Skipped, with the reason, when the SGLang virtualenv is absent.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from signal import SIGKILL

import pytest

from gyre.real.engines.manager import sglang_python

try:
    import resume_watch as rw
except ImportError:
    from . import resume_watch as rw

ROOT = Path(__file__).resolve().parents[3]
NO_VENV = f"SGLang CPU venv not found at {sglang_python()} (run tools/setup_sglang_cpu.sh)"
# The run must outlast the restart, which it need not wait for: the core, which knows nothing of the death,
# may put another cell in the rollout role and go on without the killed engine (seen on CI: the run's last 9
# steps took 45 s and the restart was not done; restarts took 63-80 s then). A 4 s "tool work" pause after
# each call lightens the engines' load (the restart went faster: 53-54 s at load 1.5-7.6) and stretches each
# burst: the run went on 186-216 s after the kill here. Also: the warm-up burst's fresher groups weigh less in
# the staleness mean (8 steps: 1.25 of 1.5). 18 steps, not 14: CI once had the restart take 89 s while the other
# cells went on without the killed one (no step waited for it), and the run ended 3 steps after the engine came
# back, in the training role: its cell reached the rollout role only in the last step, with nothing left to serve.
STEPS = 18
TOOL_WORK_S = 4.0
# While the killed engine was the only one in the rollout role its calls have nowhere to go: the proxy holds
# them until the engine is back; should a hold run out, the scripted harness retries the overload error (as
# agent CLIs do), 400 times, up to ~400 s, longer than an engine takes to start here.
RETRIES = 400
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900),
              pytest.mark.skipif(not sglang_python().exists(), reason=NO_VENV)]


def _exited(proc: subprocess.Popen, stderr: Path) -> str:
    """The run's exit code and, once it exited, the end of its stderr (what a failure needs to be read)."""
    code = proc.poll()
    return f"exit {code}" if code is None else f"exit {code}; stderr ends:\n{stderr.read_text()[-4000:]}"


def _busy_rollout_engine(work: Path, proc: subprocess.Popen, stderr: Path, timeout: float = 600.0) -> str:
    """After the first publication: the engine of a rollout cell with the most executions placed on it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        lines = (work / "metrics.jsonl").read_text().splitlines() if (work / "metrics.jsonl").exists() else []
        if lines and json.loads(lines[-1])["publications"] >= 1:  # so the restart has published weights to load
            record = json.loads(lines[-1])
            load = {f"e{c}": record["engine_load"].get(f"e{c}", 0) for c, role in record["roles"].items()
                    if role == "rollout"}
            if load and max(load.values()) > 0:
                return max(load, key=load.get)
        time.sleep(0.2)
    raise AssertionError(f"no step after a publication with executions on a rollout engine ({_exited(proc, stderr)})")


def _restarted(work: Path, victim: str, pid: int, proc: subprocess.Popen, stderr: Path,
               timeout: float = 600.0) -> None:
    """Wait until engines.json names a new process group for ``victim`` (its restart is done)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        roster = json.loads((work / "engines.json").read_text())
        if roster[victim]["pid"] != pid:
            return
        time.sleep(0.2)
    raise AssertionError(f"{victim} was not restarted ({_exited(proc, stderr)})")


def test_gyre_run_restarts_an_engine_killed_mid_run(tmp_path):
    from gyre.real.store.tito_log import ExecutionStore

    work = tmp_path / "run"
    argv = [sys.executable, "-m", "gyre.cli", "run", "--config", str(ROOT / "configs" / "cpu_demo.toml"),
            "--set", f'workdir="{work}"', "--set", f'model_dir="{tmp_path / "tok"}"',
            "--set", f"steps={STEPS}", "--set", "timeout_s=600.0",
            "--set", f"harness_options={{retries={RETRIES}, sleep_s={TOOL_WORK_S}}}"]
    t0 = time.monotonic()
    with open(tmp_path / "stderr.txt", "w") as stderr, rw.stopped_if_failed(work):
        proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=stderr, text=True)
        try:
            victim = _busy_rollout_engine(work, proc, tmp_path / "stderr.txt")
            pid = json.loads((work / "engines.json").read_text())[victim]["pid"]
            killed_at = time.time()
            os.killpg(pid, SIGKILL)
            _restarted(work, victim, pid, proc, tmp_path / "stderr.txt")
            records_at_kill = {path.name: path.read_bytes() for path in (work / "records").glob("*.tito")}
            proxy_pid = int((work / "proxy" / "proxy.pid").read_text())
            proxy_killed_at = time.time()
            os.killpg(proxy_pid, SIGKILL)  # then the proxy, with harnesses mid-call
            stdout, _ = proc.communicate(timeout=780)
            ended_at = time.time()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    wall = time.monotonic() - t0
    err = (tmp_path / "stderr.txt").read_text()
    assert proc.returncode == 0, err[-4000:]
    s = json.loads((work / "summary.json").read_text())
    print(f"killed {victim} (pid {pid}); the run went on {ended_at - killed_at:.0f} s after; wall {wall:.0f} s; "
          f"restarts {s['engine_restarts']}; "
          f"timings {s['timings']}")
    print("\n".join(line for line in err.splitlines() if line.startswith("[gyre run] engine")))

    assert json.loads(stdout)["steps"] == STEPS and s["steps"] == STEPS and s["published"] == STEPS
    assert s["replay_identical"] and s["backend_errors"] == [], s["backend_errors"]
    [restart] = s["engine_restarts"]
    assert (restart["engine"], restart["exit_code"]) == (victim, -signal.SIGKILL), restart
    assert restart["back_s"] > 0 and restart["at_unix"] >= killed_at
    assert int(restart["version"]) >= 2, restart  # a published version (mu = 2: the first is 2), not the initial model
    assert set(s["outcomes"]) <= {"completed", "cancelled"}, s["outcomes"]
    assert abs(s["staleness_mean"] - s["staleness_predicted"]) <= 0.25, (s["staleness_mean"], s["staleness_predicted"])

    store = ExecutionStore(work / "records")
    calls = [c for x in store.executions() for c in store.read(x)]
    moved = [c for c in calls if victim in c.role_hints["engines"].split(",")[:-1]]  # left the victim mid-call
    after = [c for c in calls if c.engine_id == victim and c.started_at > restart["back_unix"]]
    print(f"calls moved off {victim}: {len(moved)}; served by it after its restart: {len(after)} of {len(calls)}")
    assert after, f"no call served by {victim} after it came back at {restart['back_unix']:.1f}"
    # the proxy came back by itself on its address, and every record written before its kill is intact
    [proxy_restart] = s["proxy_restarts"]
    assert proxy_restart["exit_code"] == -SIGKILL and proxy_restart["back_s"] > 0, proxy_restart
    for name, before in records_at_kill.items():
        assert (work / "records" / name).read_bytes()[:len(before)] == before, name
    assert any(c.started_at > proxy_killed_at for c in calls), "no call was served after the proxy came back"
