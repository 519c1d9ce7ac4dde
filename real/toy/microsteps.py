"""Seeded toy micro-steps for the training plane's tests and benchmark (no harness, no engine).

Each execution is one row of random token ids whose last ``targets`` positions
are trainable; rows carry the invariants of ``gyre.trajectory.rows``
(``weight = 1 / L_i``, ``execution_targets = L_i``, behaviour log-probabilities
only at targets) and each micro-step holds whole executions, as the stream
packer emits them. Everything random comes from the generator seeded by
``seed``: the same seed gives the same rows whatever ``batch_id`` is, so a
batch can be replayed under another id (a reference run on the same data).
"""

from __future__ import annotations

import time

import numpy as np

from gyre.trajectory.packing import MicroStep
from gyre.trajectory.rows import TokenRow


def toy_row(rng: np.random.Generator, execution_id: str, *, length: int, targets: int, vocab: int,
            advantage: float | None, behavior_logprob: float | None) -> TokenRow:
    if not 0 < targets < length:
        raise ValueError(f"need 0 < targets < length, got targets={targets}, length={length}")
    ids = rng.integers(1, vocab, size=length, dtype=np.int64).astype(np.int32)
    mask = np.zeros(length, dtype=bool)
    mask[length - targets:] = True
    behavior = np.zeros(length, dtype=np.float64)
    if behavior_logprob is None:
        behavior[mask] = np.log(1.0 / vocab) + rng.normal(0.0, 0.002, size=targets)
    else:
        behavior[mask] = behavior_logprob
    adv = float(rng.normal()) if advantage is None else float(advantage)
    return TokenRow(execution_id=execution_id, group_id=execution_id.rsplit("-", 1)[0], leaf=0,
                    input_ids=ids, target_mask=mask, behavior_logprobs=behavior, advantage=adv,
                    weight=1.0 / targets, execution_targets=targets)


def toy_batch(seed: int, batch_id: int, microsteps: int, *, rows_per_microstep: int = 2, length: int = 24,
              targets: int = 12, vocab: int = 256, advantage: float | None = None,
              behavior_logprob: float | None = None) -> list[MicroStep]:
    """``microsteps`` micro-steps of ``rows_per_microstep`` executions each; B*N = all executions."""
    if microsteps < 1 or rows_per_microstep < 1:
        raise ValueError("microsteps and rows_per_microstep must be positive")
    rng = np.random.default_rng(seed)
    executions = microsteps * rows_per_microstep
    steps = []
    for m in range(microsteps):
        rows = tuple(toy_row(rng, f"s{seed}-g{m}-x{r}", length=length, targets=targets, vocab=vocab,
                             advantage=advantage, behavior_logprob=behavior_logprob)
                     for r in range(rows_per_microstep))
        steps.append(MicroStep(batch_id, m, rows, executions))
    return steps


def feed(queues, steps: list[MicroStep], *, close: bool = True) -> None:
    """Put micro-steps into their batch queues (and close the batch)."""
    for step in steps:
        queues.put(step)
    if close and steps:
        queues.close_batch(steps[0].batch_id, len(steps))


def wait_claimed(queues, batch_id: int, count: int, timeout: float = 30.0) -> None:
    """Block until ``count`` micro-steps of ``batch_id`` have been claimed (a step is in flight)."""
    deadline = time.monotonic() + timeout
    while len(queues.queue(batch_id).claims()) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"fewer than {count} micro-steps of batch {batch_id} claimed after {timeout} s")
        time.sleep(0.002)
