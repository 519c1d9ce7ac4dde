"""What the resume test watches and does to a real ``gyre run``: its journal, its proxy, its processes.

- ``core_now``: the policy core rebuilt from the durable journal (a torn last
  line left out); ``wait_for`` polls it until a predicate holds, for a resumed
  job only once the journal is the running attempt's (``journal_identity``
  changed, and the job says it is ready and, from a checkpoint, resumed);
- ``proxy_open_calls``: model calls open at the run's proxy (its admin
  listing's ``in_flight``), 0 while it does not answer;
- ``run_processes`` / ``supervisor_owned``: the live processes of a run (its
  command line or working folder under the test's folder, or a member of a
  process group its supervisor started) and what the supervisor's ledger says
  it owns (the supervisor and every process group it started whose entry is
  still running; the ledger names each by its leader's pid);
- ``kill_job``: SIGKILL of the job's process group (a real crash of ``gyre run``;
  the engines, like the harnesses and the proxy, run under the supervisor and
  go on);
- ``unsettled_engines``: engines whose record says a memory release or resume
  is under way (a kill then leaves what the engine holds unknown: the resume
  starts it again instead of adopting it);
- ``stopped_if_failed``: should the test fail, ``gyre stop RUN_DIR`` ends what
  the run left (its supervisors keep harnesses, proxy and engines for their
  lease, 300 s: CI once saw that load make the next tests fail too).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from gyre.formats.eventlog import run_config
from gyre.formats.journal import read_journal
from gyre.real.engines.record import SETTLED, read_record
from gyre.real.store.tito_log import read_records
from gyre.real.supervisor.ledger import read_ledger
from gyre.real.supervisor.ledger import read_records as ledger_records
from gyre.scheduler import Scheduler

ADMIN_TOKEN = "gyre-job-admin"  # runtime.job_parts.ADMIN_TOKEN (not imported: that module pulls in the backend)


@contextlib.contextmanager
def stopped_if_failed(work: Path) -> Iterator[None]:
    """Run the body; should it raise, stop the run at ``work`` (``gyre stop``) before the error goes on."""
    try:
        yield
    except BaseException:
        if (work / "supervisor").is_dir():
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run([sys.executable, "-m", "gyre.cli", "stop", str(work)], capture_output=True,
                               timeout=180)
        raise


def start(argv: list[str], tmp: Path, name: str, pause: str = "") -> subprocess.Popen:
    env = dict(os.environ, GYRE_FAULT_PAUSE=pause)
    with open(tmp / f"{name}.stderr", "w") as stderr, open(tmp / f"{name}.stdout", "w") as stdout:
        return subprocess.Popen([sys.executable, "-m", "gyre.cli", "run", *argv], cwd=tmp, env=env,
                                stdout=stdout, stderr=stderr, start_new_session=True)


def core_now(work: Path) -> Scheduler | None:
    """The core as the durable journal leaves it (a torn last line is left out)."""
    if not (work / "log" / "summary.json").is_file():
        return None
    core = Scheduler(run_config(work / "log"))
    for event in read_journal(work / "log" / "events.jsonl").events:
        core.handle(event)
    return core


def complete(work: Path, version: int) -> bool:
    return (work / "checkpoints" / f"resume-v{version:06d}" / "manifest.json").is_file()


def newest_checkpoint(work: Path) -> int:
    """The newest complete resume checkpoint's version (0: none): what a resume must go on from."""
    found = [int(p.parent.name[len("resume-v"):]) for p in (work / "checkpoints").glob("resume-v*/manifest.json")]
    return max(found, default=0)


def calls_of(path: Path) -> list[str]:
    return [c.request_id for c in read_records(path)]


def record_snapshot(work: Path) -> dict[str, list[str]]:
    return {p.name: calls_of(p) for p in sorted((work / "records").glob("*.tito"))}


def wait_for(proc: subprocess.Popen, work: Path, ready, what: str, started=None, timeout: float = 300.0):
    """Poll the journal until ``ready(core)`` is true, once ``started()`` says the journal is the running
    attempt's (before, it still holds the killed attempt's events)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the job exited ({proc.returncode}) before {what}"
        if started is not None and not started():
            time.sleep(0.2)
            continue
        try:
            core = core_now(work)
            found = ready(core) if core is not None else None
        except (OSError, ValueError):  # a file being renamed into place: look again
            found = None
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def unsettled_engines(work: Path) -> dict[str, str]:
    """Engines whose record (engine-logs/ID.state.json) says a memory release or resume is under way: a kill then
    leaves what the engine holds unknown, and the resume must start it again (engines.record.unadoptable)."""
    records = {p.name.removesuffix(".state.json"): read_record(p.parent, p.name.removesuffix(".state.json"))
               for p in (work / "engine-logs").glob("*.state.json")}
    return {name: str(r.get("memory")) for name, r in records.items() if r.get("memory") not in SETTLED}


def journal_identity(work: Path) -> int | None:
    """The journal file's inode: a resumed attempt replaces the file (``JournalLog``), so it changes."""
    try:
        return os.stat(work / "log" / "events.jsonl").st_ino
    except OSError:
        return None


def proxy_open_calls(work: Path) -> int:
    """Model calls open at the run's proxy now (0 while it has no configuration or does not answer)."""
    try:
        port = json.loads((work / "proxy" / "proxy.json").read_text())["port"]
        request = urllib.request.Request(f"http://127.0.0.1:{port}/admin/executions",
                                         headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        with urllib.request.urlopen(request, timeout=2.0) as answer:
            listing = json.loads(answer.read())
    except (OSError, ValueError, KeyError):
        return 0
    rows = listing.get("executions", listing) if isinstance(listing, dict) else listing
    return sum(int(row.get("in_flight", 0)) for row in rows if isinstance(row, dict))


def supervisor_pid(work: Path) -> int:
    return int(json.loads((work / "supervisor" / "supervisor.json").read_text())["pid"])


def _stat(pid: str) -> tuple[int, int, str] | None:
    """(parent pid, process group, state) of ``pid``; None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[2]), fields[0]


def _cmdline(pid: str) -> str:
    try:
        return (Path("/proc") / pid / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _of_the_run(pid: str, tmp: Path) -> bool:
    try:
        cwd = os.readlink(Path("/proc") / pid / "cwd")
    except OSError:
        cwd = ""
    return str(tmp) in _cmdline(pid) or cwd.startswith(str(tmp))


def run_processes(tmp: Path, groups: set[int] = frozenset()) -> dict[int, str]:
    """Live processes of the run (not zombies, not this test): pid -> what it is (its command line)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        stat = _stat(entry.name)
        if stat is not None and stat[2] != "Z" and (stat[1] in groups or _of_the_run(entry.name, tmp)):
            found[int(entry.name)] = _cmdline(entry.name)[:160]
    return found


def supervisor_owned(work: Path) -> tuple[int, dict[int, str]]:
    """The live supervisor's pid and, per process group its ledger says it runs, the ledger's key."""
    ledger = read_ledger(work / "supervisor" / "ledger.jsonl")
    return supervisor_pid(work), {e.pid: key for key, e in ledger.items() if e.state == "running"}


def not_owned(tmp: Path, work: Path) -> tuple[list[str], dict[int, str]]:
    """Processes of the run that are neither the supervisor nor in a group it owns, and every one found."""
    supervisor, owned = supervisor_owned(work)
    found = run_processes(tmp, set(owned) | {supervisor})
    strays = [f"{pid}: {line}" for pid, line in found.items()
              if pid != supervisor and (_stat(str(pid)) or (0, 0, ""))[1] not in owned]
    return strays, found


def only_the_supervisor_remains(tmp: Path, work: Path, within: float = 30.0) -> dict[int, str]:
    """After a kill of the driver: the processes left are exactly the supervisor and the process groups its
    ledger says it runs (each of those alive); returns them (issue 29)."""
    deadline = time.monotonic() + within
    strays, found = not_owned(tmp, work)
    while strays and time.monotonic() < deadline:
        time.sleep(0.5)
        strays, found = not_owned(tmp, work)
    supervisor, owned = supervisor_owned(work)
    assert strays == [], f"processes the supervisor does not own: {strays}"
    gone = {key: pid for pid, key in owned.items() if _stat(str(pid)) is None}
    assert supervisor in found and gone == {}, f"the supervisor ({supervisor}) or what its ledger runs is gone: {gone}"
    return found


def kill_job(proc: subprocess.Popen, work: Path) -> dict[str, list[str]]:
    """SIGKILL the job's process group (what a crash of ``gyre run`` ends); what the record store held then."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=60)
    return record_snapshot(work)


def running_harnesses(work: Path) -> dict[int, int]:
    """Executions whose harness the supervisor runs now (from its ledger): execution -> pid."""
    path = work / "supervisor" / "ledger.jsonl"
    return {int(k[1:]): e.pid for k, e in read_ledger(path).items() if k.startswith("x") and e.state == "running"} \
        if path.is_file() else {}


def restarted_without_cause(work: Path) -> list[str]:
    """Harnesses started again though their last run was neither cut by a driver (a cancellation of the
    discarded attempt) nor lost with its supervisor: no harness process is restarted otherwise."""
    last: dict[str, dict] = {}
    found = []
    for record in ledger_records(work / "supervisor" / "ledger.jsonl"):
        before = last.get(record["key"])
        if record["kind"] == "started" and before is not None \
                and not (before["kind"] == "lost" or before.get("killed")):
            found.append(record["key"])
        last[record["key"]] = record
    return found


def resume_record(work: Path, attempt: int) -> dict:
    return json.loads((work / "attempts" / str(attempt) / "resume.json").read_text())
