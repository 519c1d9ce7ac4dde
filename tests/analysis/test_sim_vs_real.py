"""``compare_run``: a run folder simulated under its own schedule, compared step by step.

The "real" folder here is written from a simulation (events.csv, the config,
the trace and its sidecar), so the simulator under the same costs must
predict it exactly, and under other costs must not: the comparison's
plumbing (sidecar -> schedule, both logs read by one function, steps matched
by version) is checked without the real stack. The real stack's own check is
the CPU demo's end-to-end test.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np
import pytest

from gyre.analysis.sim_vs_real import compare_run, draw_comparison, format_comparison
from gyre.formats.trace_meta import TraceMeta, write_trace_meta
from gyre.presets import ClusterShape
from gyre.sim.runner import run_simulation

SHAPE = ClusterShape(nodes=3, nodes_per_cell=1, per_node_capacity=8, N=4, B=2)
COSTS = {"to_training_s": 0.9, "to_rollout_s": 0.5, "publish_s": 0.2, "warmup_s": 0.0, "drain_s": 0.0,
         "grad_reduce_s": 0.0, "optimizer_s": 0.01, "broadcast_s": 0.0, "weight_pull_s": 0.0}


def _run_folder(tmp_path, steps=6, costs=None):
    rng = np.random.default_rng(7)
    run = tmp_path / "run"
    run.mkdir()
    lines = ["query_id,execution_index,duration_s,outcome,input_tokens,output_tokens,call_count"]
    for q in range(40):
        for i in range(SHAPE.N):
            lines.append(f"{q},{i},{rng.uniform(5, 25):.3f},completed,300,60,2")
    (run / "trace.csv").write_text("\n".join(lines) + "\n")
    write_trace_meta(run / "trace.csv", TraceMeta("gyre-1", SHAPE, {"tau": 0.0}, "test"))
    truth = run_simulation(None, run / "trace.csv", steps=steps, costs=_costs(costs or COSTS))
    (run / "log").mkdir()
    truth.record.log.write_csv(run / "log" / "events.csv")
    (run / "log" / "summary.json").write_text(json.dumps({"config": asdict(truth.cfg)}))
    return run, truth


def _costs(fields):
    from gyre.sim.costs import CostModel

    known = CostModel.__dataclass_fields__
    return CostModel(**{k: v for k, v in fields.items() if k in known})


def _known(fields):
    from gyre.sim.costs import CostModel

    return {k: v for k, v in fields.items() if k in CostModel.__dataclass_fields__}


def test_the_same_costs_predict_the_run_exactly(tmp_path):
    run, truth = _run_folder(tmp_path)
    c = compare_run(run, _known(COSTS))
    assert [r.version for r in c.rows] == list(range(6))
    assert c.total_error == pytest.approx(0.0, abs=1e-6) and c.step_error == pytest.approx(0.0, abs=1e-6)  # CSV keeps microseconds
    assert c.same_cells_share == 1.0
    assert c.real_total_s == pytest.approx(truth.record.step_rows()[-1]["end_s"], abs=1e-5)
    assert "total: real" in format_comparison(c)
    assert all(p.exists() for p in draw_comparison(c, tmp_path / "fig"))


def test_other_costs_predict_a_different_run(tmp_path):
    run, _ = _run_folder(tmp_path)
    c = compare_run(run, _known(dict(COSTS, publish_s=30.0, to_rollout_s=20.0)))
    assert c.total_error > 0.05


def test_one_transition_cost_for_core_and_satellites_mispredicts_the_run(tmp_path):
    """Why calibration measures the core unit's and the satellites' transitions apart."""
    split = dict(COSTS, to_training_s=4.0, to_rollout_s=3.0, satellite_to_training_s=0.2, satellite_to_rollout_s=0.3)
    run, truth = _run_folder(tmp_path, steps=12, costs=split)
    assert truth.record.log.action_counts["begin_transition"] > 2  # satellites did move
    pooled = {k: v for k, v in split.items() if not k.startswith("satellite_")}
    pooled["to_training_s"] = (split["to_training_s"] + split["satellite_to_training_s"]) / 2
    pooled["to_rollout_s"] = (split["to_rollout_s"] + split["satellite_to_rollout_s"]) / 2
    exact, mispredicted = compare_run(run, _known(split)), compare_run(run, _known(pooled))
    assert exact.step_error == pytest.approx(0.0, abs=1e-4) and exact.same_cells_share == 1.0
    assert mispredicted.step_error > 1e-3  # the pooled cost mispredicts every switch's timing


def test_a_sidecar_that_disagrees_with_the_log_is_an_error(tmp_path):
    run, _ = _run_folder(tmp_path)
    write_trace_meta(run / "trace.csv", TraceMeta("gyre-1", SHAPE, {"tau": 0.0, "phi": 1.0}, "test"))
    with pytest.raises(ValueError, match="not the run's"):
        compare_run(run, _known(COSTS))


def test_gyre_sim_on_a_run_trace_simulates_the_runs_own_steps_in_seconds(tmp_path, capsys):
    from gyre.cli import main as gyre_main

    run, truth = _run_folder(tmp_path, steps=7)
    costs = tmp_path / "costs.toml"
    costs.write_text("[costs]\n" + "".join(f"{k} = {float(v)!r}\n" for k, v in _known(COSTS).items()))
    out = tmp_path / "what-if"
    assert gyre_main(["sim", "--trace", str(run / "trace.csv"), "--costs", str(costs), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 7 and summary["units"] == "s"  # the run's 7 steps, not the default 12
    assert summary["total_s"] == pytest.approx(truth.record.end_s, abs=1e-3)  # same costs: the same run
    assert "total time (s)" in text and "total time (h)" not in text


def test_a_run_is_predicted_with_costs_calibrated_on_another(tmp_path, capsys):
    """Held out: run B (another trace seed) predicted from A's cost file; nothing of B is fitted."""
    from gyre.cli import main as gyre_main

    (tmp_path / "b").mkdir()
    run_b, _ = _run_folder(tmp_path / "b", steps=6)
    costs = tmp_path / "a_costs.toml"  # stands for run A's calibrated costs.toml
    costs.write_text("[costs]\n" + "".join(f"{k} = {float(v)!r}\n" for k, v in _known(COSTS).items()))
    assert gyre_main(["calibrate", str(run_b), "--costs", str(costs)]) == 0
    out = capsys.readouterr().out
    assert "total: real" in out and ("(+0.0%)" in out or "(-0.0%)" in out)  # the true costs predict B exactly
    assert (run_b / "prediction_from_costs.csv").exists() and not (run_b / "costs.toml").exists()
    slower = tmp_path / "slower.toml"
    slower.write_text(costs.read_text().replace("publish_s = 0.2", "publish_s = 20.0"))
    assert gyre_main(["calibrate", str(run_b), "--costs", str(slower)]) == 0
    worse = capsys.readouterr().out
    assert "(+0.0%)" not in worse and "(-0.0%)" not in worse


def test_the_median_step_error_is_each_steps_own_relative_error():
    from gyre.analysis.sim_vs_real import Comparison, StepRow

    walls = [(1.0, 1.1), (2.0, 2.0), (4.0, 3.0), (10.0, 20.0)]  # (real, sim): 10 %, 0 %, 25 %, 100 %
    rows = [StepRow(v, 1.0 + v, 1.0 + v, real, sim, "0", "0") for v, (real, sim) in enumerate(walls)]
    c = Comparison(rows, None, None, {})
    assert c.step_error_median == pytest.approx(0.175)  # the median of 0, 0.1, 0.25, 1.0
    assert c.step_error == pytest.approx((0.1 + 0.0 + 1.0 + 10.0) / 4 / (17.0 / 4))
    assert c.summary()["step_error_median"] == c.step_error_median
