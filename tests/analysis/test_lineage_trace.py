"""A resumed run's trace as its lineage lived it (``gyre.analysis.lineage_trace``).

``data/cpu_demo_resumed`` is the CI run of the two-node demo (tests/real/runtime/
test_runtime_cluster_e2e.py) that was killed once with 14 harnesses running and
resumed at version 2 (``attempts/1/resume.json`` names them in ``work_kept_s``):
its event log, trace with sidecar, the resume's record and the costs its own
calibration wrote. Checked: only the executions a resume record names change,
each to its span in the final event log (harness_s, when present, shortened by
the same amount and kept within [0, duration]); every other cell is copied; a run
never resumed is simulated on its own trace; and the step after the resume,
which the true durations had the simulator wait ~9 s for, is predicted within a
second of the real one.
"""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from gyre.analysis.lineage_trace import kept_across_resumes, lineage_spans, lineage_trace
from gyre.analysis.sim_vs_real import compare_run
from gyre.sim.cost_file import load_cost_file

DATA = Path(__file__).parent / "data"
RESUMED = DATA / "cpu_demo_resumed"


def rows(path: Path) -> dict[tuple[int, int], dict[str, str]]:
    with open(path, newline="") as fh:
        return {(int(r["query_id"]), int(r["execution_index"])): r for r in csv.DictReader(fh)}


def test_only_kept_executions_take_their_lineage_span(tmp_path):
    kept = kept_across_resumes(RESUMED)
    assert kept == set(range(24, 38))  # the record's work_kept_s
    spans = lineage_spans(RESUMED)
    out = lineage_trace(RESUMED, tmp_path)
    assert out.parent == tmp_path and (tmp_path / "trace.json").read_text() == (RESUMED / "trace.json").read_text()
    before, after = rows(RESUMED / "trace.csv"), rows(out)
    assert before.keys() == after.keys()
    for (g, i), row in before.items():
        x = g * 4 + i
        if x in kept:
            assert float(after[g, i]["duration_s"]) == spans[x] < float(row["duration_s"])
            assert {k: v for k, v in after[g, i].items() if k != "duration_s"} == \
                {k: v for k, v in row.items() if k != "duration_s"}
        else:
            assert after[g, i] == row


def test_harness_time_loses_what_the_duration_lost(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RESUMED, run)
    table = rows(run / "trace.csv")
    for r in table.values():  # each execution's harness stopped 0.5 s before its end (evaluation after it)
        r["harness_s"] = repr(float(r["duration_s"]) - 0.5)
    columns = list(next(iter(table.values())))
    with open(run / "trace.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(table.values())
    (tmp_path / "out").mkdir()
    after = rows(lineage_trace(run, tmp_path / "out"))
    for (g, i), r in after.items():
        duration, harness = float(r["duration_s"]), float(r["harness_s"])
        assert 0.0 <= harness <= duration
        if g * 4 + i in kept_across_resumes(run):
            assert harness == pytest.approx(max(0.0, duration - 0.5))
        else:
            assert r == table[g, i]


def test_a_run_never_resumed_is_simulated_on_its_own_trace(tmp_path):
    run = DATA / "cpu_demo" / "seed-0"
    assert kept_across_resumes(run) == set()
    assert lineage_trace(run, tmp_path) == run / "trace.csv" and list(tmp_path.iterdir()) == []


def test_the_step_after_the_resume_is_predicted_from_the_lineage(tmp_path):
    costs = load_cost_file(RESUMED / "costs.toml")
    unresumed = tmp_path / "as-recorded"  # the same files, the resume's record left out: the true durations
    shutil.copytree(RESUMED, unresumed, ignore=shutil.ignore_patterns("attempts"))
    lineage, recorded = compare_run(RESUMED, costs), compare_run(unresumed, costs)
    after = {r.version: r for r in lineage.rows}[3]  # the first step whose groups the kept harnesses fed
    before = {r.version: r for r in recorded.rows}[3]
    assert abs(after.sim_wall_s - after.real_wall_s) < 1.0 < 5.0 < before.sim_wall_s - before.real_wall_s
    assert lineage.step_error < recorded.step_error and abs(lineage.total_error) < abs(recorded.total_error)


@pytest.mark.parametrize("content, named", [("{", "not a readable resume record"), ("[1, 2]", "a JSON object"),
                                            ('{"reattached": ["x1"]}', "reattached must list execution ids"),
                                            ('{"work_kept_s": 3}', "work_kept_s must list execution ids")])
def test_a_damaged_resume_record_is_named(tmp_path, content, named):
    run = tmp_path / "run"
    shutil.copytree(RESUMED, run)
    (run / "attempts" / "1" / "resume.json").write_text(content)
    with pytest.raises(ValueError, match=named) as err:
        lineage_trace(run, tmp_path)
    assert str(run / "attempts" / "1" / "resume.json") in str(err.value)
