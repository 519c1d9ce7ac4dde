"""`gyre trace` through a parser built here, as gyre/cli.py builds its own."""

from __future__ import annotations

import argparse

import pytest

from gyre.sim.traces import cli as trace_cli
from gyre.formats.trace import load_trace


def gen(preset: str, queries: int, out, *extra: str) -> list[str]:
    options = ["--preset", preset, "--queries", str(queries), "--seed", "0", "--out", str(out)]
    return ["trace", "gen", *options, *extra]


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gyre")
    trace_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_gen_writes_a_loadable_trace_and_one_summary_line(tmp_path, capsys, suffix):
    out = tmp_path / f"t{suffix}"
    argv = ["trace", "gen", "--preset", "nl2repo-122b", "--queries", "50", "--seed", "3", "--out", str(out)]
    assert run(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and "nl2repo-122b" in lines[0] and "50 queries x N=16" in lines[0]
    trace = load_trace(out, N=16)
    assert trace.queries == 50


def test_gen_respects_n(tmp_path):
    out = tmp_path / "t.csv"
    assert run(gen("deepswe", 5, out, "--N", "4")) == 0
    assert load_trace(out).N == 4


def test_stats_prints_targets_only_with_preset(tmp_path, capsys):
    out = tmp_path / "t.parquet"
    run(["trace", "gen", "--preset", "terminalbench", "--queries", "40", "--seed", "1", "--out", str(out)])
    capsys.readouterr()
    assert run(["trace", "stats", str(out)]) == 0
    plain = capsys.readouterr().out
    assert "mean execution" in plain and "target" not in plain
    assert run(["trace", "stats", str(out), "--preset", "terminalbench"]) == 0
    compared = capsys.readouterr().out
    assert "target" in compared and "0.250 h" in compared


def test_stats_without_a_file_prints_every_preset_fit(capsys):
    assert run(["trace", "stats", "--queries", "1000", "--seed", "0"]) == 0
    out = capsys.readouterr().out
    for name in ("nl2repo-122b", "nl2repo-2.4t", "deepswe", "terminalbench"):
        assert f"preset {name}: generated, seed 0" in out
    assert out.count("1000 queries x N = 16") == 4
    header = next(line for line in out.splitlines() if line.startswith("metric"))
    assert header.split() == ["metric", "target", "source", "achieved", "error", "tolerance", "ok"]
    block = out.split("preset nl2repo-122b")[1].split("\n\n")[0]
    over = next(line for line in block.splitlines() if line.startswith("queries > 4 h"))
    assert "10.36%" in over and "ours" in over and " pp" in over  # the paper's 9.51 % as realized in E0
    assert "ours" in out and "<= 9.51%" in out


def test_stats_of_one_generated_preset(capsys):
    assert run(["trace", "stats", "--preset", "deepswe", "--queries", "500", "--seed", "2"]) == 0
    out = capsys.readouterr().out
    assert "preset deepswe: generated, seed 2" in out and "nl2repo" not in out and "0.400 h" in out


def test_bad_trace_is_reported_with_status_2(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("query_id,execution_index,duration_s,outcome\n0,0,-1,completed\n")
    assert run(["trace", "stats", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gyre trace: error: ") and "row 1" in err and "'duration_s'" in err


def test_bad_output_suffix_is_reported(tmp_path, capsys):
    assert run(gen("deepswe", 2, tmp_path / "t.json")) == 2
    assert "suffix" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["gen", "stats", "fit"])
def test_unknown_preset_lists_known_ones(tmp_path, capsys, command):
    argv = {
        "gen": ["--queries", "2", "--seed", "0", "--out", str(tmp_path / "x.csv")],
        "stats": [str(tmp_path / "x.csv")],
        "fit": [],
    }[command]
    assert run(["trace", command, "--preset", "nope", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gyre trace: error: unknown trace preset 'nope'") and "nl2repo-122b" in err
    assert not (tmp_path / "x.csv").exists()


def test_register_imports_no_heavy_module():
    import subprocess
    import sys

    code = (
        "import argparse, sys, gyre.sim; before = set(sys.modules); from gyre.sim.traces import cli as trace_cli; "
        "trace_cli.register(argparse.ArgumentParser().add_subparsers()); "
        "print(sorted(m for m in ('numpy', 'pandas', 'scipy') if m in set(sys.modules) - before))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_presets_describes_and_rejects_unknown_names(capsys):
    assert run(["trace", "presets", "deepswe"]) == 0
    assert "preset deepswe" in capsys.readouterr().out
    assert run(["trace", "presets", "nope"]) == 2
    assert "known presets" in capsys.readouterr().err


def test_trace_without_subcommand_prints_help(capsys):
    assert run(["trace"]) == 2
    assert "gen" in capsys.readouterr().err


def test_fit_prints_parameters(capsys):
    assert run(["trace", "fit", "--preset", "terminalbench", "--queries", "2000", "--seed", "5"]) == 0
    out = capsys.readouterr().out
    assert "difficulty_log_mean=" in out and "tokens_per_call=" in out and "target" in out


def test_unwritable_output_and_bad_counts(tmp_path, capsys):
    out = tmp_path / "missing-dir" / "t.csv"
    assert run(gen("deepswe", 2, out)) == 2
    assert "cannot write" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run(gen("deepswe", 0, "x.csv"))
