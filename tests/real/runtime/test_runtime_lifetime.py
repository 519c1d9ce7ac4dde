"""``runtime.lifetime``: what a job starts dies with it, and ``kill PID`` runs the job's cleanup.

Each test starts a stand-in job as its own Python process (the parent), so the
test can kill it the way a user or a scheduler would:
- a child started with ``preexec_fn=die_with_parent`` ends when its parent is
  SIGKILLed; the same child started without it survives (the control: the
  mechanism, not the test, ends it);
- a job that called ``terminate_on_sigterm`` runs its ``finally`` on SIGTERM and
  exits 128 + 15;
- a real SGLang engine launched by ``EngineManager`` from a parent that is
  SIGKILLed disappears with its whole process group (scheduler included),
  which is what left orphaned engines behind a killed ``gyre run`` before.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from gyre.real.engines.manager import sglang_python

try:
    from processes import alive, group_members, wait_until
    from proxy_fixtures import free_port, shared_tiny_dir
except ImportError:
    from ..processes import alive, group_members, wait_until
    from .proxy_fixtures import free_port, shared_tiny_dir

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")


def _parent(script: str) -> tuple[subprocess.Popen, int]:
    """Start ``script`` as a stand-in job; it prints one pid on its first line."""
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], stdout=subprocess.PIPE, text=True)
    line = parent.stdout.readline()
    assert line.strip().isdigit(), f"the stand-in job printed {line!r}"
    return parent, int(line)


CHILD = """
    import subprocess, time
    from gyre.real.runtime.lifetime import die_with_parent
    kwargs = {{"preexec_fn": die_with_parent}} if {guarded} else {{}}
    child = subprocess.Popen(["sleep", "120"], start_new_session=True, **kwargs)
    print(child.pid, flush=True)
    time.sleep(120)
"""


@pytest.mark.parametrize("guarded", [True, False])
def test_a_child_dies_with_its_killed_parent_only_when_asked(guarded):
    parent, child = _parent(CHILD.format(guarded=guarded))
    try:
        assert alive(child)
        parent.kill()
        parent.wait(10)
        gone = wait_until(lambda: not alive(child), 5.0)
        assert gone == guarded, f"child {'survived' if not gone else 'died'} with guarded={guarded}"
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)


def test_sigterm_runs_the_jobs_cleanup(tmp_path):
    marker = tmp_path / "cleaned"
    parent, pid = _parent(f"""
        import os, time
        from gyre.real.runtime.lifetime import terminate_on_sigterm
        assert terminate_on_sigterm()
        try:
            print(os.getpid(), flush=True)
            time.sleep(120)
        finally:
            open({str(marker)!r}, "w").write("stopped engines")
    """)
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(10) == 128 + signal.SIGTERM
    assert marker.read_text() == "stopped engines"


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(not sglang_python().exists(), reason=f"SGLang CPU venv not found at {sglang_python()}")
def test_a_real_engine_group_dies_with_a_killed_job(tmp_path_factory):
    from gyre.real.toy.tiny_model import build_tiny_qwen2

    model = build_tiny_qwen2(shared_tiny_dir(tmp_path_factory, "tiny-qwen2"))
    logs = tmp_path_factory.mktemp("engine-logs")
    parent, pgid = _parent(f"""
        import time
        from gyre.real.engines.manager import EngineManager, EngineSpec
        manager = EngineManager({str(logs)!r})
        spec = EngineSpec(engine_id="orphan-check", model_path={str(model)!r}, port={free_port()},
                          extra_args=("--mem-fraction-static", "0.05", "--max-total-tokens", "32768",
                                      "--skip-server-warmup"))
        print(manager.launch(spec).process.pid, flush=True)
        time.sleep(300)
    """)
    try:
        # wait until SGLang has started its scheduler beside the launcher: the group is more than one process
        assert wait_until(lambda: len(group_members(pgid)) >= 2, 180), \
            f"the engine never started its scheduler: {group_members(pgid)}; log: {(logs / 'orphan-check.log').read_text()[-2000:]}"
        parent.kill()
        parent.wait(10)
        assert wait_until(lambda: not group_members(pgid), 60), f"orphaned engine processes: {group_members(pgid)}"
    finally:
        for pid in group_members(pgid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("code, status", [("raise SystemExit(3)", 3),
                                          ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -9)])
def test_the_reaper_ends_like_its_command(code, status):
    """The manager reads an engine's own exit status through the reaper: same code, or death by the same signal."""
    done = subprocess.run([sys.executable, "-m", "gyre.real.engines.reaper", "--", sys.executable, "-c", code],
                          timeout=60, start_new_session=True)
    assert done.returncode == status


def test_a_killed_reaper_takes_its_whole_group(tmp_path):
    """SIGTERM to the reaper (what a dying job sends through the parent-death signal) ends every process
    its command started, even one that ignores SIGTERM (after the grace period: SIGKILL)."""
    stubborn = "import signal, subprocess, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); " \
               "subprocess.Popen(['sleep', '120']); print('up', flush=True); time.sleep(120)"
    reaper = subprocess.Popen([sys.executable, "-m", "gyre.real.engines.reaper", "--", sys.executable, "-c", stubborn],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert reaper.stdout.readline().strip() == "up"
        assert len(group_members(reaper.pid)) == 3  # reaper, the stubborn command, its sleep
        reaper.send_signal(signal.SIGTERM)
        assert reaper.wait(30) == -signal.SIGKILL  # the grace ran out: the group, reaper included, was killed
        assert wait_until(lambda: not group_members(reaper.pid), 5.0), group_members(reaper.pid)
    finally:
        for pid in group_members(reaper.pid):
            os.kill(pid, signal.SIGKILL)


def test_a_stopped_reaper_ends_once_its_command_has_ended_not_after_the_grace():
    """The reaper's stop waits for its command only as long as it runs: a command that ends on SIGTERM ends the
    group at once (a wait nested in the signal handler used to sit out the whole grace, 10 s per engine stop)."""
    from gyre.real.engines.reaper import GRACE_S

    reaper = subprocess.Popen([sys.executable, "-m", "gyre.real.engines.reaper", "--", sys.executable, "-c",
                               "import time; print('up', flush=True); time.sleep(120)"],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert reaper.stdout.readline().strip() == "up"
        reaper.send_signal(signal.SIGTERM)
        assert reaper.wait(GRACE_S / 2) == -signal.SIGKILL  # the group's final SIGKILL, well inside the grace
        assert wait_until(lambda: not group_members(reaper.pid), 5.0), group_members(reaper.pid)
    finally:
        for pid in group_members(reaper.pid):
            os.kill(pid, signal.SIGKILL)
