"""Processes a job starts die with the job, however the job ends.

A job (``gyre run``) starts SGLang engines, training cells (through a
multiprocessing forkserver) and harness processes, each in its own session so
it can be stopped as a group. Without more, a job killed by a signal leaves
them running: SIGTERM's default action skips every ``finally``, and SIGKILL
skips everything. Two mechanisms close that:

- ``die_with_parent(sig)``: called in a child (as ``preexec_fn``, or first
  thing in a process entry point), the kernel sends ``sig`` to the child when
  the thread that forked it ends (Linux ``PR_SET_PDEATHSIG``). Launch from the
  job's main thread (or one that lives as long as the job): the signal follows
  the forking *thread*, not the process. An SGLang engine is a launcher plus
  processes it spawns, which arm their own parent-death signal only once
  running, so the engine manager launches each engine under
  ``engines.reaper``, which ends the whole group when it gets the signal.
- ``release_forkserver()``: called first thing in a process started by a
  multiprocessing forkserver (the training cells). The forkserver exits when
  the last copy of its "alive" pipe's write end closes, and it hands every
  child a copy (so a child could start processes through it too). A child
  that keeps its copy keeps the forkserver alive after the job is gone, and
  the child's own parent-death signal (armed on the forkserver) then never
  comes: the forkserver and the cells outlived a ``kill -9`` of ``gyre run``.
  Closing the copy leaves the job as the only holder: its death (whatever the
  signal) closes the pipe, the forkserver exits, and its children get their
  parent-death signal.
- ``terminate_on_sigterm()``: the job turns SIGTERM (and SIGHUP) into
  ``SystemExit``, so its ``finally`` blocks and context managers stop the
  engines, cells and harnesses in order, exactly as after Ctrl-C.

Invariants: all are no-ops where the mechanism does not exist (not Linux,
not the main thread); neither changes anything else about the process.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from typing import Any

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent (thread) dies; True if set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def release_forkserver() -> bool:
    """Close this process's copy of its forkserver's alive pipe (module docstring); True if one was open."""
    from multiprocessing import forkserver

    server: Any = forkserver._forkserver  # a private attribute of CPython's forkserver (3.11-3.13)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is None:
        return False
    server._forkserver_alive_fd = None
    try:
        os.close(fd)
    except OSError:
        return False
    return True


def _exit_on_signal(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def terminate_on_sigterm() -> bool:
    """Make SIGTERM and SIGHUP raise ``SystemExit(128 + signal)`` in the main thread; True if installed."""
    if threading.current_thread() is not threading.main_thread():
        return False
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)
    return True
