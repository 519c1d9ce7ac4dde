"""Built-in toy tasks with computable rewards, for the CPU demo and the tests.

``EmitCharTask`` (the CPU demo's): the reward is the share of non-space
characters of ``answer.txt`` equal to a target character. ``EmitTokenTask``:
the reward is the share of whitespace-separated words in ``answer.txt`` equal
to a target word (partial credit, easy to learn: a policy raises it by
emitting the target more often). A workspace without ``answer.txt`` is a
total failure with no evaluable work (``None``: the group gets a zero-reward
placeholder); an unreadable one is an evaluator failure (``EvaluatorFailure``:
stays pending and may be retried).

Invariant: ``evaluate`` is a pure function of the workspace's files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gyre.real.harness.runner import Task
from gyre.real.harness.tasks import EvaluatorFailure, preserved_binding
from gyre.trajectory.evaluation import EvaluationResult


@dataclass(frozen=True)
class EmitTokenTask:
    target: str = "gyre"
    answer_file: str = "answer.txt"

    def task(self, task_id: str) -> Task:
        return Task(task_id=task_id, prompt=f"Reply with the word {self.target!r} as often as you can.")

    def evaluate(self, execution_id: str, workspace: Path) -> EvaluationResult | None:
        answer = workspace / self.answer_file
        if not answer.exists():
            return None
        try:
            words = answer.read_text().split()
        except (OSError, UnicodeDecodeError) as exc:
            raise EvaluatorFailure(f"{answer}: {exc}") from exc
        score = sum(w.strip(".,!?'\"") == self.target for w in words) / len(words) if words else 0.0
        return EvaluationResult(preserved_binding(execution_id, workspace), score, True)


@dataclass(frozen=True)
class EmitCharTask:
    """Toy task: reward = share of non-space characters of ``answer.txt`` equal to ``target``.

    A one-character target (a single byte-level token of the tiny tokenizer)
    gives a reward with spread even under a random policy, so group-relative
    advantages are non-zero from the first step (emit-token on whole words is
    ~0 everywhere for a random 1k-token policy). Pure function of the workspace.
    """

    target: str = "e"

    def task(self, task_id: str) -> Task:
        return Task(task_id=task_id, prompt=f"Write the letter {self.target} many times.")

    def evaluate(self, execution_id: str, workspace: Path) -> EvaluationResult | None:
        answer = workspace / "answer.txt"
        if not answer.exists():
            return None
        score = char_share(answer.read_text(errors="replace"), self.target)
        return EvaluationResult(preserved_binding(execution_id, workspace), score, True)


def char_share(text: str, target: str) -> float:
    """The share of ``text``'s non-space characters equal to ``target`` (0 for no such character)."""
    chars = [c for c in text if not c.isspace()]
    return sum(c == target for c in chars) / len(chars) if chars else 0.0
