"""``plot_real_run``: the picture of a real run from its summary (invariants of analysis/real_run.py).

The data ``real_run_data`` computes is checked against the summary it was
given (reward per step, satellite steps, the first/last level means, the
reward's trend, the staleness of every group, its mean and the prediction),
and the Figure
``draw_real_run`` makes is read back artist by artist against that data.
Each checker also rejects a sabotaged copy, so it can fail.
"""

from __future__ import annotations

import dataclasses

import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from scipy import stats

from gyre.analysis.real_run import draw_real_run, plot_real_run, real_run_data, reward_trend


def _summary(steps: int = 8) -> dict:
    return {"reward_curve": [0.1 + 0.02 * s for s in range(steps)], "losses": [0.0] * steps,
            "staleness_per_group": [0, 1] * steps, "staleness_predicted": 0.5,
            "participants": [[0, 1] if s == 3 else [0] for s in range(steps)]}


def _uneven() -> dict:
    """Three steps (shorter than the five-step levels), uneven staleness, two satellite steps."""
    return {"reward_curve": [0.5, 0.2, 0.9], "staleness_per_group": [2, 0, 1, 1, 3],
            "staleness_predicted": 1.5, "participants": [[0, 1, 2], [0], [0, 2]]}


def check_data(data, summary: dict) -> None:
    curve = summary["reward_curve"]
    assert data.steps == list(range(1, len(curve) + 1)) and data.reward == curve
    assert data.joined == [i + 1 for i, cells in enumerate(summary["participants"]) if len(cells) > 1]
    k = min(5, len(curve))
    assert data.level_steps == k
    assert data.first_mean == pytest.approx(sum(curve[:k]) / k)
    assert data.last_mean == pytest.approx(sum(curve[-k:]) / k)
    assert data.staleness == summary["staleness_per_group"]
    assert data.staleness_mean == pytest.approx(np.mean(summary["staleness_per_group"]))
    assert data.predicted == summary["staleness_predicted"]
    assert data.trend == (reward_trend(curve) if len(curve) >= 3 else None)


def check_drawn(fig, data) -> None:
    left, right = fig.axes
    reward, *satellites = left.lines
    assert list(reward.get_xdata()) == data.steps and list(reward.get_ydata()) == data.reward
    if data.joined:
        (marks,) = satellites
        assert list(marks.get_xdata()) == data.joined
        assert list(marks.get_ydata()) == [data.reward[s - 1] for s in data.joined]
    else:
        assert not satellites
    k = data.level_steps
    (levels,) = left.collections
    np.testing.assert_allclose(np.array(levels.get_segments()),
                               [[(1, data.first_mean), (k, data.first_mean)],
                                [(data.steps[-k], data.last_mean), (data.steps[-1], data.last_mean)]])
    per_group, mean, predicted = right.lines
    assert list(per_group.get_xdata()) == list(range(len(data.staleness)))
    assert list(per_group.get_ydata()) == data.staleness
    assert list(mean.get_ydata()) == [data.staleness_mean] * 2
    assert list(predicted.get_ydata()) == [data.predicted] * 2
    assert predicted.get_label() == f"phi + (mu-1)/2 = {data.predicted:g}"
    title = left.get_title()
    assert title.startswith("reward over the run")
    if data.trend is not None:
        assert title.endswith(f"trend {data.trend[0]:+.4f}/step, t = {data.trend[1]:.1f}")


@pytest.mark.parametrize("summary", [_summary(), _uneven()], ids=["eight-steps", "three-steps"])
def test_the_picture_plots_the_summarys_series(summary):
    data = real_run_data(summary)
    check_data(data, summary)
    fig = draw_real_run(data)
    check_drawn(fig, data)
    rejects = [(check_data, dataclasses.replace(data, reward=data.reward[::-1]), summary),
               (check_data, dataclasses.replace(data, last_mean=data.last_mean + 0.01), summary),
               (check_drawn, fig, dataclasses.replace(data, staleness=sorted(data.staleness))),
               (check_drawn, fig, dataclasses.replace(data, joined=data.steps[:1])),
               (check_data, dataclasses.replace(data, trend=(0.0, 0.0)), summary),
               (check_drawn, fig, dataclasses.replace(data, trend=(1.0, 9.9)))]
    for check, *args in rejects:
        with pytest.raises(AssertionError):
            check(*args)


def test_a_run_without_staleness_draws_no_mean_line():
    summary = {"reward_curve": [0.3, 0.4], "staleness_predicted": None}
    data = real_run_data(summary)
    assert data.staleness == [] and data.staleness_mean is None and data.joined == []
    right = draw_real_run(data).axes[1]
    assert [len(line.get_ydata()) for line in right.lines] == [0]


def test_writes_the_same_png_and_svg_from_a_summary(tmp_path):
    paths = plot_real_run(_summary(), tmp_path / "a")
    assert [p.name for p in paths] == ["run.png", "run.svg"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = paths[1].read_text()
    assert "phi + (mu-1)/2 = 0.5" in svg and "a satellite cell took part" in svg and "measured mean = 0.5" in svg
    assert plot_real_run(_summary(), tmp_path / "b")[1].read_text() == svg


def test_a_run_without_steps_is_named(tmp_path):
    with pytest.raises(ValueError, match="no reward_curve"):
        plot_real_run({"reward_curve": []}, tmp_path)
    assert not list(tmp_path.iterdir())


@given(st.lists(st.integers(0, 1000), min_size=3, max_size=40))
def test_the_trend_is_the_least_squares_slope_and_its_t(millis):
    """Against scipy's linregress on rewards in steps of 0.001: the same slope, and t = slope / stderr.
    Curves with (almost) no residual, where t is +-inf or rounding noise, are the next test's."""
    values = [m / 1000 for m in millis]
    slope, t = reward_trend(values)
    fit = stats.linregress(range(len(values)), values)
    assert slope == pytest.approx(fit.slope, abs=1e-9)
    assume(fit.stderr > 1e-6)
    assert t == pytest.approx(fit.slope / fit.stderr, rel=1e-6)


def test_the_trend_of_a_line_a_constant_and_too_few_steps():
    assert reward_trend([0.0, 0.25, 0.5, 0.75]) == (0.25, math.inf)  # exact in binary: no residual
    assert reward_trend([1.0, 0.5, 0.0])[1] == -math.inf
    assert reward_trend([0.2] * 6) == (0.0, 0.0)
    with pytest.raises(ValueError, match="at least 3 values, got 2"):
        reward_trend([0.1, 0.2])
    assert real_run_data({"reward_curve": [0.3, 0.4]}).trend is None
