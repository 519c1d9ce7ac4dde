"""Attempt fencing: a cell of an older attempt never acts on a run folder a newer attempt holds.

Every start of a job on a run folder is an *attempt*, numbered 1, 2, ...: a
fresh run is attempt 1; a resume is one past the killed attempt whose leftovers
it moves to ``attempts/{n}`` (``runtime.resume.running_attempt``). The job
writes its number into the training plane's folder (``plane/attempt``,
replaced atomically) right after it takes the run folder's lock, before it
moves anything of a killed attempt aside and before it starts cells. Each cell
is started with the number (``CellConfig.attempt``) and each command the job
sends names it. A cell checks (``exit_if_stale``) before it runs a command and
before it claims a micro-step, so each claim's rename, resume checkpoint,
published folder and dump follows a check. (Not fenced: the lines a cell
appends to its own log, ``plane/cell{n}.log``, and the rest of a command or
micro-step already under way when the newer attempt takes the folder; the
next check ends the cell.) A command naming another attempt, or a folder whose
``plane/attempt`` names another attempt, makes the cell print one line on its
stderr and exit with ``FENCED_EXIT``, having done nothing of the command and
written nothing into the folder. The check sits on the cell's side, so it
holds also for a cell whose job is gone (the orphan a killed job could leave
before ``runtime.lifetime.release_forkserver``).

Invariants: attempt 0 is unfenced (a plane outside a job: benchmarks, tests);
a folder without ``plane/attempt`` fences nothing (a cell on another machine
does not see the driver's folder; its commands still name the attempt);
``write_attempt`` never lowers the number a folder holds.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

FENCE_FILE = "attempt"
FENCED_EXIT = 75  # EX_TEMPFAIL: the work belongs to a newer attempt


class StaleAttempt(RuntimeError):
    """An attempt older than the one that holds the folder tried to take it."""


def current_attempt(folder: str | os.PathLike) -> int | None:
    """The attempt that holds ``folder`` (None: not fenced)."""
    try:
        text = (Path(folder) / FENCE_FILE).read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return int(text) if text.isdigit() else -1  # garbled: held by no attempt, so every cell steps back


def write_attempt(folder: str | os.PathLike, attempt: int) -> None:
    """Make ``attempt`` the holder of ``folder``; StaleAttempt if a newer one holds it already."""
    folder = Path(folder)
    held = current_attempt(folder)
    if held is not None and held > attempt:
        raise StaleAttempt(f"{folder} is held by attempt {held}, newer than {attempt}")
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{FENCE_FILE}.{os.getpid()}"
    tmp.write_text(f"{attempt}\n")
    os.replace(tmp, folder / FENCE_FILE)


def stale(folder: str | os.PathLike, attempt: int, named: int | None = None) -> str | None:
    """Why a cell of ``attempt`` must not act (on a command naming ``named``); None when it may."""
    if not attempt:
        return None
    if named is not None and named != attempt:
        return f"a command of attempt {named} reached a cell of attempt {attempt}"
    held = current_attempt(folder)
    if held is not None and held != attempt:
        return f"{folder} is held by attempt {held}, this cell belongs to attempt {attempt}"
    return None


def exit_if_stale(folder: str | os.PathLike, attempt: int, named: int | None = None, who: str = "cell") -> None:
    """End this process at once with ``FENCED_EXIT`` when ``stale``; nothing is written into ``folder``."""
    reason = stale(folder, attempt, named)
    if reason is None:
        return
    print(f"{who}: fenced out ({reason}); exiting without acting", file=sys.stderr, flush=True)
    os._exit(FENCED_EXIT)
