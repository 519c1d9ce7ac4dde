"""The evaluator interface and the preserved artifact state it scores (docs/trajectories.md#evaluation-and-outcomes).

An evaluator scores the *preserved* workspace of a closed execution, also
after a harness timeout, and returns a result bound to (execution, artifact
version, branch reference): the artifact version is a content hash of the
workspace, so a later evaluation of a changed workspace can never be mistaken
for, or overwrite, an earlier one. Rewards never come from elapsed time,
length or termination status.

An evaluator returns ``None`` for a workspace with no evaluable work (a
total failure: the group gets a zero-reward placeholder) and raises
``EvaluatorFailure`` when it cannot score preserved work (the evaluation
stays pending and may be retried). The built-in toy tasks live in
``gyre.real.toy.tasks``.

Invariant: an evaluator's ``evaluate`` is a pure function of the workspace's files.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Protocol

from gyre.trajectory.evaluation import EvaluationBinding, EvaluationResult


class EvaluatorFailure(RuntimeError):
    """The evaluator could not score preserved work (retry on the same state)."""


class Evaluator(Protocol):
    def evaluate(self, execution_id: str, workspace: Path) -> EvaluationResult | None:
        """A result bound to the workspace's state, or None when there is no evaluable work."""


def artifact_version(workspace: Path) -> str:
    """Content hash of every file under ``workspace`` (names and bytes, sorted)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in workspace.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(workspace)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def preserved_binding(execution_id: str, workspace: Path, branch: str = "main") -> EvaluationBinding:
    """The preserved artifact state of an execution: its workspace's content hash on ``branch``."""
    return EvaluationBinding(execution_id, artifact_version(workspace), branch)
