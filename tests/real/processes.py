"""Process checks the lifetime tests share (Linux ``/proc``): is a process alive, who is in a process group.

``alive`` is False for a zombie (it has ended; only its exit status waits to be
read); ``group`` lists the live members of a process group; ``wait_until``
polls a predicate and returns its last answer.
"""

from __future__ import annotations

import time
from pathlib import Path


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def group_members(pgid: int) -> list[int]:
    """Live processes whose process group is ``pgid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def wait_until(predicate, timeout: float, poll_s: float = 0.1) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` seconds pass; its last answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll_s)
    return bool(predicate())


def all_gone(pids: list[int], within_s: float) -> bool:
    """Whether every one of ``pids`` has ended within ``within_s`` seconds."""
    return wait_until(lambda: not any(alive(pid) for pid in pids), within_s, poll_s=0.5)
