"""Keys of the training plane's control store, each defined once.

The driver (``plane``), the cell processes (``cell``, ``core``,
``satellite``) and ``membership`` talk through one key-value store; every key
they use is built by a function here, so a reader and a writer can never
disagree on a spelling.

| key                      | written by          | meaning                                        |
|--------------------------|---------------------|------------------------------------------------|
| ready/{cell}             | cell                | the cell process is up (its pid)               |
| cmd/{cell}/{n}           | plane               | the n-th command to a cell                     |
| reply/{cell}/{n}         | cell                | the answer to that command                     |
| crash/{cell}             | plane (supervisor)  | the cell process died (exit code, pid)         |
| seat/{version}/{cell}    | membership          | a cell's seat in step ``version``'s join window |
| window/{version}/info    | core                | batch id and snapshot of step ``version``      |
| snapshot/{version}/{rank}| core (each rank)    | Snapshot of the core's shard ``rank``          |
| pull/{version}/{cell}    | satellite           | a satellite pulled the snapshot                |
| done/{version}/{cell}    | satellite           | a satellite's report for step ``version``      |
| fail/{version}/{cell}    | satellite           | a satellite failed in step ``version``         |
| decision/{version}       | core                | the prefix that reduced, and what to discard   |
| after/{version}          | core                | release or broadcast after step ``version``    |
"""

from __future__ import annotations


def ready(cell: int) -> str:
    return f"ready/{cell}"


def command(cell: int, n: int) -> str:
    return f"cmd/{cell}/{n}"


def reply(cell: int, n: int) -> str:
    return f"reply/{cell}/{n}"


def crash(cell: int) -> str:
    return f"crash/{cell}"


def seat(version: int, cell: int) -> str:
    return f"seat/{version}/{cell}"


def window_info(version: int) -> str:
    return f"window/{version}/info"


def snapshot(version: int, rank: int) -> str:
    return f"snapshot/{version}/{rank}"


def pulled(version: int, cell: int) -> str:
    return f"pull/{version}/{cell}"


def done(version: int, cell: int) -> str:
    return f"done/{version}/{cell}"


def failed(version: int, cell: int) -> str:
    return f"fail/{version}/{cell}"


def decision(version: int) -> str:
    return f"decision/{version}"


def after(version: int) -> str:
    return f"after/{version}"
