"""``plot_real_run``: the picture of a real run from its summary (invariants of analysis/real_run.py)."""

from __future__ import annotations

import pytest

from gyre.analysis.real_run import plot_real_run


def _summary(steps: int = 8) -> dict:
    return {"reward_curve": [0.1 + 0.02 * s for s in range(steps)], "losses": [0.0] * steps,
            "staleness_per_group": [0, 1] * steps, "staleness_predicted": 0.5,
            "participants": [[0, 1] if s == 3 else [0] for s in range(steps)]}


def test_writes_png_and_svg_from_a_summary(tmp_path):
    paths = plot_real_run(_summary(), tmp_path)
    assert [p.name for p in paths] == ["run.png", "run.svg"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and paths[0].stat().st_size > 5000
    svg = paths[1].read_text()
    assert "phi + (mu-1)/2 = 0.5" in svg and "a satellite cell took part" in svg


def test_same_summary_gives_the_same_svg(tmp_path):
    first = plot_real_run(_summary(), tmp_path / "a")[1].read_text()
    assert plot_real_run(_summary(), tmp_path / "b")[1].read_text() == first


def test_a_run_without_steps_is_named(tmp_path):
    with pytest.raises(ValueError, match="no reward_curve"):
        plot_real_run({"reward_curve": []}, tmp_path)
    assert not list(tmp_path.iterdir())
