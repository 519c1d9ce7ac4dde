"""Holding a write in flight: ``held(obj, "append")`` makes each call of ``obj.append`` say it was
reached and wait for a release before it goes on, so a test can look at everything else while a
record's write hangs (a stalled disk) and then let it finish. Leaving the block releases the held
call and puts the original back."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator


@contextmanager
def held(obj: Any, name: str, wait_s: float = 30.0) -> Iterator[tuple[threading.Event, threading.Event]]:
    """(reached, release): ``reached`` is set by a held call, which then waits up to ``wait_s`` for
    ``release``; leaving the block releases it and restores ``obj.<name>``, whatever happened."""
    reached, release = threading.Event(), threading.Event()
    original = getattr(obj, name)

    def hold(*args: Any, **kwargs: Any) -> Any:
        reached.set()
        release.wait(wait_s)
        return original(*args, **kwargs)

    setattr(obj, name, hold)
    try:
        yield reached, release
    finally:
        release.set()
        setattr(obj, name, original)
