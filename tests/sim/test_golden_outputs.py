"""Speed-ups change no simulated byte: a fixed set of simulations hashes to digests recorded before them.

The simulator is made faster (issue 31 item 4) without changing its physics, so
every table it writes, its summary and the actions of the policy core must stay
bit for bit what the code gave before. The digests below were recorded from the
code *before* the speed-ups (commit "golden digests"), over presets that cover
every driver path: elastic cells (streaming on and off), a colocated block with
and without a separate pool, a global switch, static splits, oversampled
surplus cancellations, reroutes, harness timeouts at the ceiling, evaluation
tails (the DeepSWE trace has a ``harness_s`` column) and sweep runs (no
wall-clock breakdown).

A change that is *meant* to change simulated results (a new cost model, a new
micro-step rule) re-records them: run this file with ``GYRE_RECORD_GOLDEN=1``
and paste the printed table over ``GOLDEN``, in a commit that says why.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from gyre.sim import runner

STEPS = 3  # one E0 burst; two cases run 12 steps (make run's E0, and E1's single-step bursts)
#: id -> (preset, trace, seed, overrides, breakdown)
CASES: dict[str, tuple[str, str, int, dict[str, Any], bool]] = {
    "E0-12-steps-s0": ("E0", "nl2repo-122b", 0, {}, True),
    "E1-12-steps-s4": ("E1", "nl2repo-122b", 4, {}, True),
    "E0-s0": ("E0", "nl2repo-122b", 0, {}, True),
    "E0-streaming-off-s1": ("E0", "nl2repo-122b", 1, {"streaming": False}, True),
    "E2-s2": ("E2", "nl2repo-122b", 2, {}, True),
    "C1-s0": ("C1", "nl2repo-122b", 0, {}, True),
    "C2-s3": ("C2", "nl2repo-122b", 3, {}, True),
    "C0-global-s1": ("C0", "nl2repo-122b", 1, {}, True),
    "A0-s2": ("A0", "nl2repo-122b", 2, {}, True),
    "A3-oversample-s0": ("A3", "nl2repo-122b", 0, {"oversample": 2}, True),
    "gyre-1-deepswe-s0": ("gyre-1", "deepswe", 0, {}, True),
    "sweep-E0-K8-phi1-mu2-s0": ("E0", "nl2repo-122b", 0, {"K": 8, "phi": 1.0, "mu": 2}, False),
}

GOLDEN: dict[str, str] = {
    "E0-12-steps-s0": "e0157e1b1ae450135131a49bdc6e16355ca18a0459d8d390d13a52f164db214e",
    "E1-12-steps-s4": "fb34a593102f3b1becc5a5f78c930524470acedf98087f783e64316e4de29a9b",
    "E0-s0": "6fef0b178e88f3d386945ed943c614a37fcd36ae662528eace0e1b823d5be31f",
    "E0-streaming-off-s1": "64950e61f230f4dd3fc220df6776f4fef7b7da2ea15d052fb0119e8bd5179138",
    "E2-s2": "0ed5a06a2c4a656bde38004f724ed36e926598ba8b7f6590882d428758a52c9b",
    "C1-s0": "893966f949ae8741ea4c4a4c98b084c1c4c54915194ff223f568aacfe0c634f1",
    "C2-s3": "db38d6e42feac322bb7dcc30492eac1d93751904cf0cacc0319c7f5d22aef2a9",
    "C0-global-s1": "d667359df328d38283137fb1c28c102afa0895c442231ff2c4b7e499bd667b48",
    "A0-s2": "588e58eaebc027961c004fc71a21eb1b3c7a9958c4957fc62627e40da28f12c7",
    "A3-oversample-s0": "ba5eb01c17a07e0ec3757248b598743ff05d59e1560553ee466679a9bbd02b93",
    "gyre-1-deepswe-s0": "7e5acc5183813a8889eec97fa52445139b8de4dad9062f13f586ee6f43dbe2ac",
    "sweep-E0-K8-phi1-mu2-s0": "193dbb7e6bb3218ce614851fa35dcf3ce7ee80ac118d1ae48169068aad2d2a9a",
}


def _digest(case: str, out: Path) -> str:
    """One sha256 over every table, the summary (less its wall time) and the core's actions."""
    preset, trace, seed, overrides, breakdown = CASES[case]
    steps = 12 if "12-steps" in case else STEPS
    result = runner.run_simulation(preset, trace, steps=steps, seed=seed, overrides=overrides,
                                   breakdown=breakdown)
    result.write(out)
    h = hashlib.sha256()
    for path in sorted(out.glob("*.csv")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    summary = {k: v for k, v in result.summary.items() if k != "wall_seconds"}
    h.update(json.dumps(summary, sort_keys=True, default=str).encode())
    h.update(json.dumps(result.record.log.actions).encode())
    return h.hexdigest()


def test_record_golden(tmp_path):
    """With GYRE_RECORD_GOLDEN=1: print the digests of the current code as the GOLDEN table."""
    if not os.environ.get("GYRE_RECORD_GOLDEN"):
        pytest.skip("set GYRE_RECORD_GOLDEN=1 to print new digests")
    lines = [f'    "{case}": "{_digest(case, tmp_path / case)}",' for case in CASES]
    print("\nGOLDEN: dict[str, str] = {\n" + "\n".join(lines) + "\n}")


@pytest.mark.parametrize("case", list(CASES))
def test_outputs_hash_to_the_digests_recorded_before_the_speed_ups(case, tmp_path):
    assert _digest(case, tmp_path) == GOLDEN[case], f"{case}: simulated outputs changed"
