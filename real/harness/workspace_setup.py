"""Build a task's workspace, then become the harness: ``python -m gyre.real.harness.workspace_setup SPEC -- ARGV``.

Runs as the execution's process, in its workspace (the current directory),
inside its sandbox and harness timeout. ``SPEC`` is the JSON a
``TaskSetHarness`` wrote beside the workspace: ``copy`` (a directory whose
contents are copied in), ``files`` (relative path -> text, parents created),
``setup`` (shell commands run in the workspace, each within ``timeout_s``).
When every step succeeded it writes ``setup.done`` beside ``SPEC`` (outside
the workspace: the task set scores an execution whose setup never finished as
a total failure, docs/trajectories.md#evaluation-and-outcomes), then ``exec``s ``ARGV`` (same process id, so the
runner's budgets and kills apply to the harness unchanged).

Exit status (only when it does not exec): 4 when a setup step failed (the
message names it), 127 when the harness cannot be started. Standard library
only, so it adds milliseconds to a harness start.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

DONE = "setup.done"


def build(spec: dict, workspace: Path) -> str | None:
    """Build the workspace from ``spec``; returns the failure message, or None."""
    if spec.get("copy"):
        shutil.copytree(spec["copy"], workspace, dirs_exist_ok=True)
    for name, text in spec.get("files", {}).items():
        target = workspace / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    for command in spec.get("setup", []):
        try:
            done = subprocess.run(command, shell=True, cwd=workspace, stdin=subprocess.DEVNULL,
                                  timeout=spec.get("timeout_s", 120.0))
        except subprocess.TimeoutExpired:
            return f"setup command timed out after {spec.get('timeout_s')} s: {command!r}"
        if done.returncode != 0:
            return f"setup command exited {done.returncode}: {command!r}"
    return None


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m gyre.real.harness.workspace_setup SPEC -- ARGV...", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    problem = build(spec, Path.cwd())
    if problem is not None:
        print(f"workspace setup for task {spec.get('task_id')!r}: {problem}", file=sys.stderr)
        return 4
    Path(argv[0]).with_name(DONE).write_text("ok\n")
    sys.stdout.flush()
    try:
        os.execvp(argv[2], argv[2:])
    except OSError as exc:
        print(f"workspace setup: could not start {argv[2]}: {exc}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
