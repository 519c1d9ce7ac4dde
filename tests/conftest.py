"""Shared test set-up: the two tiers and their Hypothesis budgets.

- ``make check`` sets ``GYRE_TEST_TIER=check``: the pure core, simulator,
  analysis, pure trajectory and proxy request-parsing tests with a small,
  fixed-seed Hypothesis budget, under a minute on a 2-core machine with only the base environment.
- ``make test`` (CI) runs every test with the full budget.

Tests that set their own example counts scale them through
``hypothesis_budget.examples(n)``, so both tiers keep their proportions.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

TIER = os.environ.get("GYRE_TEST_TIER", "full")
if TIER not in ("check", "full"):
    raise RuntimeError(f"GYRE_TEST_TIER must be 'check' or 'full', got {TIER!r}")

settings.register_profile("check", max_examples=25, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("full", deadline=None)
settings.load_profile(TIER)
