"""``gyre traj stats`` and ``gyre traj show`` (cli.py, prefix_graph.py)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from gyre.real.store import cli
from gyre.real.store.tito_log import ExecutionStore, TornTailWarning
from gyre.trajectory.synthetic import ExecutionShape, synthetic_execution

SMALL = ExecutionShape(execution_id="small-1", main_segments=(12, 6), subagent_segments=((9, 4), (5,)),
                       spawn_turns=(2, 7), retry_turns=(("main", 3),), main_system_tokens=300,
                       subagent_system_tokens=120, summary_tokens=80, tool_result_mean=60.0, output_tokens=(5, 30))


@pytest.fixture(scope="module")
def log_path(tmp_path_factory):
    store = ExecutionStore(tmp_path_factory.mktemp("records"))
    for record in synthetic_execution(np.random.default_rng(0), SMALL):
        store.append(record)
    store.close()
    return store.path_for("small-1")


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="gyre")
    cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(list(argv))
    return args.func(args)


def test_stats_text_and_json(log_path, capsys):
    assert run("traj", "stats", str(log_path)) == 0
    text = capsys.readouterr().out
    assert f"requests           {SMALL.requests}" in text and "leaf roles" in text and "main-summary=1" in text
    assert run("traj", "stats", str(log_path), "--json", "--harness", "claude-code") == 0
    (report,) = json.loads(capsys.readouterr().out)
    assert report["requests"] == SMALL.requests and report["leaves"] == 8
    assert report["leaf_roles"] == {"main": 3, "main-summary": 1, "sub-agent": 3, "sub-agent-summary": 1}
    assert report["node_occurrences"] - report["nodes"] == report["repeated_node_occurrences"]


@pytest.mark.parametrize("suffix", [".dot", ".svg"])
def test_show_draws_the_prefix_graph(log_path, tmp_path, capsys, suffix):
    out = tmp_path / f"graph{suffix}"
    assert run("traj", "show", str(log_path), "--out", str(out)) == 0
    body = out.read_text()
    assert ("digraph" in body and "->" in body) if suffix == ".dot" else "<svg" in body
    assert "wrote" in capsys.readouterr().out


def test_bad_inputs_fail_with_a_message(log_path, tmp_path, capsys):
    assert run("traj", "stats", str(tmp_path / "missing.tito")) == 1
    assert "no record log" in capsys.readouterr().err
    assert run("traj", "show", str(log_path), "--out", str(tmp_path / "graph.gif")) == 1
    assert "cannot draw" in capsys.readouterr().err
    assert run("traj", "show", str(log_path), "--out", str(tmp_path / "g.dot"), "--execution", "nope") == 1
    assert "no execution" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run("traj", "stats", str(log_path), "--harness", "aider")


def test_torn_log_still_reports_what_is_intact(log_path, tmp_path, capsys):
    torn = tmp_path / "torn.tito"
    torn.write_bytes(log_path.read_bytes())
    os.truncate(torn, torn.stat().st_size - 11)
    with pytest.warns(TornTailWarning):
        assert run("traj", "stats", str(torn), "--json") == 0
    (report,) = json.loads(capsys.readouterr().out)
    assert report["requests"] == SMALL.requests - 1


def test_works_through_the_gyre_entry_point(log_path, capsys):
    import gyre.cli

    assert gyre.cli.main(["traj", "stats", str(log_path), "--json"]) == 0  # every command registered, as `gyre`
    assert json.loads(capsys.readouterr().out)[0]["execution_id"] == "small-1"


def test_registering_the_command_imports_no_numpy():
    code = ("import argparse, sys\nfrom gyre.real.store import cli\n"
            "cli.register(argparse.ArgumentParser().add_subparsers())\nassert 'numpy' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
