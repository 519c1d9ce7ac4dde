"""Re-attachment AT the resume point, with real processes (issue 29 item 2).

The end-to-end kills never land with an execution running at their checkpoint P
(``ResumePlan.reattach`` is 0 in every row). In the 1-cell resume e2e that is
structural: the only cell trains at every checkpoint. In the 3-cell CPU demo
(configs/cpu_demo.toml) every execution of a burst is dispatched at its
``PublishDone`` and they finish together, batched on the engines: in four
recorded demo runs (two on two Ray nodes, two on one host), 23 of 60 checkpoints
had any execution running at P, and the last of those ended 0.002 to 0.091 s
after the ``StepDone`` (once 1.0 s), while a resume reads the supervisor's ledger
seconds after the kill (``gyre run --resume``'s imports alone take ~2 s). So the
at-P path is held here, outside the demo:

A run folder is written as a job killed in burst 2 leaves it
(``test_runtime_resume_plan.instant_world``: checkpoint v2 complete, x6 placed
before P and still running at the kill, x7 ended after P). The edge is a
scripted engine (a thread of this test); the rest is real: Gyre's proxy process
recording into ``records/``, a driver process (attempt 1) that starts the run's
supervisor (``supervisor.client.start_or_reuse``) and runs x6's scripted harness
under it through ``HarnessRunner``, and is SIGKILLed once the proxy has recorded
x6's second call. Then, in this process: ``plan_resume`` sorts x6 as re-attached
(its harness still running under the live supervisor), ``prepare_folder`` leaves
its records and workspace in place, and a resumed ``HarnessRunner`` attaches to
it. Checked: after the kill, before the resume, the run's processes are the
supervisor and what its ledger runs (the proxy aside: here it is the test's);
the harness the resume attached to is the one started before the
kill (same pid, started once, ``runner.attached``); it completes and ends exactly
once under its id (one ``started`` and one ``ended`` ledger record, one result,
its true start time); its records continued in the same file (what was recorded
at the kill is a prefix), one per call the harness made (none lost or doubled,
request ids unique, each a well-formed engine answer); the printed kill row shows
it re-attached with its harness work kept. ~12 s (~3 s of it the proxy's start).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gyre import events as ev
from gyre.formats.journal import JournalLog
from gyre.real.harness.runner import Budgets, HarnessRunner, ScriptedHarness
from gyre.real.runtime.resume import plan_resume, prepare_folder, save_job
from gyre.real.supervisor.client import SupervisorClient
from gyre.real.supervisor.ledger import read_ledger
from gyre.real.supervisor.ledger import read_records as ledger_records
from gyre.real.toy.tasks import EmitTokenTask

try:
    import kill_points as kp
    import proxy_fixtures as pf
    import resume_watch as rw
    from processes import alive, wait_until
    from test_runtime_resume_plan import checkpoint, instant_world, job
except ImportError:
    from .. import proxy_fixtures as pf
    from ..processes import alive, wait_until
    from . import kill_points as kp
    from . import resume_watch as rw
    from .test_runtime_resume_plan import checkpoint, instant_world, job

pytestmark = pytest.mark.timeout(120)

X = 6            # running at P and at the kill (instant_world)
CALLS = 4        # its scripted harness's model calls, 1.5 s of "tool work" after each
ADAPTER = ScriptedHarness(calls=CALLS, compact_every=0, subagent_at=(), sleep_s=1.5)
KEY = f"key-x{X}"

DRIVER = """
import asyncio, sys
from pathlib import Path
from gyre.real.harness.runner import Budgets, HarnessRunner, ScriptedHarness
from gyre.real.supervisor.client import start_or_reuse
from gyre.real.toy.tasks import EmitTokenTask

work, url, x, key = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
client, _ = start_or_reuse(work / "supervisor", grace_s=60.0)  # outlives this driver by design
runner = HarnessRunner(work / "executions", url, ScriptedHarness(**ADAPTER), Budgets(harness_timeout_s=120.0),
                       isolate="never", supervisor=client)
asyncio.run(runner.run(x, EmitTokenTask().task("q"), key))
"""


def killed_at_p(work: Path) -> int:
    """The run folder of a job killed in burst 2 (checkpoint v2 complete, ``X`` running at P); returns P."""
    work.mkdir(exist_ok=True)  # the proxy made records/ in it
    cfg = job(work).scheduler()
    save_job(job(work), work)
    core, events, running = instant_world(cfg, lambda core: core.version >= 3 and core.batch_open)
    at_p = next(i + 1 for i, e in enumerate(events) if isinstance(e, ev.StepDone) and e.version == 1)
    assert X in running and X in core.placements()
    log = JournalLog(work / "log" / "events.jsonl")
    for event in events:
        log.record_event(event)
    (work / "log" / "summary.json").write_text(json.dumps({"config": cfg.__dict__}))
    checkpoint(work, 2, at_p)
    for v in (0, 2):
        (work / "checkpoints" / f"v{v:06d}").mkdir()
    (work / "engine-model").mkdir()
    return at_p


def driver_source() -> str:
    fields = {name: getattr(ADAPTER, name) for name in ("calls", "compact_every", "subagent_at", "sleep_s")}
    return DRIVER.replace("**ADAPTER", "**" + repr(fields))


@pytest.fixture
def proxy(tmp_path_factory, tmp_path):
    """Gyre's proxy process recording into ``run/records``, in front of a scripted engine (the edge)."""
    pytest.importorskip("aiohttp")
    model = pf.build_tiny_tokenizer(pf.shared_tiny_dir(tmp_path_factory))
    engine = pf.ServerThread(pf.ScriptedEngine(model, pf.echo_script).application).start()
    config = {"model_path": str(model), "records_dir": str(tmp_path / "run" / "records"),
              "admin_token": "admin-token", "engines": [{"id": "e0", "url": engine.url}], "fsync": True,
              "executions": {KEY: f"x{X}"}}
    process, url = pf.start_proxy_process(config, tmp_path / "proxy.json")
    yield url, model, process.pid
    process.send_signal(signal.SIGTERM)
    process.wait(20)
    engine.stop()


def test_a_resume_re_attaches_the_harness_running_at_its_checkpoint(tmp_path, proxy):
    url, model, proxy_pid = proxy
    work = tmp_path / "run"
    at_p = killed_at_p(work)
    records = work / "records" / f"x{X}.tito"
    try:
        run_then_kill_a_driver(work, url, records)
        supervisor = SupervisorClient.find(work / "supervisor")
        at_kill = read_ledger(work / "supervisor" / "ledger.jsonl")[f"x{X}"]
        recorded_at_kill = rw.calls_of(records)
        assert at_kill.state == "running" and alive(at_kill.pid) and supervisor is not None
        # what is left of the run: the supervisor and what it runs (the proxy is this test's, not the run's)
        strays, found = rw.not_owned(tmp_path, work)
        assert [line for line in strays if not line.startswith(f"{proxy_pid}:")] == [], strays
        plan_re_attaches(work, at_p, supervisor.pid, len(set(found) - {proxy_pid}))
        resumed = HarnessRunner(work / "executions", url, ADAPTER, Budgets(harness_timeout_s=120.0),
                                isolate="never", supervisor=supervisor)
        result = asyncio.run(resumed.run(X, EmitTokenTask().task("q"), KEY))
    finally:
        stop_the_supervisor(work)
    harness_log = (work / "executions" / f"exec-{X}" / "harness.log").read_text()
    assert (result.outcome, result.returncode) == ("completed", 0), harness_log
    # the same process, started once, ended once under its id, with its true start
    assert resumed.attached == {X: at_kill.pid}
    history = [r["kind"] for r in ledger_records(work / "supervisor" / "ledger.jsonl") if r["key"] == f"x{X}"]
    assert history == ["started", "ended"], history
    final = read_ledger(work / "supervisor" / "ledger.jsonl")[f"x{X}"]
    assert (final.pid, final.starts, final.exit_code) == (at_kill.pid, 1, 0)
    assert result.started_at == at_kill.started_mono_s
    # its records went on in the same file: none lost, none doubled, one per call the harness made
    calls = rw.calls_of(records)
    assert len(recorded_at_kill) < CALLS and calls[:len(recorded_at_kill)] == recorded_at_kill
    assert len(calls) == len(set(calls)) == CALLS
    assert len(pf.check_records(work / "records", f"x{X}", model)) == CALLS


def run_then_kill_a_driver(work: Path, url: str, records: Path) -> None:
    """Attempt 1: a driver process runs ``X``'s harness under the run's supervisor, and is SIGKILLed once
    the proxy recorded two of its calls (a crash of the driver: its supervisor and the harness go on)."""
    driver = subprocess.Popen([sys.executable, "-c", driver_source(), str(work), url, str(X), KEY],
                              start_new_session=True)
    try:
        assert wait_until(lambda: records.is_file() and len(rw.calls_of(records)) >= 2, 30, poll_s=0.05), \
            "the harness made no two model calls under the first driver"
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(10)


def plan_re_attaches(work: Path, at_p: int, supervisor: int, processes: int) -> None:
    """The plan re-attaches ``X`` (x7, also at P, ended after it: re-admitted), keeps its records in place,
    and the kill's row says so."""
    plan = plan_resume(work)
    assert plan.position == at_p and (plan.reattach, plan.rerun, plan.readmit) == ([X], [], {7: "completed"})
    assert plan.supervisor == supervisor
    aside = prepare_folder(plan)
    records = work / "records" / f"x{X}.tito"
    assert records.is_file() and not (aside / "records" / records.name).exists()
    row = {"kill": 1, "what": "driver", "moment": "execution running at P",
           **kp.resume_columns(json.loads((aside / "resume.json").read_text()), [X]), "processes": processes}
    print(kp.kill_table([row]))
    assert (row["at P"], row["re-attached"], row["re-run"]) == (2, 1, 0)
    assert row["saved exec-s"] >= 1.5  # the first call's tool work at least


def stop_the_supervisor(work: Path) -> None:
    """Stop the run's supervisor (with the harness it runs), whatever the test reached."""
    client = SupervisorClient.find(work / "supervisor")
    if client is not None:
        client.stop()
