"""Self-describing traces: a real run's trace.json makes ``gyre sim --trace`` need no --set."""

from __future__ import annotations


import numpy as np
import pandas as pd
import pytest

from gyre.cli import main as gyre_main
from gyre.formats.trace_meta import TraceMeta, read_trace_meta, write_trace_meta
from gyre.presets import ClusterShape
from gyre.sim.runner import run_simulation

SHAPE = ClusterShape(nodes=2, nodes_per_cell=1, per_node_capacity=8, N=8, B=2)


@pytest.fixture
def real_like_trace(tmp_path):
    rng = np.random.default_rng(4)
    rows = [{"query_id": q, "execution_index": i, "duration_s": float(rng.uniform(2, 6)), "outcome": "completed"}
            for q in range(12) for i in range(8)]
    path = tmp_path / "trace.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    write_trace_meta(path, TraceMeta("gyre-1", SHAPE, {"tau": 0.0}, "gyre run"))
    return path


def test_the_sidecar_round_trips(real_like_trace):
    assert read_trace_meta(real_like_trace) == TraceMeta("gyre-1", SHAPE, {"tau": 0.0}, "gyre run")
    assert read_trace_meta(real_like_trace.with_name("other.csv")) is None


def test_the_recorded_schedule_is_simulated_without_set(real_like_trace):
    result = run_simulation(trace=real_like_trace, steps=4)
    cfg = result.cfg
    assert (result.summary["preset"], cfg.K, cfg.C_e, cfg.N, cfg.B, cfg.tau) == ("gyre-1", 2, 8, 8, 2, 0.0)
    assert result.summary["groups_consumed"] == 4 * 2


def test_another_preset_runs_on_the_recorded_cluster(real_like_trace, capsys):
    assert gyre_main(["sim", "--trace", str(real_like_trace), "--preset", "async-1", "--steps", "2"]) == 0
    result = run_simulation("async-1", real_like_trace, steps=2)
    assert (result.cfg.K, result.cfg.static_train_cells, result.cfg.N) == (2, 1, 8)
    assert result.cfg.tau == 30.0  # the recorded overrides belong to the recorded preset only


@pytest.mark.parametrize("content, message", [
    ("{", "not a readable trace description"),
    ("[1]", "must be a JSON object"),
    ('{"preset": "nope", "shape": {}}', "field 'preset'"),
    ('{"preset": "gyre-1", "shape": {"nodez": 2}}', "field 'shape'"),
    ('{"preset": "gyre-1", "shape": 3}', "must be objects"),
    ('{"preset": "E0", "shape": {"nodes": -1}}', "nodes must be positive integers"),
    ('{"preset": "E0", "shape": {"N": true}}', "N must be positive integers"),
])
def test_a_broken_sidecar_is_named(real_like_trace, content, message, capsys):
    real_like_trace.with_suffix(".json").write_text(content)
    assert gyre_main(["sim", "--trace", str(real_like_trace), "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert message in err and "trace.json" in err
