"""``python -m gyre.real.engines.reaper -- COMMAND...``: run an engine so its whole process group ends with it.

An SGLang server is a launcher plus the scheduler and detokenizer processes it
spawns. The engine manager starts this reaper as the leader of a new process
group, with ``die_with_parent`` (``runtime.lifetime``), and the reaper runs the
launcher as its child in the same group. Then:

- the job dies (even by SIGKILL): the kernel sends the reaper SIGTERM;
- the reaper gets SIGTERM, SIGINT or SIGHUP (also from the manager's own
  ``killpg``): it sends SIGTERM to the group, gives the launcher ``GRACE_S``
  to stop, then SIGKILLs the group, itself included. So no process of the
  group outlives it, whatever stage the launcher's start-up had reached (its
  children only arm their own parent-death signal once running);
- the launcher exits on its own: the reaper ends the same way (same exit code,
  or death by the same signal), so the manager sees the engine's own status.

Invariants: stdlib only (it runs before anything else of the engine); the
command inherits stdin, stdout, stderr and the environment unchanged.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

GRACE_S = 10.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _end_like(status: int) -> int:
    """Exit with the child's code, or die by the signal that killed it."""
    if status >= 0:
        return status
    if -status in STOP_SIGNALS:
        signal.signal(-status, signal.SIG_DFL)  # SIGKILL and the like cannot be caught anyway
    os.kill(os.getpid(), -status)
    return 128 - status  # not reached for a fatal signal


def _exited_within(pid: int, seconds: float) -> bool:
    """Whether child ``pid`` exits within ``seconds``, without reaping it. Not ``Popen.wait(timeout)``: this
    runs in a signal handler that interrupted ``main``'s own ``wait()``, which holds the Popen's wait lock, so
    a nested wait could never reap and would always sit out the whole grace."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
        time.sleep(0.02)
    return False


def main(argv: list[str]) -> int:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: python -m gyre.real.engines.reaper -- COMMAND...", file=sys.stderr)
        return 2
    child = subprocess.Popen(argv)

    def stop(signum: int, frame: Any) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)  # the group's SIGTERM below reaches this process too
        try:
            os.killpg(os.getpgrp(), signal.SIGTERM)
        except ProcessLookupError:
            pass
        _exited_within(child.pid, GRACE_S)
        os.killpg(os.getpgrp(), signal.SIGKILL)  # whatever is left, this process included

    for sig in STOP_SIGNALS:
        signal.signal(sig, stop)
    return _end_like(child.wait())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
