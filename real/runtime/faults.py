"""Fault injection for crash tests: ``GYRE_FAULT_PAUSE`` makes one named phase of one version sleep.

A step takes ~0.1 s on CPU, so a test that must kill a job *inside* a step or
a publication (``gyre run --resume``'s tests) cannot aim at it by time. With

    GYRE_FAULT_PAUSE="step=60@5,publish=60@6"

the core cell sleeps 60 s at the start of the ``step`` of version 5 (after its
``StartBatch``, before its ``StepDone``) and at the start of the ``publish``
of version 6 (after ``Publish``, before ``PublishDone``); the test watches
the durable event log (``events.jsonl``) for that phase, then kills. The
cells inherit the variable from the job's environment. Unset (every real
run), nothing sleeps.

Phases: ``step``, ``publish`` (numbered by version) and ``transition``
(a cell entering training, numbered by the count of ``enter_training``
commands its process has served, 1 for the first; the cell does not know the
version then). ``*`` for the number matches every one: ``transition=5@*``
holds each entry into training 5 s. Invariant: a malformed value raises
ValueError naming it when the phase is first reached, so a typo in a test
never silently skips its kill point.
"""

from __future__ import annotations

import os
import time

ENV = "GYRE_FAULT_PAUSE"
PHASES = ("step", "publish", "transition")
ANY = -1  # ``@*``: every number


def parse_pauses(text: str) -> dict[tuple[str, int], float]:
    """``"phase=seconds@version,..."`` -> {(phase, version): seconds} (``@*``: version ``ANY``); ValueError
    naming a bad item."""
    pauses = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        phase, _, rest = item.partition("=")
        seconds, _, version = rest.partition("@")
        try:
            key = (phase.strip(), ANY if version.strip() == "*" else int(version))
            value = float(seconds)
        except ValueError:
            raise ValueError(f"{ENV}: {item!r} is not phase=seconds@version") from None
        if key[0] not in PHASES or value < 0:
            raise ValueError(f"{ENV}: {item!r}: phase must be one of {PHASES} and seconds >= 0")
        pauses[key] = value
    return pauses


def fault_pause(phase: str, version: int, log=None, sleep=time.sleep) -> float:
    """Sleep (``sleep``) as ``GYRE_FAULT_PAUSE`` asks for ``phase`` of ``version``; the seconds slept."""
    pauses = parse_pauses(os.environ.get(ENV, ""))
    seconds = pauses.get((phase, version), pauses.get((phase, ANY), 0.0))
    if seconds:
        if log is not None:
            log.warning("fault injection: %s of version %d sleeps %.1f s (%s)", phase, version, seconds, ENV)
        sleep(seconds)
    return seconds
