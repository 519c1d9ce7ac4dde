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


# ``make test`` runs two xdist workers (``--dist loadgroup``). Every test that runs a whole ``gyre run`` (or a
# Ray cluster) is in one group, so they run one after another on one worker and never share the two cores
# with each other (their timing checks, e.g. the simulator's prediction, assume that); everything else is
# spread over both workers.
WHOLE_RUNS = ("test_runtime_e2e.py", "test_runtime_e2e_engine_death.py", "test_runtime_cluster_e2e.py",
              "test_runtime_resume_e2e.py", "test_runtime_cell_failure_e2e.py", "test_runtime_job_checkpoint.py",
              "test_runtime_tp2.py", "test_runtime_metrics_run.py", "test_runtime_engine_restart.py")


def pytest_collection_modifyitems(config, items):
    import pytest

    for item in items:
        if item.path.name in WHOLE_RUNS:
            item.add_marker(pytest.mark.xdist_group("whole-runs"))
