"""Job files the real-run tests write: one small ``gyre-1`` job on the CPU stack, changed per test.

``small_job(workdir, **keys)`` is the TOML text of a job of one cell, N = B = 2,
one model call of at most 8 tokens per execution, two steps (one burst) and no
supply timer (``tau = 0``): the smallest run that trains, publishes and
replays. Keyword arguments replace or add ``[job]`` keys (strings, numbers and
booleans); ``tables`` is appended after the job's own tables (``[model]`` ...).
``write_job`` puts it in ``folder/job.toml``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SMALL_JOB: dict[str, Any] = {"preset": "gyre-1", "nodes": 1, "C_e": 4, "N": 2, "B": 2, "steps": 2, "calls": 1,
                             "max_tokens": 8, "timeout_s": 300.0}


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))  # a basic TOML string: the same escapes as JSON's


def small_job(workdir: str | Path, *, tables: str = "", **keys: Any) -> str:
    job = {"workdir": str(workdir), **SMALL_JOB, **keys}
    lines = ["[job]", *(f"{name} = {_toml(value)}" for name, value in job.items()), "[job.schedule]", "tau = 0.0"]
    return "\n".join(lines) + "\n" + tables


def write_job(folder: Path, text: str) -> Path:
    path = folder / "job.toml"
    path.write_text(text)
    return path
