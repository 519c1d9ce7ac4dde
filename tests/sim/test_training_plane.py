"""The simulated training plane against hand-computed timings, and the cost switches."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gyre import events as ev
from gyre.config import SchedulerConfig
from gyre.formats.trace import Trace
from gyre.sim.clock import Clock
from gyre.sim.costs import CostError, CostModel, parse_cost_overrides
from gyre.sim.runner import run_simulation
from gyre.sim.sizes import FALLBACK_EXECUTION_TOKENS
from gyre.sim.traces.presets import generate_trace
from gyre.sim.training import SimTrainingPlane

# a group of N = 2 executions, each FALLBACK_EXECUTION_TOKENS (no trace), over the token budget: two
# micro-steps of 10 node-s (peak throughput set so; 6 FLOPs x 1e9 active parameters per token, utilisation 1)
COSTS = CostModel(active_params_b=1.0, train_utilisation=1.0,
                  node_peak_tflops=6e9 * FALLBACK_EXECUTION_TOKENS / 10.0 / 1e12, warmup_s=5.0, drain_s=1.0,
                  grad_reduce_s=1.0, optimizer_s=1.0)


def plane_with(members: int, streaming: bool = False) -> tuple[Clock, SimTrainingPlane, list]:
    env = Clock()
    cfg = SchedulerConfig(K=2, C_e=2, C_s=2, N=2, B=1, phi=0.0, mu=1, nodes_per_cell=1, streaming=streaming)
    sent: list = []
    plane = SimTrainingPlane(env, cfg, COSTS, sent.append)
    for cell in range(members):
        plane.join(cell)
    return env, plane, sent


@pytest.mark.parametrize("members, step_done_at", [(1, 28.0), (2, 18.0)])
def test_micro_steps_split_across_cells(members, step_done_at):
    # one cell: warm-up 5 + 10, then 10, then drain + reduce + optimizer 3 = 28
    # two cells: each claims one micro-step (5 + 10), then 3 = 18
    env, plane, sent = plane_with(members)
    plane.start_batch(0)
    plane.feed(0, (0,))
    env.run()
    assert sent == [ev.StepDone(step_done_at, 0)]
    assert sum(plane.micro_steps_by_cell.values()) == 2
    assert len(plane.micro_steps_by_cell) == members


def test_a_cell_whose_micro_step_ends_while_it_is_held_claims_the_next_when_the_hold_ends():
    """A busy cell's micro-step ends during its hold (parameters being received): the next queued micro-step
    waits for the hold's end, even with no other cell free (the micro-step end's own claim path)."""
    env, plane, sent = plane_with(1)
    plane.start_batch(0)
    plane.feed(0, (0,))  # cell 0 claims the first: warm-up 5 + 10, ending at t = 15
    plane.hold((0,), 30.0)  # held until t = 30
    env.run()
    assert sent == [ev.StepDone(43.0, 0)]  # the second runs 30-40, then drain + reduce + optimizer 3
    assert plane.micro_steps_by_cell == {0: 2}


def test_a_micro_step_end_lets_an_idle_cell_free_at_that_instant_claim_first():
    """Cell 1's micro-step ends at t = 15, the instant cell 0's weight pull ends (its wake-up comes later on the
    clock): both claim at that end, in cell order (cell 0 first), as a claim pass over the idle cells does."""
    env = Clock()
    cfg = SchedulerConfig(K=2, C_e=3, C_s=3, N=3, B=1, phi=0.0, mu=1, nodes_per_cell=1, streaming=False)
    plane = SimTrainingPlane(env, cfg, COSTS, lambda event: None)
    plane.join(1)
    plane.start_batch(0)
    plane.feed(0, (0,))  # three micro-steps of 10 node-s: cell 1 runs the first (warm-up 5 + 10, to t = 15)
    plane.join(0, 15.0)  # free from t = 15
    env.step()  # t = 15: cell 1's micro-step ends (called before cell 0's wake-up at the same instant)
    assert env.now == 15.0 and plane.micro_steps_by_cell == {0: 1, 1: 2} and not plane.queue


def test_streaming_asks_for_groups_and_a_late_joiner_pays_its_pull():
    env, plane, sent = plane_with(1, streaming=True)
    plane.start_batch(0)
    assert sent == []  # asked asynchronously: after the instant's claims, as a real plane's ask arrives
    env.step()  # the ask (a zero-delay event at t = 0)
    assert sent == [ev.GroupWanted(0)]
    plane.feed(0, (0,))
    plane.join(1, delay=12.0)  # cell 1 is free at 12, before cell 0 at 15: it claims micro-step 2
    env.run()
    assert sent[-1] == ev.StepDone(12.0 + 5.0 + 10.0 + 3.0, 0)
    assert plane.micro_steps_by_cell == {0: 1, 1: 1}


def test_satellites_join_training_in_an_elastic_run():
    trace = generate_trace("nl2repo-122b", 120, np.random.default_rng(0))
    result = run_simulation("E0", trace, steps=6, seed=0)
    steps = result.record.step_rows()
    assert len(steps) == 6 and max(s["training_cells_max"] for s in steps) > 1


def test_cost_switches_slow_the_run_down():
    trace = generate_trace("nl2repo-122b", 120, np.random.default_rng(0))
    base = run_simulation("E0", trace, steps=6, seed=0).summary["total_hours"]
    # traces recorded at half load: full engines run slower than the trace durations (processor sharing)
    loaded = run_simulation("E0", trace, steps=6, seed=0, costs=CostModel(engine_reference_load=0.5))
    assert loaded.summary["total_hours"] > base
    # load-independent engines, so the recompute is exactly extra seconds
    rerouted = run_simulation("E0", trace, steps=6, seed=0,
                              costs=CostModel(engine_load_alpha=0.0, reroute_recompute_s=3600.0))
    assert rerouted.summary["reroutes"] > 0
    moved = [r for r in rerouted.record.executions.values() if r["reroutes"] and r["end_s"] is not None]
    plain = run_simulation("E0", trace, steps=6, seed=0, costs=CostModel(engine_load_alpha=0.0)).record.executions
    x = moved[0]["execution"]
    assert moved[0]["end_s"] - moved[0]["start_s"] == pytest.approx(
        plain[x]["end_s"] - plain[x]["start_s"] + 3600.0 * moved[0]["reroutes"])


def test_bad_costs_name_the_field():
    with pytest.raises(CostError, match="warmup_s"):
        CostModel(warmup_s=-1)
    with pytest.raises(CostError, match="micro_step_tokens"):
        CostModel(micro_step_tokens=0)
    with pytest.raises(CostError, match="micro_steps_per_group was removed.*micro_step_tokens"):
        parse_cost_overrides(["micro_steps_per_group=4"])
    with pytest.raises(CostError, match="unknown cost field 'speed'"):
        parse_cost_overrides(["speed=2"])


def _token_trace(tokens: list[list[int]], outcomes: list[list[str]]) -> Trace:
    rows = [{"query_id": q, "execution_index": i, "duration_s": 60.0, "outcome": outcomes[q][i],
             "input_tokens": 0, "output_tokens": t} for q, group in enumerate(tokens) for i, t in enumerate(group)]
    return Trace(pd.DataFrame(rows), N=len(tokens[0]), source="test")


def test_groups_pack_into_micro_steps_by_the_real_packers_rule():
    """Excluded executions train nothing; small ones wait for the batch's last group, then pack together."""
    done, out = "completed", "overall_timeout"
    trace = _token_trace([[3000, 500, 400], [100, 4000, 200], [50, 60, 70]],
                         [[done, done, out], [done, done, done], [out, out, out]])
    cfg = SchedulerConfig(K=2, C_e=3, C_s=3, N=3, B=2, phi=0.0, mu=1, nodes_per_cell=1, streaming=False)
    costs = CostModel(active_params_b=1.0, train_utilisation=1.0, node_peak_tflops=6e-3, warmup_s=0.0,
                      drain_s=0.0, grad_reduce_s=0.0, optimizer_s=0.0).bind(cfg, trace)  # 1 node-s per token
    env, sent = Clock(), []
    plane = SimTrainingPlane(env, cfg, costs, sent.append)
    plane.join(0)
    plane.join(1)
    plane.start_batch(0)
    plane.feed(0, (0,))
    assert list(plane.queue) == [] and plane.pending == [3000, 500]  # 3500 < 0.9 x 4096: kept; 400 excluded
    plane.feed(0, (1,))  # the last group flushes: [4000] and [3000 + 500 + 200 + 100]
    env.run()  # cell 0 trains the 4000 tokens, cell 1 the 3800
    assert plane.micro_steps_by_cell == {0: 1, 1: 1} and sent == [ev.StepDone(4000.0, 0)]
    assert plane.work_node_s == pytest.approx(7800.0)
    plane.start_batch(1)
    plane.feed(1, (2, 2))  # nothing trains: the batch ends with no micro-step
    env.run()
    assert sent[-1] == ev.StepDone(4000.0, 1) and plane.micro_steps_by_cell == {0: 1, 1: 1}


OPERATIONS = st.lists(st.one_of(
    st.tuples(st.just("join"), st.integers(0, 3), st.sampled_from([0.0, 4.0, 12.0])),
    st.tuples(st.just("leave"), st.integers(0, 3), st.just(0.0)),
    st.tuples(st.just("hold"), st.integers(0, 3), st.sampled_from([0.0, 7.0])),
    st.tuples(st.just("step"), st.integers(1, 4), st.just(0.0)),
    st.tuples(st.just("feed"), st.just(0), st.just(0.0)),
), max_size=40)


@settings(max_examples=60, deadline=None)
@given(OPERATIONS)
@example([("join", 0, 0.0), ("feed", 0, 0.0), ("join", 1, 0.0), ("join", 0, 0.0), ("step", 4, 0.0)])
def test_free_members_claim_in_cell_order_and_run_one_micro_step_each(operations):
    """The plane keeps its idle members (those not running a micro-step) in cell order, whatever joins,
    leaves (of idle cells), feeds, holds and micro-step ends come (a cell re-joining while busy included);
    after each change no free member leaves a queued micro-step unclaimed, and every busy member has its
    micro-step's end on the clock."""
    env = Clock()
    cfg = SchedulerConfig(K=4, C_e=2, C_s=2, N=2, B=50, phi=0.0, mu=1, nodes_per_cell=1)
    plane = SimTrainingPlane(env, cfg, COSTS, lambda event: None)
    plane.start_batch(0)
    fed = 0
    for kind, cell, seconds in operations:
        if kind == "join":
            plane.join(cell, seconds)
        elif kind == "leave" and cell in plane.members and not plane.members[cell].busy:
            plane.leave(cell)
        elif kind == "hold":
            plane.hold((cell,), seconds)
        elif kind == "step":
            for _ in range(cell):
                if env.queue:
                    env.step()
        elif kind == "feed" and fed < cfg.B:
            fed += 1
            plane.feed(0, (fed,))
        members = plane.members
        assert plane._idle == sorted(c for c, m in members.items() if not m.busy)
        free = [c for c in plane._idle if members[c].available_at <= env.now]
        assert not (plane.queue and free)
        running = [args[0] for _, _, fn, args in env.queue if getattr(fn, "__name__", "") == "_micro_step_done"]
        busy = [c for c, m in members.items() if m.busy]
        assert set(busy) <= set(running) and len(running) == plane.in_flight
