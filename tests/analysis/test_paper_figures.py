"""Every figure script runs headlessly on tiny runs and writes non-empty PNG and SVG files."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gyre.analysis import figs_cli
from gyre.paper_figs.make_all import FIGURES, load_figure

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", FIGURES)
def test_figure_writes_png_and_svg(name, tmp_path):
    paths = load_figure(name).main(tmp_path, quick=True)
    assert sorted(p.suffix for p in paths) == [".png", ".svg"]
    for path in paths:
        assert path.exists() and path.stat().st_size > 1000
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = paths[1].read_text()
    assert "<svg" in svg
    assert any(unit in svg for unit in ("(h)", "(versions)", "(x", "(%)"))  # axis labels carry units


def test_figs_command_runs_a_subset(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    figs_cli.register(parser.add_subparsers())
    args = parser.parse_args(["figs", "--out", str(tmp_path), "--quick", "--only", "fig2_durations"])
    assert args.func(args) == 0
    assert (tmp_path / "fig2_durations.png").stat().st_size > 0
    assert "[1/1] fig2_durations" in capsys.readouterr().out
    bad = parser.parse_args(["figs", "--out", str(tmp_path), "--only", "fig9"])
    assert bad.func(bad) == 2


def test_a_figure_script_runs_on_its_own(tmp_path):
    script = REPO / "paper_figs" / "fig2_durations.py"
    done = subprocess.run([sys.executable, str(script), str(tmp_path), "--quick"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "MPLBACKEND": "Agg"})
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "fig2_durations.svg").stat().st_size > 0
