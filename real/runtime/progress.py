"""What ``gyre run`` shows while a job runs: a progress bar on a terminal, plain lines elsewhere.

``RunDisplay`` takes the job's phase lines (``line``) and each step's metrics
record (``record``, from ``runtime.metrics``). On a terminal it draws one
tqdm bar (steps done of ``steps``) whose text names the current step, the
burst, each cell's role (R rollout, T training, >T / >R switching to it) and
the last loss and reward; phase lines are printed above the bar. Anywhere
else (a pipe, a file, a CI log) it prints plain lines: the phase lines as
given and one ``progress: step S/N, burst B, roles ...`` line per record.

Invariants: every line goes to ``stream`` prefixed with ``prefix``; exactly one
progress line (or bar update) per record; ``close`` leaves the terminal on a
fresh line.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

ROLE_MARKS = {"rollout": "R", "training": "T", "to_training": ">T", "to_rollout": ">R"}


def describe(record: dict[str, Any], steps: int) -> str:
    """``step S/N, burst B, roles 0:R 1:T, loss L, reward W`` for one metrics record."""
    roles = " ".join(f"{c}:{ROLE_MARKS.get(r, r)}" for c, r in record.get("roles", {}).items())
    text = f"step {record.get('step')}/{steps}, burst {record.get('burst')}, roles {roles or '-'}"
    for key, label in (("loss", "loss"), ("reward_mean", "reward"), ("staleness_mean", "staleness")):
        if isinstance(record.get(key), (int, float)):
            text += f", {label} {record[key]:.3f}"
    return text


class RunDisplay:
    def __init__(self, steps: int, stream: TextIO | None = None, *, tty: bool | None = None,
                 prefix: str = "[gyre run] ") -> None:
        self.steps, self.stream, self.prefix = steps, stream or sys.stderr, prefix
        self.tty = self.stream.isatty() if tty is None else tty
        self.bar = None
        if self.tty:
            from tqdm import tqdm

            self.bar = tqdm(total=steps, file=self.stream, desc="gyre run", unit="step", dynamic_ncols=True,
                            leave=True, bar_format="{desc}: {n_fmt}/{total_fmt} |{bar}| {elapsed} {postfix}")

    def line(self, text: str) -> None:
        """A phase line (start-up, one per trained step, warnings)."""
        if self.bar is not None:
            self.bar.write(self.prefix + text, file=self.stream)
        else:
            print(self.prefix + text, file=self.stream, flush=True)

    def record(self, record: dict[str, Any]) -> None:
        """One step's metrics record: the bar moves, or one progress line."""
        text = describe(record, self.steps)
        if self.bar is None:
            print(f"{self.prefix}progress: {text}", file=self.stream, flush=True)
            return
        self.bar.set_postfix_str(text.split(", ", 1)[1], refresh=False)
        self.bar.update(max(0, int(record.get("step") or 0) - self.bar.n))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
