"""A step progress bar that stays silent when stderr is not a terminal."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

from tqdm import tqdm


@contextmanager
def step_progress(steps: int, label: str) -> Iterator[Callable[[int], None]]:
    """Yields ``on_step(version)``; tqdm's ``disable=None`` hides it off a TTY."""
    bar = tqdm(total=steps, desc=label, unit="step", disable=None, leave=False)
    try:
        yield lambda version: bar.update(max(0, min(version, steps) - bar.n))
    finally:
        bar.close()
