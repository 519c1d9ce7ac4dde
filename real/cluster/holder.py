"""``python -m gyre.real.cluster.holder -- COMMAND...``: keep an engine's reaper one step away from a Ray worker.

When a Ray worker (here: a node agent) exits, Ray's raylet SIGKILLs the
worker's *direct* children (``RAY_kill_child_processes_on_worker_exit``, on by
default). An engine's reaper (``engines.reaper``) that is SIGKILLed cannot end
its process group, and the SGLang launcher and its children would live on. So
a node agent starts each engine as agent -> holder -> reaper -> SGLang: the
holder is the direct child Ray may SIGKILL; the reaper carries a parent-death
SIGTERM tied to the holder, and on SIGTERM it ends the whole group. Ray does
not always SIGKILL the children (not when it kills the agent itself, as after
the driver died), so the holder's own parent-death signal is SIGKILL: it
ignores SIGTERM (below), and a holder outliving its agent would keep the whole
engine alive.

The holder runs COMMAND in its own process group (the one the agent made), so
a signal to the group reaches every member, and ends the way COMMAND ended
(same exit code, or death by the same signal), so whoever waits for the holder
sees the engine's own status. It ignores the stop signals (SIGTERM, SIGINT,
SIGHUP): a stop sent to the group is the reaper's to carry out, and the holder
ends with it (the reaper's last SIGKILL to the group), as a reaper started
directly would. Stdlib and ``runtime.lifetime`` only.
"""

from __future__ import annotations

import signal
import subprocess
import sys

from gyre.real.engines.reaper import STOP_SIGNALS, _end_like
from gyre.real.runtime.lifetime import die_with_parent


def main(argv: list[str]) -> int:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: python -m gyre.real.cluster.holder -- COMMAND...", file=sys.stderr)
        return 2
    die_with_parent(signal.SIGKILL)  # replaces the agent's SIGTERM, which this process ignores from here on
    child = subprocess.Popen(argv, preexec_fn=die_with_parent)  # SIGTERM to the reaper if this process dies
    for sig in STOP_SIGNALS:  # a stop signal to the group is the reaper's to handle; wait for its outcome
        signal.signal(sig, signal.SIG_IGN)
    return _end_like(child.wait())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
