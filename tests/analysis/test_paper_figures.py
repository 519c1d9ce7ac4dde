"""The paper figures, checked on what they plot (quick runs).

For every figure: its ``figure_data`` obeys the definitions it draws (docs/staleness.md#staleness-identity,
docs/scheduler.md#baselines-and-ablations, ``gyre.analysis``), checked against the runs, trace or tree it came
from; ``main`` draws exactly that data (the Figure it saves is read back
artist by artist, with ``figure_data`` and ``save_figure`` stubbed so nothing
is recomputed or written); and each checker rejects a sabotaged copy, so the
checks can fail. Every figure's data is computed once, inside its one test,
so the tests stay fast under xdist.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import LineCollection, PathCollection, PolyCollection
from matplotlib.colors import to_rgba

from gyre.analysis.plotting import HOUR_S, ROLE_COLORS
from gyre.analysis.theorem import TheoremGrid
from gyre.paper_figs import cli as figs_cli
from gyre.paper_figs import fig1_role_timeline as fig1
from gyre.paper_figs import fig2_durations as fig2
from gyre.paper_figs import fig3_step_speedup as fig3
from gyre.paper_figs import fig4_ablation as fig4
from gyre.paper_figs import fig5_staleness as fig5
from gyre.paper_figs import fig6_theorem as fig6
from gyre.paper_figs import fig7_prefix_graph as fig7

REPO = Path(__file__).resolve().parents[2]
# docs/scheduler.md#baselines-and-ablations
SPEC_ABLATIONS = ("A0", "A1", "A2", "A3", "C0", "C1", "C2", "C3", "E0", "E1", "E2")
#: docs/staleness.md#staleness-identity: (phi, mu) of each method at E[d] = 1.5 and E[d] = 1.
SPEC_METHODS = {"1.5": {"Async": (1.5, 1), "Colocate": (0.0, 4), "Gyre": (0.5, 3)},
                "1": {"Async": (1.0, 1), "Colocate": (0.0, 3), "Gyre": (0.5, 2)}}


# ---------------------------------------------------------------- helpers

def drawn_by_main(module, data, tmp_path):
    """The Figure ``module.main`` saves when it draws ``data``; nothing is written."""
    saved = []

    def fake_save(fig, out_dir, stem):
        saved.append(fig)
        return [Path(out_dir) / f"{stem}.png", Path(out_dir) / f"{stem}.svg"]

    paths = module.main(tmp_path, quick=True, data=data, save=fake_save)
    assert [p.name for p in paths] == [f"{module.STEM}.png", f"{module.STEM}.svg"] and len(saved) == 1
    return saved[0]


def same(actual, expected, tol: float = 1e-9) -> None:
    np.testing.assert_allclose(np.asarray(actual, dtype=float), np.asarray(expected, dtype=float),
                               rtol=tol, atol=tol)


def rejects(check, *args) -> None:
    """``check(*args)`` must fail: the checker sees the sabotage."""
    with pytest.raises(AssertionError):
        check(*args)


# ---------------------------------------------------------------- figure 1: role timeline

def check_fig1_data(data: fig1.TimelineData, run) -> None:
    run_end = float(run.steps["end_s"].max())
    assert set(data.roles["role"]) <= set(ROLE_COLORS)
    for cell, rows in data.roles.groupby("cell"):  # per cell: intervals tile [0, end of run]
        rows = rows.sort_values(["start_s", "end_s"])
        starts, ends = rows["start_s"].to_numpy(), rows["end_s"].to_numpy()
        assert starts[0] == 0 and (ends >= starts).all(), f"cell {cell}"  # a switch begun at the end is empty
        same(ends[:-1], starts[1:])
        same(ends[-1], run_end, 1e-6)
    assert data.t0_s < data.burst_start_s < data.t1_s and data.cells == run.roles["cell"].nunique()
    check_fig1_bars(data)
    check_fig1_steps(data, run)
    check_fig1_joins(data, run)
    check_fig1_load(data, run)


def check_fig1_bars(data: fig1.TimelineData) -> None:
    t0, t1 = data.t0_s, data.t1_s
    expected = []
    for r in data.roles.itertuples():
        start, end = max(r.start_s, t0), min(r.end_s, t1)
        if end > start:
            width = max(end - start, fig1.MIN_SWITCH_WIDTH * (t1 - t0)) if r.role.startswith("to_") else end - start
            expected.append((r.cell, r.role, (start - t0) / HOUR_S, width / HOUR_S))
    got = sorted(data.bars.itertuples(index=False, name=None))
    assert [g[:2] for g in got] == [e[:2] for e in sorted(expected)]
    same([g[2:] for g in got], [e[2:] for e in sorted(expected)])
    switch = data.bars["role"].str.startswith("to_").to_numpy()
    assert not (switch[:-1] & ~switch[1:]).any(), "switches are drawn last"
    plain = data.bars[~switch]  # rollout/training bars of a cell tile the window up to the run's end
    visible = (min(t1, float(data.roles["end_s"].max())) - max(t0, 0.0)) / HOUR_S
    assert plain.groupby("cell")["width_h"].sum().le(visible + 1e-9).all()


def check_fig1_steps(data: fig1.TimelineData, run) -> None:
    first = data.burst * data.mu
    assert list(data.steps["step"]) == list(range(first, first + data.mu))
    assert (data.steps["left_h"] < data.steps["right_h"]).all()
    assert data.steps["left_h"].iloc[0] >= (data.burst_start_s - data.t0_s) / HOUR_S - 1e-9
    ends = run.steps.set_index("step")["end_s"]
    same(data.steps["right_h"], (ends.loc[data.steps["step"]].clip(upper=data.t1_s) - data.t0_s) / HOUR_S)
    for p in data.publications.itertuples():  # a publication starts when its burst's last step ends
        assert p.version % data.mu == 0
        same(p.x_h, (ends.loc[p.version - 1] - data.t0_s) / HOUR_S)


def check_fig1_joins(data: fig1.TimelineData, run) -> None:
    steps = run.steps.dropna(subset=["end_s"])
    joins = []  # satellite cells entering training while a step is in flight
    for r in run.roles[(run.roles["role"] == "training") & (run.roles["cell"] != 0)].itertuples():
        inflight = steps[(steps["start_s"] <= r.start_s) & (r.start_s < steps["end_s"])]
        if len(inflight):
            joins.append((int(r.cell), int(inflight["step"].iloc[0]), r.start_s))
    shown = sorted((c, s, (t - data.t0_s) / HOUR_S) for c, s, t in joins if data.t0_s <= t <= data.t1_s)
    got = sorted(data.joins.itertuples(index=False, name=None))
    assert [g[:2] for g in got] == [j[:2] for j in shown]
    same([g[2] for g in got], [j[2] for j in shown])
    per_burst = pd.Series([s // data.mu for _, s, _ in joins]).value_counts()
    completed = range(1, len(steps) // data.mu)
    assert per_burst.get(data.burst, 0) == max([per_burst.get(b, 0) for b in completed] or [0])


def check_fig1_load(data: fig1.TimelineData, run) -> None:
    starts = np.sort(run.executions["start_s"].to_numpy(dtype=float))
    ends = np.sort(run.executions["end_s"].dropna().to_numpy(dtype=float))
    t = data.load["time_s"].to_numpy()
    running = np.searchsorted(starts, t, side="right") - np.searchsorted(ends, t, side="right")
    assert (data.load["running"] >= 0).all() and (np.diff(t) > 0).all()
    same(data.load["x_h"], (t - data.t0_s) / HOUR_S)
    np.testing.assert_array_equal(data.load["running"], running)


def check_fig1_drawn(fig, data: fig1.TimelineData) -> None:
    ax, ax_load = fig.axes[:2]
    rects = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(rects) == len(data.bars)
    for rect, bar in zip(rects, data.bars.itertuples()):
        xs, ys = rect.get_paths()[0].vertices.T
        same([xs.min(), xs.max() - xs.min(), (ys.min() + ys.max()) / 2], [bar.x_h, bar.width_h, bar.cell])
        assert tuple(rect.get_facecolor()[0]) == to_rgba(ROLE_COLORS[bar.role])
    (marks,) = [c for c in ax.collections if isinstance(c, PathCollection)]
    same(marks.get_offsets(), data.joins[["x_h", "cell"]].to_numpy(dtype=float).reshape(-1, 2))
    same(sorted(line.get_xdata()[0] for line in ax.lines), sorted(data.publications["x_h"]))
    labels = {t.get_text(): t.get_position()[0] for t in ax.texts if t.get_text().startswith("step ")}
    assert labels == pytest.approx({f"step {s.step}": (s.left_h + s.right_h) / 2 for s in data.steps.itertuples()})
    (load,) = ax_load.lines
    same(load.get_xdata(), data.load["x_h"])
    same(load.get_ydata(), data.load["running"])
    same(ax_load.get_xlim(), (0, (data.t1_s - data.t0_s) / HOUR_S))


def test_fig1_roles_tile_each_cell_and_the_figure_draws_the_busiest_burst(tmp_path):
    run = fig1.simulate(quick=True)
    data = fig1.timeline_data(run)  # figure_data(quick) is timeline_data(simulate(quick))
    check_fig1_data(data, run)
    assert len(data.joins) and len(data.publications)  # the quick run still shows joins and a publication
    fig = drawn_by_main(fig1, data, tmp_path)
    check_fig1_drawn(fig, data)
    gap = data.roles.copy()
    gap.loc[gap.index[1], "start_s"] += 1.0  # a hole between two intervals of a cell
    rejects(check_fig1_data, dataclasses.replace(data, roles=gap), run)
    rejects(check_fig1_load, dataclasses.replace(data, load=data.load.assign(running=data.load["running"] + 1)), run)
    rejects(check_fig1_drawn, fig, dataclasses.replace(data, bars=data.bars.iloc[::-1]))


# ---------------------------------------------------------------- figure 2: durations

def check_fig2_data(panels: dict, execution_h: np.ndarray, query_h: np.ndarray) -> None:
    assert list(panels) == ["executions", fig2.QUERY_TITLE]
    for hist, hours in zip(panels.values(), (execution_h, query_h)):
        bins = hist.bins
        assert hist.n == hours.size == bins["count"].sum()  # every duration counted exactly once
        left, right = bins["left_h"].to_numpy(), (bins["left_h"] + bins["width_h"]).to_numpy()
        same(left[1:], right[:-1])
        assert left[0] == 0 and left[-1] == fig2.OVERFLOW_H
        counts = [((hours >= lo) & (hours < hi)).sum() for lo, hi in zip(left[:-1], right[:-1])]
        assert list(bins["count"]) == counts + [(hours >= fig2.OVERFLOW_H).sum()]
        same(bins["share_pct"], 100 * bins["count"] / hours.size)
        same(bins["share_pct"].sum(), 100)
        same([hist.mean_h, hist.over_timeout_pct], [hours.mean(), 100 * (hours > fig2.TIMEOUT_H).mean()])
    executions, queries = panels.values()
    assert queries.mean_h >= executions.mean_h and queries.over_timeout_pct >= executions.over_timeout_pct


def check_fig2_drawn(fig, panels: dict) -> None:
    for ax, (title, hist) in zip(fig.axes, panels.items()):
        assert ax.get_title() == title
        bars = ax.patches
        same([b.get_height() for b in bars], hist.bins["share_pct"])
        same([b.get_x() for b in bars], hist.bins["left_h"])
        same([b.get_width() for b in bars], 0.95 * hist.bins["width_h"])
        assert bars[-1].get_facecolor() == to_rgba("#D1495B") != bars[0].get_facecolor()
        assert any(t.get_text().startswith(f"n = {hist.n:,}\nmean {hist.mean_h:.2f} h") for t in ax.texts)


def test_fig2_histograms_count_every_execution_and_query_of_the_trace(tmp_path):
    from gyre.sim.traces.presets import generate_trace

    trace = generate_trace("nl2repo-122b", 200, np.random.default_rng(0), N=16)  # the simulator's own input
    execution_h, query_h = trace.durations_s.ravel() / HOUR_S, trace.durations_s.max(axis=1) / HOUR_S
    assert execution_h.size == 200 * 16 and query_h.size == 200
    panels = fig2.figure_data(quick=True)
    check_fig2_data(panels, execution_h, query_h)
    check_fig2_drawn(drawn_by_main(fig2, panels, tmp_path), panels)
    rejects(check_fig2_data, panels, execution_h[:-1], query_h)  # one execution too few
    rejects(check_fig2_data, panels, np.minimum(execution_h, 3.9), query_h)  # no timeout left
    flipped = dict(zip(panels, reversed(panels.values())))
    rejects(check_fig2_drawn, drawn_by_main(fig2, panels, tmp_path), flipped)


# ---------------------------------------------------------------- figure 3: step times and speedup

def check_fig3_data(data: fig3.SpeedupData, runs: dict) -> None:
    per_step = data.per_step
    assert list(dict.fromkeys(per_step["method"])) == list(runs) == ["Async", "Colocate", "Gyre"]
    for method, rows in per_step.groupby("method", sort=False):
        run_steps = runs[method].steps.dropna(subset=["end_s"]).sort_values("step")
        assert list(rows["step"]) == list(run_steps["step"]) and (rows["wall_h"] > 0).all()
        same(rows["end_h"], run_steps["end_s"] / HOUR_S)
        same(rows["wall_h"].cumsum(), rows["end_h"])  # the steps' shares add up to the wall clock
        same(data.totals_h[method], run_steps["end_s"].max() / HOUR_S)  # time to finish the last step
    end = per_step.pivot(index="step", columns="method", values="end_h")
    assert sorted(set(data.speedup["over"])) == ["Async", "Colocate"]
    for other, rows in data.speedup.groupby("over"):
        assert list(rows["step"]) == list(end.index)
        same(rows["speedup"], end.loc[rows["step"], other] / end.loc[rows["step"], "Gyre"])
        same(rows["baseline_end_s"], end.loc[rows["step"], other] * HOUR_S)


def check_fig3_drawn(fig, data: fig3.SpeedupData) -> None:
    top, bottom = fig.axes
    for line, (method, rows) in zip(top.lines, data.per_step.groupby("method", sort=False), strict=True):
        same(line.get_xdata(), rows["step"])
        same(line.get_ydata(), rows["wall_h"])
        assert line.get_label() == f"{method} (total {data.totals_h[method]:.1f} h)"
    curves = [line for line in bottom.lines if line.get_label().startswith("over ")]
    for line, (other, rows) in zip(curves, data.speedup.groupby("over", sort=False), strict=True):
        same(line.get_ydata(), rows["speedup"])
        assert line.get_label() == f"over {other} (final {rows['speedup'].iloc[-1]:.2f}x)"
    assert [list(line.get_ydata()) for line in bottom.lines if line not in curves] == [[1.0, 1.0]]


def test_fig3_speedups_are_ratios_of_the_runs_step_end_times(tmp_path):
    runs = fig3.simulate(quick=True)
    data = fig3.speedup_data(runs)  # figure_data(quick) is speedup_data(simulate(quick))
    check_fig3_data(data, runs)
    fig = drawn_by_main(fig3, data, tmp_path)
    check_fig3_drawn(fig, data)
    inverted = data.speedup.assign(speedup=1 / data.speedup["speedup"])
    rejects(check_fig3_data, dataclasses.replace(data, speedup=inverted), runs)
    rejects(check_fig3_drawn, fig, dataclasses.replace(data, per_step=data.per_step.iloc[::-1]))


# ---------------------------------------------------------------- figure 4: ablations

def check_fig4_data(table: pd.DataFrame, reference: dict[str, float]) -> None:
    from gyre.presets import PRESETS

    assert tuple(table.index) == SPEC_ABLATIONS
    assert table.loc["E0", "ratio"] == 1.0 and (table["total_h"] > 0).all()
    same(table["ratio"], table["total_h"] / table.loc["E0", "total_h"])
    assert list(table["description"]) == [PRESETS[n].description for n in SPEC_ABLATIONS]
    for name, hours in reference.items():  # independent runs give the same totals
        same(table.loc[name, "total_h"], hours)


def check_fig4_drawn(fig, table: pd.DataFrame) -> None:
    ax = fig.axes[0]
    bars = ax.patches[:len(table)]
    assert all(p.get_width() * p.get_height() == 0 for p in ax.patches[len(table):])  # legend stand-ins
    same([b.get_width() for b in bars], table["ratio"].iloc[::-1])
    assert [t.get_text() for t in ax.get_yticklabels()] == list(table.index[::-1])
    texts = [t.get_text() for t in ax.texts]
    assert texts == [f"{r:.2f}x  ({h:.1f} h)" for r, h in zip(table["ratio"].iloc[::-1], table["total_h"].iloc[::-1])]


def test_fig4_ratios_are_totals_over_e0_and_e0_is_exactly_one(tmp_path):
    from gyre.analysis.runs import run_from_result
    from gyre.sim.runner import run_simulation

    reference = {}  # two presets run again on their own: hours to the end of their last step
    for name in ("E0", "C0"):
        steps = run_from_result(run_simulation(name, "nl2repo-122b", steps=3, seed=0)).steps
        reference[name] = steps["end_s"].max() / HOUR_S
    table = fig4.figure_data(quick=True)
    check_fig4_data(table, reference)
    fig = drawn_by_main(fig4, table, tmp_path)
    check_fig4_drawn(fig, table)
    rejects(check_fig4_data, table.assign(ratio=table["total_h"] / table["total_h"].mean()), reference)
    rejects(check_fig4_data, table.assign(total_h=table["total_h"] * 1.01), reference)  # ratios still agree
    rejects(check_fig4_drawn, fig, table.iloc[::-1])
    with pytest.raises(ValueError, match="E0"):
        fig4.ablation_data({"A0": 1.0})


# ---------------------------------------------------------------- figure 5: staleness distributions

def check_fig5_data(data: fig5.StalenessData, runs: dict) -> None:
    stats = data.stats.set_index(["ed", "method"])
    assert list(stats.index) == [(ed, m) for ed, methods in SPEC_METHODS.items() for m in methods]
    for (ed, method), row in stats.iterrows():
        run = runs[ed][method]
        assert (row["phi"], row["mu"]) == SPEC_METHODS[ed][method]  # same E[d] = phi + (mu - 1) / 2
        assert row["predicted"] == row["phi"] + (row["mu"] - 1) / 2 == float(ed)
        assert row["groups"] == (row["window_stop"] - row["window_first"]) * run.config["B"]  # B groups a step
        same(row["mean"], run.summary["staleness_steady_mean"], 1e-6)  # the simulator's own summary
        assert abs(row["mean"] - row["predicted"]) <= TheoremGrid().tolerance  # Theorem A.1, steady window
        check_fig5_shares(data.bars, ed, method, row)


def check_fig5_shares(bars: pd.DataFrame, ed: str, method: str, row: pd.Series) -> None:
    mine = bars[(bars["ed"] == ed) & (bars["method"] == method)]
    groups, tokens = (mine[mine["weight"] == w] for w in ("groups", "tokens"))
    for dist in (groups, tokens):
        assert (dist["share"] > 0).all() and (dist["staleness"] >= 0).all()
        same(dist["share"].sum(), 1.0, 1e-12)
        assert ((dist["x"] - dist["staleness"]).abs() < 0.5).all()
    same((groups["staleness"] * groups["share"]).sum(), row["mean"], 1e-12)
    same((tokens["staleness"] * tokens["share"]).sum(), row["token_weighted_mean"], 1e-12)
    assert groups["staleness"].max() == row["max"]
    if row["phi"] == 0:  # Colocate: step j of a burst trains on the burst's first weights, d = j
        assert list(groups["staleness"]) == list(range(int(row["mu"])))
        same(groups["share"], 1 / row["mu"], 1e-12)


def check_fig5_drawn(fig, data: fig5.StalenessData) -> None:
    eds = list(SPEC_METHODS)
    assert len(fig.axes) == 2 * len(eds)
    for ax, (ed, weight) in zip(fig.axes, [(ed, w) for ed in eds for w in ("groups", "tokens")]):
        assert ax.get_title().startswith(f"E[d] = {ed}: {weight[:-1]}-weighted, steady state")
        bars = data.bars[(data.bars["ed"] == ed) & (data.bars["weight"] == weight)]
        patches = ax.patches
        same([p.get_height() for p in patches], 100 * bars["share"])
        same([p.get_x() + p.get_width() / 2 for p in patches], bars["x"])
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        stats = data.stats[data.stats["ed"] == ed]
        assert legend == [f"{s.method}: mean {s.mean:.2f}, tok-wtd {s.token_weighted_mean:.2f}, max {s.max:.0f}"
                          for s in stats.itertuples()]


@pytest.mark.slow
def test_fig5_shares_sum_to_one_and_their_means_are_the_theorem_means(tmp_path):
    runs = fig5.simulate(quick=True)
    data = fig5.staleness_data(runs)  # figure_data(quick) is staleness_data(simulate(quick))
    check_fig5_data(data, runs)
    fig = drawn_by_main(fig5, data, tmp_path)
    check_fig5_drawn(fig, data)
    tokens = data.bars["weight"] == "tokens"
    as_groups = data.bars.copy()
    as_groups.loc[tokens, "share"] = data.bars.loc[~tokens, "share"].to_numpy()  # token shares := group shares
    rejects(check_fig5_data, dataclasses.replace(data, bars=as_groups), runs)
    off = data.stats.assign(mean=data.stats["predicted"] + 0.1)
    rejects(check_fig5_data, dataclasses.replace(data, stats=off), runs)
    rejects(check_fig5_drawn, fig, dataclasses.replace(data, bars=as_groups))


# ---------------------------------------------------------------- figure 6: Theorem A.1 grid

def check_fig6_data(data: fig6.TheoremData, report) -> None:
    grid, named, tol = data.grid, data.named, data.tolerance
    g = report.grid
    assert tol == g.tolerance and len(grid) == len(g.phis) * len(g.mus) * len(g.shapes) * len(g.traces)
    assert sorted(zip(grid["phi"], grid["mu"])) == sorted((p, m) for p in g.phis for m in g.mus)
    assert len(named) == len(g.named) * len(g.shapes) * len(g.traces)
    for frame in (grid, named):
        same(frame["predicted"], frame["phi"] + (frame["mu"] - 1) / 2)  # docs/staleness.md#staleness-identity
        same(frame["error"], frame["measured"] - frame["predicted"])
        assert (frame["error"].abs() <= tol).all(), frame[["phi", "mu", "measured", "predicted"]]
        assert (frame["min"] <= frame["token_weighted_mean"]).all() and (frame["p90"] <= frame["max"]).all()
        assert (frame["measured"] <= frame["max"]).all()
        for dist, mean in zip(frame["distribution"], frame["measured"]):
            same(sum(dist.values()), 1.0, 1e-12)
            same(sum(int(d) * share for d, share in dist.items()), mean, 1e-9)
    same(grid["continuous_predicted"], grid["phi"] + grid["mu"] + (grid["mu"] - 1) / 2)
    assert (grid["continuous_error"].abs() <= tol).all()
    pairs = len(set(zip(grid["trace"], grid["B"])))
    assert ((grid["x"] - grid["predicted"]).abs() <= 0.02 * (pairs - 1) + 1e-12).all()
    same(grid["continuous_x"] - grid["continuous_predicted"], grid["x"] - grid["predicted"])
    assert f"over {len(grid) + len(named)} runs" in data.title
    boundary = pd.concat([grid["error"], named["error"]]).abs().max()  # every boundary run, presets too
    assert f"max |error| boundary {boundary:.3f}, continuous {grid['continuous_error'].abs().max():.3f}" in data.title


def check_fig6_drawn(fig, data: fig6.TheoremData) -> None:
    grid, named = data.grid, data.named
    expected = [  # per panel, the scatters in drawing order: (x, y)
        [(grid["x"], grid["measured"]), (named["predicted"], named["measured"]),
         (grid["continuous_x"], grid["continuous_measured"])],
        [(grid["x"], grid["error"]), (named["predicted"], named["error"]),
         (grid["continuous_x"], grid["continuous_error"])],
        [(grid["x"], grid["max"]), (grid["x"], grid["p90"]), (grid["x"], grid["token_weighted_mean"])],
    ]
    for ax, scatters in zip(fig.axes, expected, strict=True):
        drawn = [c.get_offsets() for c in ax.collections if isinstance(c, PathCollection)]
        assert len(drawn) == len(scatters)
        for offsets, (x, y) in zip(drawn, scatters):
            same(offsets, np.column_stack([x, y]))
    band = fig.axes[1].patches[0]
    same([band.get_y(), band.get_y() + band.get_height()], [-data.tolerance, data.tolerance])
    assert fig.get_suptitle() == data.title


def test_fig6_measured_means_are_within_the_tolerance_of_the_predictions(tmp_path):
    report = fig6.simulate(quick=True)
    data = fig6.theorem_data(report)  # figure_data(quick) is theorem_data(simulate(quick))
    check_fig6_data(data, report)
    fig = drawn_by_main(fig6, data, tmp_path)
    check_fig6_drawn(fig, data)
    off = data.grid.assign(measured=data.grid["measured"] + 2 * data.tolerance)
    rejects(check_fig6_data, dataclasses.replace(data, grid=off.assign(error=off["measured"] - off["predicted"])),
            report)
    rejects(check_fig6_data, dataclasses.replace(data, grid=data.grid.assign(x=data.grid["x"] + 0.1)), report)
    rejects(check_fig6_drawn, fig, dataclasses.replace(data, grid=off))


# ---------------------------------------------------------------- figure 7: prefix graph

def check_fig7_data(data: fig7.PrefixGraphData) -> None:
    from gyre.analysis.prefix_graph import SHARED
    from gyre.trajectory.tree import ROOT

    tree, stats, boxes = data.tree, data.stats, {b.node: b for b in data.boxes}
    assert len(data.boxes) == len(boxes) == stats.nodes
    assert sum(b.parent == ROOT for b in data.boxes) == stats.roots
    children = {n: [b for b in data.boxes if b.parent == n] for n in boxes}
    leaves = [b for b in data.boxes if not children[b.node]]
    assert len(leaves) == stats.leaves == len(data.roles)
    assert sorted(b.row for b in leaves) == list(range(stats.leaves))  # one row per candidate trajectory
    assert sorted(b.x1 for b in leaves) == sorted(stats.path_tokens)  # a leaf ends at its path's length
    for b in data.boxes:
        start, end = tree.node_range(b.node)
        assert b.x1 - b.x0 == end - start > 0
        assert b.x0 == (0 if b.parent == ROOT else boxes[b.parent].x1)
        kids = children[b.node]
        if kids:
            assert b.row == pytest.approx(np.mean([k.row for k in kids]))
            roles = {k.role for k in kids}
            assert b.role == (roles.pop() if len(roles) == 1 else SHARED)
        else:
            assert b.role == data.roles[b.node]
    assert f"{stats.requests} requests, {stats.nodes} nodes, {stats.leaves} candidate" in data.title


def check_fig7_drawn(fig, data: fig7.PrefixGraphData) -> None:
    ax = fig.axes[0]
    segments = [c for c in ax.collections if isinstance(c, LineCollection)][0].get_segments()
    same(np.array(segments), [[(b.x0 / 1e3, b.row), (b.x1 / 1e3, b.row)] for b in data.boxes])
    parents = {b.parent for b in data.boxes}
    (ends,) = [c for c in ax.collections if isinstance(c, PathCollection)]
    same(ends.get_offsets(), [(b.x1 / 1e3, b.row) for b in data.boxes if b.node not in parents])
    assert ax.get_title() == data.title


def test_fig7_prefix_graph_has_one_box_per_tree_node(monkeypatch, tmp_path):
    import matplotlib.pyplot as plt

    data = fig7.figure_data(quick=True)
    check_fig7_data(data)
    assert data.stats.roots > 1 and data.stats.leaves > data.stats.roots  # sub-agents, compactions, retries
    drawn, close = [], plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: (drawn.append(fig), close(fig)))  # matplotlib's, not ours
    paths = fig7.main(tmp_path, quick=True, data=data)
    assert [p.name for p in paths] == ["fig7_prefix_graph.png", "fig7_prefix_graph.svg"] and len(drawn) == 2
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "<svg" in paths[1].read_text()
    for fig in drawn:
        check_fig7_drawn(fig, data)
    moved = [dataclasses.replace(data.boxes[0], row=data.boxes[0].row + 1)] + data.boxes[1:]
    rejects(check_fig7_data, dataclasses.replace(data, boxes=moved))
    rejects(check_fig7_data, dataclasses.replace(data, boxes=data.boxes[:-1]))
    rejects(check_fig7_drawn, drawn[0], dataclasses.replace(data, boxes=moved))


# ---------------------------------------------------------------- the command and the scripts

def test_figs_command_runs_a_subset_and_writes_the_data(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    figs_cli.register(parser.add_subparsers())
    args = parser.parse_args(["figs", "--out", str(tmp_path), "--quick", "--only", "fig2_durations"])
    assert args.func(args) == 0
    assert (tmp_path / "fig2_durations.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = (tmp_path / "fig2_durations.svg").read_text()
    assert "n = 3,200" in svg and "n = 200" in svg and "duration (h)" in svg  # the panels' counts, as text
    assert "[1/1] fig2_durations" in capsys.readouterr().out
    bad = parser.parse_args(["figs", "--out", str(tmp_path), "--only", "fig9"])
    assert bad.func(bad) == 2


@pytest.mark.slow
def test_a_figure_script_runs_on_its_own(tmp_path):
    script = REPO / "paper_figs" / "fig2_durations.py"
    done = subprocess.run([sys.executable, str(script), str(tmp_path), "--quick"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "MPLBACKEND": "Agg"})
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "fig2_durations.svg").stat().st_size > 0


def test_make_all_run_as_a_script_loads_every_figure():
    spec = importlib.util.spec_from_file_location("make_all_as_script", REPO / "paper_figs" / "make_all.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert not script.__package__  # the file-path branch, as ``python paper_figs/make_all.py DIR``
    try:
        for name in script.FIGURES:
            module = script.load_figure(name)
            assert module is script.load_figure(name) and callable(module.figure_data) and callable(module.main)
    finally:
        for name in script.FIGURES:
            sys.modules.pop(f"paper_figs_{name}", None)
