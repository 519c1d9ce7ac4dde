"""End to end: the shipped CPU demo, ``gyre run`` on a two-node Ray cluster (issues 8, 13, 16 and 29).

One run carries every run-level check of the demo (it once ran twice, on one host and on
Ray, at ~4 min each; the single-host path is run end to end by the resume, cell-failure,
engine-death and repair-task e2e tests). The unchanged policy core drives real SGLang CPU
engines, the proxy, scripted harness processes and the training plane.

A local Ray cluster of two nodes runs on this machine, inside the suite's loopback-only
network namespace (``tools/isolated.sh``; Ray advertises the machine's own address
otherwise): the head (2 logical CPUs, ``gyre_cell: 1``) and a second node process with its
own resources (4 CPUs, ``gyre_cell: 2``). ``gyre run`` runs configs/cpu_demo.toml (preset
gyre-1: 3 fine elastic cells, each = 1 SGLang CPU engine + 1 training cell, streaming on;
C_e = 16, N = 4, B = 2, phi = 1.0, mu = 2, lr = 1e-2; 30 steps = 15 bursts) with a
``[cluster]`` table (``interface = "lo"``, ``cell_resource = "gyre_cell"``) and ``--cluster
ADDRESS``, as a subprocess on the head, with only the work directories moved under tmp_path.
Each cell's placement group takes one ``gyre_cell``, so the three cells cannot all fit on one
node: they land on both, whichever way Ray packs them. ~5-6 min on a quiet machine (~65-100 s
start-up, ~145 s of steps, ~55 s of shutdown and the simulator's calibration). The kill and
resume below add the resumed start-up (32 s here, against 68 s fresh: the engines are
adopted, not started) and the steps redone since the checkpoint (one here); the whole test
took 283 s and 221 s in two runs on the shared 2-core machine (load 1.5-10).

The run is killed once (issue 29): as soon as the journal shows the first burst's publication
done and a step open with harnesses running, ``gyre run --cluster``'s process group is
SIGKILLed. Before resuming, the processes of the run left are exactly the head's supervisor,
the node supervisors (their actors and daemons) and the process groups their ledgers run
(harnesses, bridge, proxy, engines), each alive; the cells died with the driver. Then
``gyre run --resume RUN_DIR`` runs to the end, and every check below is made on the finished
run. Checked for the resume: it went on from the newest checkpoint complete at the kill; the
harnesses it kept went on (same pid, started once, records continued in the same file); no
harness was restarted without cause; every execution ends exactly once under its id (those
running at the kill among them); ``StepDone`` versions 0..29 once each in order; every group
trained exactly once; no recorded call lost or doubled; each engine was started once, by its
node's supervisor, and adopted by the resume (same pid; summary.json's ``placement`` lists them
running under their node supervisors, none started again; the kill waits for a moment when no
engine's memory release or resume is under way, since a cut one leaves what the engine holds
unknown and the resume must start it again: one full run here was killed in that window; should
one begin between the check and the kill, that engine's restart, with its reason, is checked
instead); the clean end stops the node supervisors with their engines. The kill's row (running at
the checkpoint, re-attached, kept, re-run, saved execution-seconds, processes found) is printed.
Measured here (2 cores shared, load ~1.5-7):
kill at version 2 (3 events past the checkpoint), 0 re-attached, 2 kept, 0 re-run, 7.2
execution-s saved, 24 processes found (another run: 3 kept, 10.1 s, 23 found; a third, 279 s
at load 5-9: 0 running at P, 2 kept, 4.3 s, 22 found). 0 re-attached
is the demo's shape, not chance: a burst's executions are all dispatched at its
``PublishDone`` and end together, batched on the engines: in four recorded demo runs (two
here, two on one host) 23 of 60 checkpoints had any execution running at P, and the last of
them ended 0.002-0.091 s after the ``StepDone`` (once 1.0 s), while a resume reads the
supervisor's ledger seconds after a kill (its CLI imports alone take ~2 s): the harnesses this
kill keeps are those dispatched after P. Re-attachment at P is held with real processes in
test_runtime_reattach_at_p.py. What a
resume changes is scoped to the attempt it describes: the progress lines and the completed
executions counted are the resumed attempt's (it redoes the steps after its checkpoint). The
calibration's comparison needed no scoping: the resumed lineage's step reports and trace
are continuous (per step 7.9%, total -0.6%, same cells 70% in the run above). Checked:
- placement: the driver (controller, proxy, harnesses) is on the head; the cells sit on
  both nodes; each engine on its own cell's node (as placed: an engine a resume adopts stays on the
  node whose supervisor runs it, which was the same here); every address is the interface's
  (127.0.0.1 here: only ``lo`` exists), never 0.0.0.0; the process answering each cell's
  commands is the one its node's agent started, and each engine is the process its node's
  supervisor started; none of those processes, nor the node supervisors, outlives the run;
- the CLI exits 0, prints its JSON summary on stdout and one progress line per step on stderr;
- role transitions happen while harness executions are in flight, and no harness sees an
  error (every execution of a consumed group completed; only work still running after the
  last step is cancelled at shutdown); each harness ran in its own loopback-only network
  namespace where one can be made;
- policy versions advance and every burst's weights are published (engines load them);
- fed groups are admitted, packed and trained, one at a time as the stream packing buffer
  asks for them (GroupWanted in the event log);
- the elastic path: a satellite cell enters training during a step in flight, and takes a
  seat in the plane, in at least 3 of the 15 bursts (why it can join at all, and why not in
  every burst, is in configs/cpu_demo.toml's header; measured on one host: 7-8 of 10);
- the simulator predicts the run (``gyre calibrate``, run by ``gyre run`` at its end): on the
  run's own trace (as the resumed lineage lived it: ``analysis.lineage_trace``) under the cost
  constants measured from it, the predicted total is within 10% of the measured one, the
  per-step wall times within 40% (mean absolute step error over the mean step), satellites
  train in at least 3 simulated steps, and in at least 60% of the steps the training cells
  are those of the simulated step or of a step next to it (``same_cells_near_share``; in
  seven recorded runs, four of them of this test, 0.77-1.0; a simulation whose satellites
  never joined would score the share of steps without one, 0.6-0.87, and fail the first).
  Measured here on two Ray nodes: per step 12.8%, total -0.7%, same cells 90%. The trace is
  replayed as the lineage lived it: a kill that left 14 harnesses running (CI) had them
  finish 0.03 s after the resume dispatched them again, where their true durations (~9.4 s,
  part of it while no driver ran) had the simulator wait 9 s in the step after the resume:
  per step 44% (over the bound), 33% on the lineage's trace; total +6.5%, -4.3%. What is
  left of the step error is
  decision flips: at each burst's end the core stays in training only if a group is already ready
  (docs/scheduler.md#end-of-a-burst), which here turns on sub-second timing, and one flip moves two steps by up to a
  core round trip (~4.4 s), ~11 points of this measure; 40% leaves room for two or three on
  a slower machine. Three causes of larger errors were found and fixed: the backend's start
  latency (0.1-5 s per execution) was outside the trace's durations and one transition cost
  stood for the core and the satellites (earlier 26-37%, ``runtime.trace`` and
  ``analysis.calibrate``); and a burst's harness spawns, taken in one go, held the job's
  event loop ~2 s while the burst's first step waited for its groups, a delay the simulator
  does not have (54-56% on Ray and 39% in CI before ``harness.runner`` started harnesses one
  at a time between the loop's other work).
  The same cells trained in the same steps in 45% to 90% of the steps over ten runs here
  (median ~75%; one run of the ten below half): a cell counts as training in a step when
  its training role overlaps the step at all, and the satellite's return to rollout races
  the step after a burst's first by a few tenths of a second (publication: 0.05-0.27 s,
  the simulator takes the mean). One flip of that race shifts the satellite's alternation
  between training and rollout by a step for the rest of the run, in phase or out of phase
  with the simulator's, with little effect on the step times: the test holds the cells within a
  step, not in the same step (two runs found them the same in 20% and 47% of the steps,
  and within a step in 93% and 100%).
- measured staleness equals phi + (mu - 1)/2 within 0.25 (all steps, warm-up included);
- the recorded event log replays through the simulator's driver to the identical action
  sequence (differential test); the run's trace describes itself (the simulator replays it
  with no ``--set``);
- the toy reward (share of the target character in the answer) rises: its least-squares
  trend over the 30 steps (``analysis.real_run.reward_trend``, also in the summary and in
  ``run.png``'s title) is positive and at least 4 standard errors from zero (t >= 4; with
  28 degrees of freedom noise alone passes with probability < 0.0003), and the last five
  steps' mean exceeds the first five's. A trend test, not a ratio: how much the reward rises
  depends on the staleness (phi) and on timing. 30 steps, not 20: with 8 executions a step
  the curve is noisy and turns up after a varying number of steps, and CI once saw a flat
  20-step run (t = 0.2). The offline replica of this learning loop
  (``toy.learning_replica``, seeds 0-71 from this run's version-0 model) rose in 72 of 72
  seeds in 30 steps (lowest t 6.0, median 12.9) and in 67 of 72 in 20 (median 6.9); the
  real 20-step runs here measured t = 5.8 to 7.9, a 30-step one t = 11.1. The run's picture
  (``run.png``: reward and staleness per step) is written.

A second test kills a driver outright: a driver process that placed three cells on the
same cluster and had each cell's rank and engine started (the engine's command line with
a stand-in interpreter that sleeps, in the engine's process group) is SIGKILLed; every one
of those processes, and every member of the engines' process groups, must be gone within
60 s. The ranks die by their parent-death signal; each engine's reaper sits behind a
``cluster.holder``, which dies by its own parent-death SIGKILL (Ray does not always kill a
dead agent's children: CI once found an engine's whole group alive 60 s later), and the
reaper, getting its parent-death SIGTERM, ends the engine's whole group.
Skipped, with the reason, without Ray or the SGLang virtualenv.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gyre import events as ev
from gyre.analysis.real_run import reward_trend
from gyre.formats.eventlog import replay_run
from gyre.formats.journal import replay_journal
from gyre.formats.trace import load_trace
from gyre.real.engines.manager import sglang_python
from gyre.real.harness.sandbox import netns_problem
from gyre.real.supervisor.ledger import read_ledger

try:
    import kill_points as kp
    import resume_watch as rw
    from processes import alive, all_gone, group_members, wait_until
    from ray_nodes import loopback_only, two_ray_nodes
except ImportError:
    from ..processes import alive, all_gone, group_members, wait_until
    from ..ray_nodes import loopback_only, two_ray_nodes
    from . import kill_points as kp
    from . import resume_watch as rw

ROOT = Path(__file__).resolve().parents[3]
STEPS = 30
ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[cluster]')")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(960),
              pytest.mark.skipif(not sglang_python().exists(),
                                 reason=f"SGLang CPU venv not found at {sglang_python()} (tools/setup_sglang_cpu.sh)"),
              # Ray listens on every interface and advertises the machine's address: only inside a
              # loopback-only network namespace does the test stay on 127.0.0.1
              loopback_only]


@pytest.fixture(scope="module")
def two_node_cluster():
    """A head and a second node process on this machine, stopped through its handle (never ``ray stop``)."""
    with two_ray_nodes({"num_cpus": 2, "resources": {"gyre_cell": 1}}, {"num_cpus": 4, "resources": {"gyre_cell": 2}}) \
            as cluster:
        yield cluster


def test_cpu_demo_placed_across_two_ray_nodes(tmp_path, two_node_cluster):
    job = tmp_path / "job.toml"
    job.write_text((ROOT / "configs" / "cpu_demo.toml").read_text()
                   + '\n[cluster]\ninterface = "lo"\ncell_resource = "gyre_cell"\n')
    work = tmp_path / "run"
    argv = ["--config", str(job), "--cluster", two_node_cluster.address, "--set", f'workdir="{work}"',
            "--set", f'model_dir="{tmp_path / "tok"}"', "--set", f"steps={STEPS}", "--set", "timeout_s=600.0"]
    kill = kill_and_resume(tmp_path, work, argv)
    err = (tmp_path / "run1.stderr").read_text()
    progress = [line for line in err.splitlines() if line.startswith("[gyre run] step ")]
    printed = json.loads((tmp_path / "run1.stdout").read_text())
    s = json.loads((work / "summary.json").read_text())
    resumed_at = kill.resume["version"]
    print("placement:", json.dumps(s["placement"], indent=1))
    print("reward curve:", [round(r, 4) for r in s["reward_curve"]], "timings:", s["timings"])
    print("step wall s:", [round(t, 3) for t in s["step_wall_s"]])
    print("participants:", s["participants"], "staleness per group:", s["staleness_per_group"])
    print("prediction:", {k: v for k, v in s.get("prediction", {}).items() if k != "steps"})

    # where everything ran
    p = s["placement"]
    cells, engines = p["cells"], p["engines"]
    nodes = {node.node_id for node in two_node_cluster.list_all_nodes()}
    assert p["driver"] == "head" and p["head"]["node_id"] == two_node_cluster.head_node.node_id
    assert {c["node_id"] for c in cells.values()} == nodes, (cells, nodes)  # both nodes hold cells
    assert {e: v["node_id"] for e, v in engines.items()} == {f"e{c}": v["node_id"] for c, v in cells.items()}
    addresses = [p["head"]["address"]] + [v["address"] for v in [*cells.values(), *engines.values()]]
    assert set(addresses) == {"127.0.0.1"}, addresses  # the address of interface lo; never 0.0.0.0
    roster = json.loads((work / "engines.json").read_text())
    for c, info in enumerate(s["cells"]):
        started = cells[str(c)]["processes"]
        assert info["pid"] == started[f"gyre-cell{c}"], (info, started)  # the agent's process answers the cell
        # each engine is its node's supervisor's: adopted by the resume (same pid, started once), unless the
        # kill cut one of its memory changes (the race the kill moment avoids): then it is stopped, started again
        adoption = s["supervisor"]["engines"][f"e{c}"]  # the summary says, per engine, adopted or why not
        if f"e{c}" not in kill.unsettled:
            assert roster[f"e{c}"]["pid"] == kill.engines[f"engine-e{c}"] == engine_entries(work)[f"engine-e{c}"][1]
            assert adoption.startswith(f"adopted (pid {kill.engines[f'engine-e{c}']}"), adoption
        else:
            stopped = f"pid {kill.engines[f'engine-e{c}']} stopped: its memory state is unknown"
            assert f"engine e{c}: {stopped}" in err and adoption.startswith(stopped), adoption
        assert roster[f"e{c}"]["url"].startswith("http://127.0.0.1:")
    assert {key: starts for key, (starts, _) in engine_entries(work).items()} == \
        {f"engine-e{c}": 2 if f"e{c}" in kill.unsettled else 1 for c in cells}, kill.unsettled
    running = {k: pid for n in p["supervisors"].values() for k, pid in n["running"].items()}
    assert {k: pid for k, pid in running.items() if k[7:] not in kill.unsettled} \
        == {k: pid for k, pid in kill.engines.items() if k[7:] not in kill.unsettled}
    assert {k for n in p["supervisors"].values() for k in n["restarted"]} == {f"engine-{e}" for e in kill.unsettled}
    pids = [pid for c in cells.values() for pid in c["processes"].values()] + list(kill.engines.values())
    assert all_gone(pids + kill.daemons, within_s=30), [pid for pid in pids + kill.daemons if alive(pid)]

    # the run (the resumed attempt prints the steps from its checkpoint on)
    assert printed["reward_curve"] == s["reward_curve"] and len(progress) == STEPS - resumed_at, err[-2000:]
    assert s["steps"] == STEPS and s["published"] == STEPS and s["bursts"] >= 2 and s["replay_identical"]
    assert s["backend_errors"] == [] and s["excluded_executions"] == []
    # no harness saw an error; work still running when the last step ends (phi > 0) is cancelled at shutdown
    assert set(s["outcomes"]) <= {"completed", "cancelled"}, s["outcomes"]
    # every consumed group's N executions (those of the steps this attempt trained, at least)
    assert s["outcomes"]["completed"] >= (STEPS - resumed_at) * 2 * 4, s["outcomes"]
    check_the_resume(work, kill, s)
    assert s["harnesses_isolated"] == (netns_problem() is None)  # each harness in its own loopback-only netns
    # (this shape leaves room on the engines expected to stay in rollout, so placement
    # (docs/scheduler.md#role-transitions)
    # rarely puts work on a cell about to train: reroutes are checked in test_runtime_controller)
    assert any(n > 0 for n in s["executions_in_flight_at_transitions"])
    assert {t["role"] for t in s["transitions"]} == {"training", "rollout"}
    assert len(s["losses"]) == STEPS and len(s["publishes"]) == STEPS // 2
    kinds = [line.split(",")[1] for line in (work / "log" / "events.csv").read_text().splitlines()[1:]]
    # streaming: one group asked for at a time; every fed group answered one ask (one may be open at the end)
    assert STEPS * 2 <= kinds.count("group_wanted") <= STEPS * 2 + 1, kinds.count("group_wanted")
    assert abs(s["staleness_mean"] - s["staleness_predicted"]) <= 0.25, (s["staleness_mean"],
                                                                          s["staleness_predicted"])
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
              for b in range(0, STEPS, 2)]
    seated = [any(len(part) > 1 for part in s["participants"][b:b + 2]) for b in range(0, STEPS, 2)]
    print("bursts where a satellite joined a step in flight:", joined, "took a seat:", seated)
    assert sum(joined) >= 3 and sum(seated) >= 3, (joined, s["participants"])

    # the simulator, calibrated on this run, predicts it
    pred = s["prediction"]
    assert "error" not in pred, pred
    print((work / "prediction.csv").read_text(),
          {k: pred[k] for k in ("total_error", "step_error", "same_cells_share", "same_cells_near_share")})
    assert abs(pred["total_error"]) <= 0.10 and pred["step_error"] <= 0.40, pred
    # the simulated satellites join too, and each step's cells are those of the simulated step or one next to it
    # (the module docstring says why not of the same step)
    assert sum("+" in row["sim_cells"] for row in pred["steps"]) >= 3, pred["steps"]
    assert pred["same_cells_near_share"] >= 0.6, pred
    assert (work / "costs.toml").exists() and (work / "sim_vs_real.png").stat().st_size

    # reward rises
    curve = s["reward_curve"]
    assert len(curve) == STEPS and all(0.0 <= r <= 1.0 for r in curve), curve
    assert [Path(f).name for f in s["figures"]] == ["run.png", "run.svg"] and Path(s["figures"][0]).stat().st_size
    first, last = statistics.fmean(curve[:5]), statistics.fmean(curve[-5:])
    slope, t = reward_trend(curve)
    assert printed["reward_trend"] == [slope, t] and s["reward_trend"] == [slope, t]
    print(f"reward trend {slope:+.4f}/step, t = {t:.1f}; first five {first:.3f}, last five {last:.3f}")
    assert t >= 4.0 and last > first, f"reward did not rise: trend {slope:+.4f}/step (t = {t:.1f}), " \
                                      f"first five {first:.3f}, last five {last:.3f}"


@dataclass
class Kill:
    """What the kill of the first attempt saw, and the resume that followed (``attempts/1/resume.json``)."""

    running: dict[int, int]             # execution -> its harness pid under the head's supervisor
    engines: dict[str, int]             # engine key -> its pid under its node's supervisor
    daemons: list[int]                  # the node supervisors' daemons
    snapshot: dict[str, list[str]]      # the record store at the kill
    checkpoint: int                     # the newest complete checkpoint: the resume goes on from it
    row: dict = field(default_factory=dict)
    resume: dict = field(default_factory=dict)
    unsettled: dict[str, str] = field(default_factory=dict)  # engine -> its memory state, when a change was cut


def engine_entries(work: Path) -> dict[str, tuple[int, int]]:
    """Each engine key in the node supervisors' ledgers: (starts, pid) of its last process."""
    found = {}
    for ledger in sorted((work / "supervisor" / "nodes").glob("*/ledger.jsonl")):
        found.update({k: (e.starts, e.pid) for k, e in read_ledger(ledger).items() if k.startswith("engine-")})
    return found


def node_daemons(work: Path) -> list[int]:
    return [int(json.loads(p.read_text())["pid"]) for p in (work / "supervisor" / "nodes").glob("*/supervisor.json")]


def kill_and_resume(tmp: Path, work: Path, argv: list[str]) -> Kill:
    """Start ``gyre run --cluster``; once a publication is done and a step is open with harnesses running,
    SIGKILL its process group; list what is left; ``gyre run --resume`` to the end (exit 0)."""
    with rw.stopped_if_failed(work):
        proc = rw.start(argv, tmp, "run0")
        try:
            rw.wait_for(proc, work, lambda core: core.published >= 2 and core.batch_open
                        and rw.running_harnesses(work) and not rw.unsettled_engines(work),
                        "a publication, then a step open with harnesses running and no engine's memory change "
                        "under way", timeout=600)
            kill = Kill(rw.running_harnesses(work), {k: pid for k, (_, pid) in engine_entries(work).items()},
                        node_daemons(work), {}, rw.newest_checkpoint(work))
        finally:
            kill_snapshot = rw.kill_job(proc, work)
        kill.snapshot = kill_snapshot
        kill.unsettled = rw.unsettled_engines(work)  # a change begun between the check and the kill: seen here
        found = only_the_supervisors_remain(tmp, work, kill)
        kill.row = {"kill": 1, "what": "gyre run --cluster", "moment": "mid-step", "processes": len(found)}
        resumed = rw.start(["--resume", str(work)], tmp, "run1")
        try:
            code = resumed.wait(timeout=700)
        finally:
            if resumed.poll() is None:
                os.killpg(resumed.pid, signal.SIGKILL)
        assert code == 0, (tmp / "run1.stderr").read_text()[-4000:]
        kill.resume = rw.resume_record(work, 1)
        kill.row.update(kp.resume_columns(kill.resume, kill.running))
        print(kp.kill_table([kill.row]))
        return kill


def only_the_supervisors_remain(tmp: Path, work: Path, kill: Kill, within: float = 60.0) -> dict[int, str]:
    """After the kill: the run's processes are the head's supervisor, the node supervisors (their actors and
    daemons) and the process groups their ledgers run (each alive: harnesses, bridge, proxy, engines)."""
    ledgers = [work / "supervisor" / "ledger.jsonl", *(work / "supervisor" / "nodes").glob("*/ledger.jsonl")]
    owned = {e.pid: k for ledger in ledgers for k, e in read_ledger(ledger).items() if e.state == "running"}
    keep = {rw.supervisor_pid(work), *kill.daemons}

    def strays() -> list[str]:
        found = rw.run_processes(tmp, set(owned) | keep)
        return [f"{pid}: {line}" for pid, line in found.items() if pid not in keep and alive(pid)
                and _group(pid) not in owned and not line.startswith("ray::NodeSupervisorHost")]

    assert wait_until(lambda: strays() == [], within, poll_s=0.5), f"processes no supervisor owns: {strays()}"
    assert all(alive(pid) for pid in [*keep, *owned]), {k: pid for pid, k in owned.items() if not alive(pid)}
    assert set(kill.engines.values()) <= set(owned), (kill.engines, owned)  # the engines went on
    found = rw.run_processes(tmp, set(owned) | keep)
    print(f"after the kill: {len(found)} processes, {len(owned)} supervised groups + {len(keep)} supervisors")
    return found


def _group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def check_the_resume(work: Path, kill: Kill, s: dict) -> None:
    """The resume went on from the newest checkpoint at the kill; the harnesses it re-attached went on (same
    pid, started once, records continued); every execution ended once under its id; versions are continuous;
    no group trained twice; no recorded call lost or doubled."""
    context = kp.kill_table([kill.row])
    assert kill.resume["version"] == kill.checkpoint and kill.resume["supervisor"] is not None, context
    assert set(kill.resume["reattached"]) <= set(kill.running), context
    ledger = read_ledger(work / "supervisor" / "ledger.jsonl")
    went_on = {int(x) for x in kill.resume["work_kept_s"]} & set(kill.running)
    assert went_on and all((ledger[f"x{x}"].pid, ledger[f"x{x}"].starts) == (kill.running[x], 1)
                           for x in went_on), context
    assert rw.restarted_without_cause(work) == [], context
    assert [r["saved_execution_s"] for r in s["resumes"]] == [kill.resume["saved_execution_s"]], context
    events = replay_journal(work / "log")[1].events
    assert [e.version for e in events if isinstance(e, ev.StepDone)] == list(range(STEPS)), context
    ended = Counter(e.execution for e in events if isinstance(e, ev.ExecutionFinished))
    assert set(ended.values()) == {1} and set(kill.running) <= set(ended), context
    fed = Counter(g for a in replay_run(work / "log") if a["kind"] == "feed_groups" for g in a["groups"])
    assert set(fed.values()) == {1} and len(fed) == STEPS * 2, context
    for name, calls in kill.snapshot.items():
        homes = [work / "records" / name, *sorted((work / "attempts").glob(f"*/records/{name}"))]
        assert any(h.is_file() and rw.calls_of(h)[:len(calls)] == calls for h in homes), (name, context)
    for path in [*(work / "records").glob("*.tito"), *(work / "attempts").glob("*/records/*.tito")]:
        assert len(rw.calls_of(path)) == len(set(rw.calls_of(path))), (path, context)


DRIVER = """
import json, sys, time
from pathlib import Path
from gyre.real.cluster.config import ClusterConfig
from gyre.real.cluster.placement import Placement
from gyre.real.engines.manager import EngineSpec
from gyre.real.runtime.ports import free_port
from gyre.real.train.context import CellConfig

address, tmp = sys.argv[1], Path(sys.argv[2])
placement = Placement(ClusterConfig(address=address, interface="lo", cell_resource="gyre_cell"))
placement.open(cells=3, tp=1, engines={0: "e0", 1: "e1", 2: "e2"})
cfg = placement.cell_config(CellConfig(cells=3, store_port=free_port(), queue_root=str(tmp / "q"),
                                       workdir=str(tmp), timeout_s=600.0))  # no store: each rank waits for it
procs = [placement.start_rank(cfg, c, 0, f"gyre-cell{c}") for c in range(3)]
for c in range(3):
    host, port = placement.engine_endpoint(f"e{c}")
    spec = EngineSpec(engine_id=f"e{c}", model_path="/none", port=port, host=host)
    procs.append(placement.start_engine(spec, tmp / "fake-python", tmp / f"e{c}.log"))
print(json.dumps([p.pid for p in procs]), flush=True)
time.sleep(600)
"""


def test_a_killed_driver_leaves_no_process_on_any_node(tmp_path, two_node_cluster):
    fake = tmp_path / "fake-python"  # stands in for SGLang's interpreter: a group of two processes that sleep
    fake.write_text("#!/bin/sh\nsleep 600 &\nwait\n")
    fake.chmod(0o755)
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, two_node_cluster.address, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        pids = json.loads(driver.stdout.readline() or "null")
        assert pids and len(pids) == 6, "the driver did not start its processes"
        engines = pids[3:]
        # each engine's group: holder, reaper, stand-in, its sleep
        wait_until(lambda: min(len(group_members(pid)) for pid in engines) >= 4, 30, poll_s=0.2)
        members = [member for pid in engines for member in group_members(pid)]
        assert len(members) == 12 and all(alive(pid) for pid in pids), (pids, members)
        # ranks and engines at the test's own priority: the agents are not left at the nice 15 of Ray's workers
        assert {pid: os.getpriority(os.PRIO_PROCESS, pid) for pid in members + pids[:3]} == \
            {pid: os.getpriority(os.PRIO_PROCESS, 0) for pid in members + pids[:3]}
    finally:
        driver.kill()  # SIGKILL: no finally, no close() in the driver
        driver.wait(10)
    everything = pids + members
    assert all_gone(everything, within_s=60), [pid for pid in everything if alive(pid)]
