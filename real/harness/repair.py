"""Repair tasks in tiny repositories: reward = the share of the repository's tests that pass
(docs/trajectories.md#evaluation-and-outcomes).

``RepairEvaluator(tests, expected, sources, timeout_s)`` scores a preserved
workspace by *running* the tests, after the harness stopped (also after a
harness timeout: whatever the workspace holds then is scored):

1. the workspace is copied to a scratch folder (the preserved workspace is
   never touched: no ``__pycache__``, so its content hash does not move);
2. the task's own test files (``tests``: path -> text) are written over the
   copy's: tests the harness edited or deleted are restored, so the reward
   measures the repository's code, never edited tests;
3. ``repair_runner`` runs them in a fresh interpreter (``-I -B``, a minimal
   environment, ``PYTHONHASHSEED=0``) within ``timeout_s``;
4. reward = |passed ∩ ``expected``| / |``expected``|: a test that fails,
   errors, does not import (a syntax error, a deleted module) or had not
   finished when the run was killed counts as not passed.

A workspace holding none of the repository's files (``sources`` and tests:
setup never ran) has no evaluable work: ``None``. A runner that never started
(no results file) is an ``EvaluatorFailure`` (retried on the same state).
The result is bound to ``artifact_version`` of the workspace, taken before
the run. Pure in the workspace's files: the timeout exists for
non-terminating code (tiny tests finish in milliseconds), so the same files
give the same result.

``build_tasks()`` turns ``repair_repos.REPOS`` into JSONL task lines (the
bugs planted, the reference fix in ``meta``); ``python -m
gyre.real.harness.repair --write configs/tasks/repair.jsonl`` regenerates the
shipped task set.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path, PurePosixPath

from gyre.real.harness.repair_repos import REPOS, Repo
from gyre.real.harness.tasks import EvaluatorFailure, preserved_binding
from gyre.real.harness.taskset import path_problem
from gyre.trajectory.evaluation import EvaluationResult

RUNNER = Path(__file__).with_name("repair_runner.py")
EVALUATOR = "gyre.real.harness.repair:RepairEvaluator"


class RepairEvaluator:
    """Scores a repair task's workspace by running its tests (see the module docstring)."""

    def __init__(self, tests: dict[str, str], expected: list[str], sources: list[str] = (),
                 timeout_s: float = 60.0, runner: str | os.PathLike = RUNNER) -> None:
        if not isinstance(tests, dict) or not tests or not all(isinstance(v, str) for v in tests.values()):
            raise ValueError("tests must map test file paths to their text")
        for path in [*tests, *sources]:
            problem = path_problem(path)
            if problem:
                raise ValueError(f"path {problem}")
        if not isinstance(expected, list) or not expected or len(set(expected)) != len(expected):
            raise ValueError("expected must be a non-empty list of distinct test ids")
        stems = {PurePosixPath(p).stem for p in tests}
        stray = [t for t in expected if not isinstance(t, str) or t.split(".")[0] not in stems]
        if stray:
            raise ValueError(f"expected test ids {stray} name no test file of {sorted(tests)}")
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise ValueError(f"timeout_s must be > 0, not {timeout_s!r}")
        self.tests, self.expected, self.sources, self.timeout_s = dict(tests), list(expected), list(sources), timeout_s
        self.runner = Path(runner)  # the script that runs the tests and writes their outcomes

    def outcomes(self, workspace: Path) -> dict[str, str]:
        """Each test id the run reported, with its outcome (tests that never reported are absent)."""
        with tempfile.TemporaryDirectory(prefix="gyre-repair-") as scratch:
            root, out = Path(scratch) / "repo", Path(scratch) / "results.json"
            shutil.copytree(workspace, root, symlinks=True)
            for name, text in self.tests.items():
                target = root / name
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target)
                elif target.is_symlink():
                    target.unlink()
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
            env = {"PATH": os.environ.get("PATH", ""), "LANG": "C.UTF-8", "PYTHONHASHSEED": "0",
                   "PYTHONDONTWRITEBYTECODE": "1", "HOME": scratch}
            argv = [sys.executable, "-I", "-B", str(self.runner), str(root), str(out), *self.tests]
            try:
                subprocess.run(argv, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=self.timeout_s, start_new_session=True)
            except subprocess.TimeoutExpired:
                pass  # tests that had not finished count as not passed
            except OSError as exc:
                raise EvaluatorFailure(f"could not start the test runner: {exc}") from exc
            try:
                return json.loads(out.read_text())
            except (OSError, ValueError) as exc:
                raise EvaluatorFailure(f"the test runner left no results: {exc}") from exc

    def evaluate(self, execution_id: str, workspace: Path) -> EvaluationResult | None:
        workspace = Path(workspace)
        if not any((workspace / p).exists() for p in [*self.sources, *self.tests]):
            return None
        binding = preserved_binding(execution_id, workspace)
        outcomes = self.outcomes(workspace)
        passed = sum(outcomes.get(test) == "pass" for test in self.expected)
        return EvaluationResult(binding, passed / len(self.expected), True)


def test_ids(path: str, text: str) -> list[str]:
    """``stem.Class.test`` for every ``test*`` method of every class of a test file (source order)."""
    stem = PurePosixPath(path).stem
    return [f"{stem}.{node.name}.{item.name}" for node in ast.parse(text).body if isinstance(node, ast.ClassDef)
            for item in node.body if isinstance(item, ast.FunctionDef) and item.name.startswith("test")]


def planted(repo: Repo, fixed: int = 0) -> dict[str, str]:
    """The repository's sources with its bugs planted, except the first ``fixed`` of them."""
    files = dict(repo.sources)
    for bug in repo.bugs[fixed:]:
        if files[bug.path].count(bug.correct) != 1:
            raise ValueError(f"{repo.name}: snippet {bug.correct!r} is not exactly once in {bug.path}")
        files[bug.path] = files[bug.path].replace(bug.correct, bug.buggy)
        if files[bug.path].count(bug.buggy) != 1:
            raise ValueError(f"{repo.name}: buggy text {bug.buggy!r} is not exactly once in {bug.path}")
    return files


def build_tasks(timeout_s: float = 60.0) -> list[dict]:
    """The repair task set, one JSON-able task per repository of ``REPOS``."""
    tasks = []
    for repo in REPOS:
        expected = [t for path, text in repo.tests.items() for t in test_ids(path, text)]
        prompt = (f"The Python package `{repo.name}` in the current directory has a bug: {repo.symptom}. "
                  f"Fix the package so that every test in tests/ passes; do not edit the tests. "
                  f"Run them with: python -m unittest discover -s tests")
        tasks.append({
            "id": f"repair-{repo.name}", "prompt": prompt,
            "workspace": {"files": {**planted(repo), **repo.tests}},
            "evaluator_args": {"tests": repo.tests, "expected": expected, "sources": sorted(repo.sources),
                               "timeout_s": timeout_s},
            "meta": {"fix": [{"path": b.path, "old": b.buggy, "new": b.correct} for b in repo.bugs],
                     "breaks": [list(b.breaks) for b in repo.bugs]},
        })
    return tasks


def jsonl(tasks: list[dict]) -> str:
    return "".join(json.dumps(task, sort_keys=True) + "\n" for task in tasks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gyre.real.harness.repair")
    parser.add_argument("--write", required=True, help="where to write the task set (JSONL)")
    args = parser.parse_args(argv)
    Path(args.write).parent.mkdir(parents=True, exist_ok=True)
    Path(args.write).write_text(jsonl(build_tasks()))
    print(f"wrote {len(REPOS)} repair tasks to {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
