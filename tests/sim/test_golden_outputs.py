"""Speed-ups change no simulated byte: a fixed set of simulations hashes to digests recorded before them.

The simulator is made faster (issue 31 item 4) without changing its physics, so
every table it writes, its summary and the actions of the policy core must stay
bit for bit what the code gave before. The digests were first recorded from the
code *before* the speed-ups (commit "golden digests") and re-recorded once, when
the shared micro-step rule (gyre.driver_rules.pack_micro_steps) changed the
physics on purpose, before any later speed-up; they cover presets that cover
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
    "E0-12-steps-s0": "fc296bf9814d160e1eaacbf229b90169c1ba1b19ed5544746c8bfb4347e02ea8",
    "E1-12-steps-s4": "365ded0625531af7944165d7fe6e224759948c62589676905b169e7095803c3f",
    "E0-s0": "49c3951d0742f34361f7925233e248a9bda8cb801a4954cc59e9910b2b8c28ec",
    "E0-streaming-off-s1": "b5d992477c3f2b36e4842e166ab029db2fa23e14aead9f3acd2a641305b26549",
    "E2-s2": "1af9e058c44b048bb08af231137f812c93e7759b0cc1dc463ae0ef2f4a9d3d27",
    "C1-s0": "3f7bbf09124cfaf62b8a4d0eca8aa2d9fa67e0b02e78ca82b9309e4b3d69f83e",
    "C2-s3": "fc7a0d65c1708249f33b07a0e51fa2914bdedfe20a0402bb6a36f56cb6b501da",
    "C0-global-s1": "43e5df8ee5fe0697ea2b1450d1bc5aa1565ef97a0e00223c332f855bfd860506",
    "A0-s2": "976949e23385ecc991c96a0f91511e7d0310c5704c44a09059f00d31409899a5",
    "A3-oversample-s0": "2aa7d64df9e88127d34ede2d4275d8d5ac5e5aa49fe108223b9f67d2a93a9eaa",
    "gyre-1-deepswe-s0": "e4a917ea5dddc23027deae0b56ea923b91fbab27328e53a972f331ea061042b3",
    "sweep-E0-K8-phi1-mu2-s0": "9f1034084c27c7830b6769678af7e737b0d06913393a276abd74ed29eba6b1ba",
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
