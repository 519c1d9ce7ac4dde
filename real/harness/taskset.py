"""Task sets: a JSONL file of tasks, one evaluator class, and the workspace each execution starts from.

One task per line, a JSON object with these keys (``id`` and ``prompt`` required):

- ``id``: the task's id, under both id rules of the house: the proxy's
  (``ID_RULE``: 1-128 of ``[A-Za-z0-9._:-]``, starting with a letter or digit)
  and ``gyre.ids`` (never the shape of a core id, ``x12``/``g3``/``q0``);
- ``prompt``: the task text (the harness's ``-p``/``-t`` and ``TASK.md``);
- ``workspace``: ``{"copy": DIR, "files": {PATH: TEXT}, "setup": [COMMAND]}``,
  all optional: a directory (relative to the JSONL file) copied into the
  workspace, then files written (relative paths inside the workspace), then
  shell commands run there (each within ``setup_timeout_s``, no network
  inside an isolated sandbox);
- ``evaluator_args``: the evaluator class's keyword arguments for this task;
- ``meta``: free-form data the runtime ignores (e.g. a reference fix).

``load_taskset(path, evaluator, ...)`` validates everything before anything
starts: each error is a ``ValueError`` naming the file, the line and the
field (malformed JSON, unknown key, bad id, duplicate id with both lines,
unsafe path, missing copy directory, evaluator arguments the class refuses).

At run time a ``TaskSet`` is the backend's task source. ``task(query_id)``
picks the group's task by a seeded hash of the query id (a pure function of
(seed, query id), so a replay gives every group the same task); ``harness(inner)``
wraps an adapter so the execution's process first builds the workspace
(``harness.workspace_setup``, inside the sandbox and the harness timeout) and
then execs the harness; ``evaluate(execution_id, workspace)`` scores the
preserved workspace with that task's evaluator, or returns None (a total
failure with no evaluable work, docs/trajectories.md#evaluation-and-outcomes: a zero placeholder) when the
workspace setup never finished (no ``setup.done`` beside the workspace).

Invariants: every execution directory is bound to exactly one task, recorded
before its process starts, and evaluated only by that task's evaluator; an
execution never set up raises ``EvaluatorFailure`` rather than being scored
against the wrong task.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Mapping

from gyre.real.harness.plugins import construct, require_method, resolve_class
from gyre.real.harness.runner import Task
from gyre.real.harness.tasks import EvaluatorFailure
from gyre.real.harness.workspace_setup import DONE

# The proxy's one id rule (gyre.real.proxy.config.ID_RULE / valid_id; the harness package never imports the
# proxy, and tests/real/runtime/test_runtime_tasks.py checks that the two agree).
ID_RULE = "1-128 characters of [A-Za-z0-9._:-], starting with a letter or digit"
_PROXY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
_CORE_ID = re.compile(r"[xgq][0-9]+")  # the shapes of gyre.ids (execution, group, query)
KEYS = {"id", "prompt", "workspace", "evaluator_args", "meta"}
WORKSPACE_KEYS = {"copy", "files", "setup"}


def id_problem(value: object) -> str | None:
    """Why ``value`` is not a usable task id (None when it is)."""
    if not isinstance(value, str) or _PROXY_ID.fullmatch(value) is None:
        return f"must be {ID_RULE}, got {str(value)[:140]!r}"
    if _CORE_ID.fullmatch(value):
        return f"{value!r} has the shape of a core id (gyre.ids: x<n>, g<n>, q<n>); choose another"
    return None


def path_problem(value: object) -> str | None:
    """Why ``value`` is not a safe relative path inside a workspace (None when it is)."""
    if not isinstance(value, str) or not value or "\\" in value or "\0" in value:
        return f"must be a non-empty relative path, got {value!r}"
    parts = PurePosixPath(value).parts
    if value.startswith("/") or ".." in parts or not parts or parts[0] == ".":
        return f"must stay inside the workspace (relative, no '..'), got {value!r}"
    return None


@dataclass(frozen=True)
class TaskSpec:
    task_id: str
    prompt: str
    line: int
    copy: str | None = None                     # absolute directory copied into the workspace
    files: Mapping[str, str] = field(default_factory=dict)
    setup: tuple[str, ...] = ()
    evaluator_args: Mapping[str, Any] = field(default_factory=dict)
    meta: Mapping[str, Any] = field(default_factory=dict)


def parse_line(text: str, line: int, base: Path) -> TaskSpec:
    """One JSONL line as a ``TaskSpec``; errors name the field (the caller adds file and line)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"malformed JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"a task is a JSON object, not {type(data).__name__}")
    unknown = sorted(set(data) - KEYS)
    if unknown:
        raise ValueError(f"unknown key(s) {unknown}; known: {sorted(KEYS)}")
    for key in ("id", "prompt"):
        if key not in data:
            raise ValueError(f"missing {key!r}")
    problem = id_problem(data["id"])
    if problem:
        raise ValueError(f"id {problem}")
    if not isinstance(data["prompt"], str) or not data["prompt"].strip():
        raise ValueError("prompt must be a non-empty string")
    ws = data.get("workspace", {})
    if not isinstance(ws, dict) or set(ws) - WORKSPACE_KEYS:
        raise ValueError(f"workspace must be an object with keys among {sorted(WORKSPACE_KEYS)}, got {ws!r:.200}")
    copy = ws.get("copy")
    if copy is not None:
        if not isinstance(copy, str) or not (base / copy).is_dir():
            raise ValueError(f"workspace.copy: {copy!r} is not a directory (relative to {base})")
        copy = str((base / copy).resolve())
    files = ws.get("files", {})
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise ValueError("workspace.files must map relative paths to text")
    for name in files:
        problem = path_problem(name)
        if problem:
            raise ValueError(f"workspace.files: path {problem}")
    setup = ws.get("setup", [])
    if not isinstance(setup, list) or not all(isinstance(c, str) and c.strip() for c in setup):
        raise ValueError("workspace.setup must be a list of non-empty shell commands")
    for key in ("evaluator_args", "meta"):
        if not isinstance(data.get(key, {}), dict):
            raise ValueError(f"{key} must be an object")
    return TaskSpec(task_id=data["id"], prompt=data["prompt"], line=line, copy=copy, files=dict(files),
                    setup=tuple(setup), evaluator_args=dict(data.get("evaluator_args", {})),
                    meta=dict(data.get("meta", {})))


def read_specs(path: str | Path) -> list[TaskSpec]:
    """Every task of a JSONL file (blank lines skipped); errors name the file and the line."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").split("\n")  # JSONL: only \n ends a line (not U+2028)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"task set {path}: {exc}") from None
    specs: list[TaskSpec] = []
    first_line: dict[str, int] = {}
    for number, text in enumerate(lines, start=1):
        text = text.removesuffix("\r")
        if not text.strip():
            continue
        try:
            spec = parse_line(text, number, path.parent)
        except ValueError as exc:
            raise ValueError(f"task set {path} line {number}: {exc}") from None
        if spec.task_id in first_line:
            raise ValueError(f"task set {path} line {number}: duplicate task id {spec.task_id!r} "
                             f"(first on line {first_line[spec.task_id]})")
        first_line[spec.task_id] = number
        specs.append(spec)
    if not specs:
        raise ValueError(f"task set {path}: no tasks")
    return specs


class TaskSet:
    """The backend's task source for a task set (see the module docstring)."""

    def __init__(self, specs: list[TaskSpec], evaluators: Mapping[str, Any], *, seed: int = 0,
                 setup_timeout_s: float = 120.0) -> None:
        self.specs, self.evaluators = list(specs), dict(evaluators)
        self.seed, self.setup_timeout_s = seed, setup_timeout_s
        self.by_id = {s.task_id: s for s in self.specs}
        self.bound: dict[Path, str] = {}  # execution directory -> task id

    def spec_for(self, query_id: str) -> TaskSpec:
        digest = hashlib.sha256(f"{self.seed}:{query_id}".encode()).digest()
        return self.specs[int.from_bytes(digest[:8], "big") % len(self.specs)]

    def task(self, query_id: str) -> Task:
        spec = self.spec_for(query_id)
        return Task(task_id=spec.task_id, prompt=spec.prompt)

    def harness(self, inner: Any) -> "TaskSetHarness":
        return TaskSetHarness(inner, self)

    def evaluate(self, execution_id: str, workspace: Path):
        task_id = self.bound.get(Path(workspace).parent)
        if task_id is None:
            raise EvaluatorFailure(f"execution {execution_id}: no task was set up in {workspace}")
        if not (Path(workspace).parent / DONE).exists():
            return None  # the sandbox never came up: no evaluable work
        return self.evaluators[task_id].evaluate(execution_id, Path(workspace))


@dataclass(frozen=True)
class TaskSetHarness:
    """An adapter that builds the task's workspace in the execution's own process, then runs ``inner``."""

    inner: Any
    taskset: TaskSet

    @property
    def name(self) -> str:
        return self.inner.name

    def command(self, task: Task, base_url: str, key: str, home: Path) -> tuple[list[str], dict[str, str]]:
        spec = self.taskset.by_id[task.task_id]
        argv, env = self.inner.command(task, base_url, key, home)
        exec_dir = Path(home).parent  # the runner's layout: exec-<n>/{workspace,home}
        setup = exec_dir / "setup.json"
        setup.write_text(json.dumps({"task_id": spec.task_id, "copy": spec.copy, "files": dict(spec.files),
                                     "setup": list(spec.setup), "timeout_s": self.taskset.setup_timeout_s}))
        self.taskset.bound[exec_dir] = spec.task_id
        return [sys.executable, "-m", "gyre.real.harness.workspace_setup", str(setup), "--", *argv], env


def load_taskset(path: str | Path, evaluator: str, *, seed: int = 0, setup_timeout_s: float = 120.0) -> TaskSet:
    """Read and validate a task set and build one evaluator per task (``evaluator`` is "module:Class")."""
    specs = read_specs(path)
    cls = resolve_class(evaluator, "evaluator")
    require_method(cls, "evaluate", "evaluator", evaluator)
    evaluators = {}
    for spec in specs:
        try:
            evaluators[spec.task_id] = construct(cls, spec.evaluator_args, "evaluator_args", evaluator)
        except ValueError as exc:
            raise ValueError(f"task set {path} line {spec.line}: {exc}") from None
    return TaskSet(specs, evaluators, seed=seed, setup_timeout_s=setup_timeout_s)
