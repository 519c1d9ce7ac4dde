"""End to end: ``gyre run --config configs/cpu_demo.toml``, the unchanged policy core driving real
SGLang CPU engines, the proxy, scripted harness processes and the training plane (issue 8).

The shipped CPU demo (preset gyre-1: 3 fine elastic cells, each = 1 SGLang CPU engine + 1
training cell, streaming on; C_e = 16, N = 4, B = 2, phi = 1.0, mu = 2, lr = 1e-2) runs for
20 steps = 10 bursts as a subprocess of the real CLI, with only the work directories moved
under tmp_path. Checked:
- the CLI exits 0, prints its JSON summary on stdout and one progress line per step on stderr;
- role transitions happen while harness executions are in flight (and running
  executions are rerouted), and no harness sees an error (every execution of a consumed
  group completed; only work still running after the last step is cancelled at shutdown);
  each harness ran in its own loopback-only network namespace where one can be made;
- policy versions advance and every burst's weights are published (engine loads them);
- fed groups are admitted, packed and trained (a step report per version), one at a time
  as the stream packing buffer asks for them (GroupWanted in the event log);
- the elastic path runs: a satellite cell enters training during a step in flight, and takes
  a seat in the plane, in at least 3 of the 10 bursts (why it can join at all, and why not in
  every burst, is in configs/cpu_demo.toml's header);
- the simulator predicts the run (``gyre calibrate``, run by ``gyre run`` at its end): on the
  run's own trace under the cost constants measured from it, the predicted total is within
  10% of the measured one, the per-step wall times within 35% (mean absolute step error over
  the mean step), and the same cells train in the same steps in most steps. Two fresh runs
  here on the current code: per step 14% and 16%, total 0.0% and -0.3%, same cells 90% and
  75% (six older runs re-derived the same way: 9-26% per step, -1% to +1% total). What is
  left is decision flips: at each burst's end the core stays in training only if a group is
  already ready (SPEC 3.4), which here turns on sub-second timing, and one flip moves a step
  by a core round trip (~4.4 s, half a mean step); 35% leaves room for a few more flips on a
  slower machine. (The two causes of the earlier 26-37%: the backend's start latency, 0.1-5 s
  per execution, was outside the trace's durations, and one transition cost stood for the
  core and the satellites; ``runtime.trace`` and ``analysis.calibrate`` now measure both.)
- measured staleness equals phi + (mu - 1)/2 within 0.25 (all steps, warm-up included);
- the recorded event log replays through the simulator's driver to the identical
  action sequence (differential test), and the run's executions form a valid trace;
- the toy reward (share of the target character in the answer) rises: its least-squares
  trend over the 20 steps is positive and at least 4 standard errors from zero (t >= 4; with
  18 degrees of freedom noise alone passes with probability < 0.0005), and the last five
  steps' mean exceeds the first five's. A trend test, not a ratio: how much the reward rises
  in 20 steps depends on the staleness (phi) and on timing; three runs here measured
  t = 5.8 to 7.2 with last/first ratios 1.37x (phi = 1.0) to 1.94x (phi = 0.5). The run's
  picture (``run.png``: reward and staleness per step) is written.
Skipped, with the reason, when the SGLang virtualenv is absent.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from gyre.real.engines.manager import sglang_python
from gyre.real.harness.sandbox import netns_problem
from gyre.formats.trace import load_trace

ROOT = Path(__file__).resolve().parents[2]
NO_VENV = f"SGLang CPU venv not found at {sglang_python()} (run tools/setup_sglang_cpu.sh)"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(960),
              pytest.mark.skipif(not sglang_python().exists(), reason=NO_VENV)]


def test_gyre_run_cpu_demo_end_to_end(tmp_path):
    work = tmp_path / "run"
    argv = [sys.executable, "-m", "gyre.cli", "run", "--config", str(ROOT / "configs" / "cpu_demo.toml"),
            "--set", f'workdir="{work}"', "--set", f'model_dir="{tmp_path / "tok"}"', "--set", "timeout_s=600.0"]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    progress = [line for line in done.stderr.splitlines() if line.startswith("[gyre run] step ")]
    assert done.returncode == 0, done.stderr[-4000:]
    printed = json.loads(done.stdout)
    s = json.loads((work / "summary.json").read_text())
    print("reward curve:", [round(r, 4) for r in s["reward_curve"]])
    print("step wall s:", [round(t, 3) for t in s["step_wall_s"]], "timings:", s["timings"])
    print("participants:", s["participants"])
    print("prediction:", {k: v for k, v in s.get("prediction", {}).items() if k != "steps"})

    assert printed["reward_curve"] == s["reward_curve"] and len(progress) == 20, done.stderr[-2000:]
    assert s["backend_errors"] == [] and s["excluded_executions"] == []
    assert s["steps"] == 20 and s["published"] == 20 and s["bursts"] >= 2
    # no harness saw an error; work still running when the last step ends (phi > 0) is cancelled at shutdown
    assert set(s["outcomes"]) <= {"completed", "cancelled"}, s["outcomes"]
    assert s["outcomes"]["completed"] >= 20 * 2 * 4, s["outcomes"]  # every consumed group's N executions
    assert s["harnesses_isolated"] == (netns_problem() is None)  # each harness in its own loopback-only netns
    # (this shape leaves room on the engines expected to stay in rollout, so placement (SPEC 3.5)
    # rarely puts work on a cell about to train: reroutes are checked in test_runtime_controller)
    assert any(n > 0 for n in s["executions_in_flight_at_transitions"])
    assert {t["role"] for t in s["transitions"]} == {"training", "rollout"}
    assert len(s["losses"]) == 20 and len(s["publishes"]) == 10
    assert s["replay_identical"]
    kinds = [line.split(",")[1] for line in (work / "log" / "events.csv").read_text().splitlines()[1:]]
    # streaming: one group asked for at a time; every fed group answered one ask (one may be open at the end)
    assert 20 * 2 <= kinds.count("group_wanted") <= 20 * 2 + 1, kinds.count("group_wanted")
    assert abs(s["staleness_mean"] - s["staleness_predicted"]) <= 0.25
    trace = load_trace(s["trace"])
    assert len(trace.frame) >= 4 * 2 * 4
    # the trace describes itself: the simulator replays the recorded schedule with no --set
    from gyre.sim.runner import run_simulation

    replayed = run_simulation(trace=s["trace"], steps=4)
    assert (replayed.summary["preset"], replayed.cfg.N, replayed.cfg.K, replayed.cfg.tau) == ("gyre-1", 4, 3, 0.0)
    # the elastic path: in most bursts a satellite enters training while a step is in flight (the
    # definition of analysis.timeline.satellite_joins, read off the event log), and satellites
    # take a seat in the training plane's steps in several bursts
    from gyre.analysis.role_timeline import timeline
    from gyre.formats.eventlog import load_events, run_config

    tl = timeline(run_config(work / "log"), load_events(work / "log" / "events.csv"))
    entered = [span.start_s for cell, spans in tl.roles.items() if cell != 0 for span in spans
               if span.label == "training"]
    joined = [any(tl.steps[v].start_s <= t < tl.steps[v].end_s for v in (b, b + 1) for t in entered)
              for b in range(0, 20, 2)]
    seated = [any(len(p) > 1 for p in s["participants"][b:b + 2]) for b in range(0, 20, 2)]
    print("bursts where a satellite joined a step in flight:", joined, "took a seat:", seated)
    # measured with phi = 1.0: joined and seated in 8 of 10 bursts, twice (phi = 0.5: 1 to 5 of 10)
    assert sum(joined) >= 3 and sum(seated) >= 3, (joined, s["participants"])
    # the simulator, calibrated on this run, predicts it
    p = s["prediction"]
    assert "error" not in p, p
    print((work / "prediction.csv").read_text(), {k: p[k] for k in ("total_error", "step_error", "same_cells_share")})
    assert abs(p["total_error"]) <= 0.10 and p["step_error"] <= 0.35, p
    assert p["same_cells_share"] > 0.5, p
    assert (work / "costs.toml").exists() and (work / "sim_vs_real.png").stat().st_size
    curve = s["reward_curve"]
    assert len(curve) == 20 and all(0.0 <= r <= 1.0 for r in curve), curve
    assert [Path(f).name for f in s["figures"]] == ["run.png", "run.svg"] and Path(s["figures"][0]).stat().st_size
    first, last = statistics.fmean(curve[:5]), statistics.fmean(curve[-5:])
    slope, t = _trend(curve)
    print(f"reward trend {slope:+.4f}/step, t = {t:.1f}; first five {first:.3f}, last five {last:.3f}")
    assert t >= 4.0 and last > first, f"reward did not rise: trend {slope:+.4f}/step (t = {t:.1f}), " \
                                      f"first five {first:.3f}, last five {last:.3f}"


def _trend(values: list[float]) -> tuple[float, float]:
    """Least-squares slope of ``values`` against their index, and its t statistic (slope / its standard error)."""
    n = len(values)
    xs = range(n)
    x_mean, y_mean = (n - 1) / 2, statistics.fmean(values)
    sxx = sum((x - x_mean) ** 2 for x in xs)
    slope = sum((x - x_mean) * (y - y_mean) for x, y in zip(xs, values)) / sxx
    residual = sum((y - y_mean - slope * (x - x_mean)) ** 2 for x, y in zip(xs, values))
    stderr = (residual / (n - 2) / sxx) ** 0.5
    return slope, (slope / stderr if stderr > 0 else (float("inf") if slope > 0 else 0.0))
