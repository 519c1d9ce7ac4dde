"""The role time line read off an event log equals what the simulator recorded while it ran.

``gyre.analysis.role_timeline`` knows nothing of the simulator: it replays the
log through a fresh core. The simulator's own tables (roles.csv, steps.csv)
are written by a different path (its driver, as actions are applied), so
agreement checks both; the real run is read by the same function.
"""

from __future__ import annotations

import pytest

from gyre.analysis.role_timeline import Span, Timeline, timeline
from gyre.sim.runner import run_simulation


@pytest.mark.parametrize("preset", ["gyre-1", "colocate", "async"])
def test_timeline_from_log_matches_the_simulators_tables(preset):
    result = run_simulation(preset, "nl2repo-122b", steps=4)
    tl = timeline(result.cfg, result.record.log.events())
    recorded = sorted((r["cell"], r["start_s"], r["end_s"], r["role"]) for r in result.record.roles)
    read = sorted((c, s.start_s, s.end_s, s.label) for c, spans in tl.roles.items() for s in spans
                  if s.end_s > s.start_s or s.label != "rollout")
    assert [(c, role) for c, _, _, role in read] == [(c, role) for c, _, _, role in recorded]
    for (_, s0, e0, _), (_, s1, e1, _) in zip(read, recorded):
        assert s0 == pytest.approx(s1, abs=1e-6) and e0 == pytest.approx(e1, abs=1e-6)
    for row in result.record.step_rows():
        span = tl.steps[row["step"]]
        assert span.start_s == pytest.approx(row["start_s"], abs=1e-6)
        assert span.end_s == pytest.approx(row["end_s"], abs=1e-6)
        assert len(tl.training_cells(row["step"])) >= row["training_cells_max"]


def test_each_cells_spans_are_contiguous_and_cover_the_run():
    result = run_simulation("gyre-1", "nl2repo-122b", steps=4)
    tl = timeline(result.cfg, result.record.log.events())
    for spans in tl.roles.values():
        assert spans[0].start_s == 0.0 and spans[-1].end_s == tl.end_s
        assert all(a.end_s == b.start_s and a.label != b.label for a, b in zip(spans, spans[1:]))


def test_training_cells_counts_a_satellite_that_joined_mid_step():
    tl = Timeline(roles={0: [Span(0, 10, "training")],
                         1: [Span(0, 5, "rollout"), Span(5, 6, "to_training"), Span(6, 10, "training")],
                         2: [Span(0, 10, "rollout")]},
                  steps={0: Span(1, 4, "step 0"), 1: Span(4, 8, "step 1")})
    assert tl.training_cells(0) == (0,)
    assert tl.training_cells(1) == (0, 1)
    assert tl.step_durations() == {0: 4, 1: 4}
