"""``gyre plan``: the space, refusals, the SQLite study (resume, extend, determinism), front and recommendation.

Small budgets on short runs (3 steps, 2 trace seeds) keep this in the fast
tier; the invariants are the ones ``gyre.sim.plan``'s modules state.
"""

from __future__ import annotations

import csv
import json
import sys
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples

from gyre.cli import main
from gyre.config import SchedulerConfig
from gyre.sim.plan.evaluate import Workload, baseline, serial_map
from gyre.sim.plan.plan import local_mapper, run_plan
from gyre.sim.plan.report import pareto_front, recommend
from gyre.sim.plan.space import Cluster, Refused, SearchSpace, cells_key, points, schedule_of
from gyre.sim.plan.study import PlanRequest, TrialRecord, open_study, run_study

CLUSTER = Cluster(nodes=16, cell_sizes=(2, 4), per_node=36, N=16, B=32)
SMALL = SearchSpace(phi=(0.0, 0.3, 0.5, 1.0), mu=(1, 2, 3), rho_min=(0.5,), tau=(30.0,), streaming=(True, False),
                    granularity=("fine", "global"))
WORKLOAD = Workload(trace="nl2repo-122b", steps=3, seeds=(0, 1))


def request(**changes) -> PlanRequest:
    base = dict(workload=WORKLOAD, cluster=CLUSTER, space=SMALL, target_mean=1.0, seed=3, batch=3, startup=4)
    return PlanRequest(**{**base, **changes})


class CountingMapper:
    def __init__(self) -> None:
        self.jobs = 0

    def __call__(self, fn, items):
        self.jobs += len(items)
        return serial_map(fn, items)


@settings(max_examples=examples(200), deadline=None)
@given(nodes=st.integers(1, 40), sizes=st.sets(st.integers(1, 12), min_size=1, max_size=3),
       size_pick=st.integers(0, 2), cells=st.integers(1, 40), phi=st.sampled_from([0.0, 0.3, 0.5, 1.25]),
       B=st.sampled_from([10, 32, 48]))
def test_schedule_of_accounts_for_every_node_or_says_why_not(nodes, sizes, size_pick, cells, phi, B):
    sizes = tuple(sorted(s for s in sizes if s <= nodes)) or (nodes,)
    cluster = Cluster(nodes=nodes, cell_sizes=sizes, per_node=8, N=4, B=B)
    size = sizes[size_pick % len(sizes)]
    point = {"nodes_per_cell": size, cells_key(size): cells, "phi": phi, "mu": 2, "rho_min": 0.5, "tau": 0.0,
             "streaming": True, "granularity": "fine"}
    try:
        schedule = schedule_of(cluster, point)
    except Refused as exc:
        assert (size * cells > nodes and "does not fit" in str(exc)) or (
            abs(phi * B - round(phi * B)) > 1e-9 and "phi * B" in str(exc)), str(exc)
        return
    cfg = SchedulerConfig(**schedule)
    assert cfg.K * size <= nodes and cfg.C_e == size * 8
    assert cfg.C_s == (nodes - cfg.K * size) * 8  # every node not in a cell rolls out in the pool


def test_points_enumerate_each_candidate_once_with_the_right_cell_count_key():
    pts = list(points(SMALL, CLUSTER))
    assert len(pts) == (8 + 4) * 4 * 3 * 2 * 2
    assert len({json.dumps(p, sort_keys=True) for p in pts}) == len(pts)
    assert all(set(p) & {"cells@2", "cells@4"} == {cells_key(p["nodes_per_cell"])} for p in pts)


def test_baselines_at_the_target_follow_the_identity_or_are_refused():
    a = baseline(CLUSTER, "async", 1.5, 4)
    c = baseline(CLUSTER, "colocate", 1.5, 4)
    assert (a["phi"], a["mu"], a["granularity"]) == (1.5, 1, "none")
    assert (c["phi"], c["mu"], c["granularity"]) == (0.0, 4, "global")
    with pytest.raises(Refused, match="2 E\\[d\\] \\+ 1 = 3.5"):
        baseline(CLUSTER, "colocate", 1.25, 4)


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan")
    return out, run_plan(request(), out, 10, serial_map)


def test_refused_corners_are_recorded_and_the_budget_still_fills(plan):
    out, result = plan
    assert len(result.trials) == 10
    refused = [t for t in result.trials if t.refused]
    assert refused and all("phi * B" in t.refused for t in refused)  # phi = 0.3: 9.6 groups
    rows = list(csv.DictReader(open(out / "trials.csv")))
    assert len(rows) == 10 and sum(bool(r["refused"]) for r in rows) == len(refused)


def test_front_is_exactly_the_non_dominated_schedules_and_the_pick_is_the_fastest_feasible(plan):
    _, result = plan
    done = [t for t in result.trials if t.values is not None]
    front = {tuple(t.values) for t in result.front}
    assert front
    for t in done:
        beaten = any(all(x <= y for x, y in zip(o.values, t.values)) and o.values != t.values for o in done)
        assert (tuple(t.values) in front) == (not beaten)
    feasible = [t for t in done if t.values[1] <= 1.0 + 1e-9]
    assert result.best is not None and result.best.values[1] <= 1.0 + 1e-9
    assert result.best.values[0] == min(t.values[0] for t in feasible)
    assert recommend(result.trials) is result.best and pareto_front(result.trials) == result.front


def test_recommendation_and_job_file_describe_the_same_schedule(plan):
    out, result = plan
    rec = json.loads((out / "recommendation.json").read_text())["recommendation"]
    assert rec["schedule"] == result.best.schedule and len(rec["seeds"]) == 2
    assert rec["time_h_min"] <= rec["time_h"] <= rec["time_h_max"]
    job = tomllib.loads((out / "job.toml").read_text())
    schedule = result.best.schedule
    assert job["job"]["nodes"] == schedule["K"] and job["job"]["steps"] % schedule["mu"] == 0
    assert {k: job["job"]["schedule"][k] for k in job["job"]["schedule"]} == {
        k: schedule[k] for k in job["job"]["schedule"]}
    baselines = list(csv.DictReader(open(out / "baselines.csv")))
    assert [r["method"] for r in baselines] == ["plan", "async", "colocate"]
    assert (out / "pareto.csv").exists()


@pytest.mark.slow  # five SQLite studies and a process pool: ~3 s of CPU
def test_a_study_resumes_extends_and_is_deterministic(tmp_path):
    req = request()
    mapper = CountingMapper()
    first = run_study(req, tmp_path / "a.db", 5, mapper)
    assert len(first) == 5 and mapper.jobs > 0
    again = CountingMapper()
    assert run_study(req, tmp_path / "a.db", 5, again) == first and again.jobs == 0  # nothing left to do
    extended = run_study(req, tmp_path / "a.db", 8, CountingMapper())
    assert len(extended) == 8 and extended[:5] == first
    fresh = run_study(req, tmp_path / "b.db", 5, CountingMapper())
    assert [(t.point, t.values) for t in fresh] == [(t.point, t.values) for t in first]
    with local_mapper(2) as pool:
        parallel = run_study(req, tmp_path / "c.db", 5, pool)
    assert [(t.point, t.values) for t in parallel] == [(t.point, t.values) for t in first]


def test_an_interrupted_trial_is_marked_and_not_counted(tmp_path):
    req = request()
    run_study(req, tmp_path / "a.db", 3, serial_map)
    study = open_study(req, tmp_path / "a.db")
    study.ask()  # a process killed while this candidate ran
    trials = run_study(req, tmp_path / "a.db", 5, serial_map)
    interrupted = [t for t in trials if t.refused == "interrupted"]
    assert len(interrupted) == 1 and len(trials) == 6  # 5 counted + the interrupted one
    assert sum(t.refused != "interrupted" for t in trials) == 5


def test_a_study_for_another_request_is_not_resumed(tmp_path):
    run_study(request(), tmp_path / "a.db", 2, serial_map)
    with pytest.raises(ValueError, match="another request"):
        run_study(request(target_mean=1.5), tmp_path / "a.db", 4, serial_map)


def test_cli_refuses_bad_arguments_with_a_reason(tmp_path, capsys):
    assert main(["plan", "--fix", "bogus=1", "--out", str(tmp_path / "x")]) == 2
    assert "unknown field 'bogus'" in capsys.readouterr().err
    assert main(["plan", "--fix", "K=4", "--out", str(tmp_path / "y")]) == 2
    assert "only searched fields" in capsys.readouterr().err
    assert main(["plan", "--cell-sizes", "64", "--nodes", "32", "--out", str(tmp_path / "z")]) == 2
    assert "exceed" in capsys.readouterr().err
    assert not Path(tmp_path / "z" / "plan.db").exists()


def test_ray_flags_without_ray_fail_with_one_clear_error_and_run_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # "import ray" raises ImportError, as where Ray is absent
    assert main(["plan", "--ray", "auto", "--budget", "4", "--out", str(tmp_path / "p")]) == 2
    assert "gyre plan: error: --ray needs Ray" in capsys.readouterr().err
    assert not (tmp_path / "p" / "trials.csv").exists()
    assert main(["sweep", "--sweep", "phi=0,0.5", "--ray", "auto", "--out", str(tmp_path / "s")]) == 2
    assert "gyre sweep: error: --ray needs Ray" in capsys.readouterr().err


@pytest.mark.slow  # a whole plan through the command line, and its figure
def test_cli_plans_and_draws_exactly_the_front_it_reports(tmp_path, capsys):
    from gyre.analysis.plan import pareto_points
    from gyre.sim.plan.plan import run_plan as rerun

    out = tmp_path / "p"
    args = ["plan", "--nodes", "8", "--cell-sizes", "2,4", "--budget", "5", "--steps", "3", "--trace-seeds", "1",
            "--jobs", "1", "--target", "1", "--fix", "tau=30", "--fix", "rho_min=0.5", "--out", str(out)]
    assert main(args) == 0
    assert "recommended" in capsys.readouterr().out and (out / "pareto.png").stat().st_size > 0
    result = rerun(PlanRequest(workload=Workload("nl2repo-122b", 3, (0,)),
                               cluster=Cluster(nodes=8, cell_sizes=(2, 4), per_node=36, N=16, B=32),
                               space=SearchSpace(fixed={"tau": 30.0, "rho_min": 0.5}), target_mean=1.0),
                   out, 5, serial_map)  # the stored study, nothing new to evaluate
    data = pareto_points(result)
    assert data["front"] == sorted((t.values[1], t.values[0]) for t in result.front)
    assert len(data["all"]) == len({repr(sorted(t.schedule.items())) for t in result.trials if t.values})
    assert set(data["baselines"]) == {"async", "colocate"}


def test_a_trace_file_brings_its_cluster_and_is_simulated_once(tmp_path):
    """A real run's trace (here one ``gyre trace gen`` wrote, with the sidecar a real run writes) is the same
    executions every run: one seed; its sidecar's shape is the cluster planned for."""
    from gyre.analysis.plan import build_request, register
    from gyre.formats.trace_meta import TraceMeta, write_trace_meta
    from gyre.presets import ClusterShape

    trace = tmp_path / "trace.csv"
    assert main(["trace", "gen", "--preset", "deepswe", "--queries", "40", "--seed", "2", "--out", str(trace)]) == 0
    write_trace_meta(trace, TraceMeta(preset="gyre-1", shape=ClusterShape(nodes=4, nodes_per_cell=2,
                                                                          per_node_capacity=8, N=16, B=2)))
    import argparse

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["plan", "--trace", str(trace), "--trace-seeds", "3", "--out", str(tmp_path / "p")])
    req = build_request(args)
    assert req.workload.seeds == (0,)
    assert (req.cluster.nodes, req.cluster.cell_sizes, req.cluster.per_node, req.cluster.B) == (4, (1, 2, 4), 8, 2)


def test_a_refused_trial_has_no_scores_or_schedule_and_says_which_it_is():
    evaluated = TrialRecord(number=3, point={}, schedule={"K": 2}, values=(1.0, 0.5, 2.0), attrs={}, refused=None)
    assert (evaluated.scores, evaluated.evaluated_schedule) == ((1.0, 0.5, 2.0), {"K": 2})
    refused = TrialRecord(number=4, point={}, schedule=None, values=None, attrs={}, refused="too few nodes")
    for read in ("scores", "evaluated_schedule"):
        with pytest.raises(ValueError, match="trial 4 .*refused \\(too few nodes\\)"):
            getattr(refused, read)
