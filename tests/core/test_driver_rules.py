"""The rules both drivers share (``gyre.driver_rules``) and a group's staleness (``gyre.staleness``).

Each rule is checked once here, against its statement in the module
docstring, over every small input (the inputs are a handful of counters);
the simulator and the real backend only call these functions.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from gyre.config import SchedulerConfig
from gyre.driver_rules import (
    CATEGORIES,
    EMIT_FILL,
    asks_for_group,
    breakdown_category,
    first_fit_decreasing,
    is_satellite,
    pack_micro_steps,
)
from gyre.presets import build_preset
from gyre.staleness import group_staleness, staleness_by_group


@pytest.mark.parametrize("name", ["E0", "E2", "async", "colocate"])
def test_satellites_are_the_cells_outside_the_core_unit_and_the_static_split(name: str) -> None:
    cfg = build_preset(name)
    satellites = [c for c in range(cfg.K) if is_satellite(cfg, c)]
    assert satellites == ([] if cfg.static else [c for c in range(cfg.K) if c not in cfg.core_unit])
    assert not set(satellites) & set(cfg.core_unit)


def test_satellites_by_granularity() -> None:
    base = dict(K=4, C_e=2, C_s=2, N=1, B=2, phi=1.0, mu=2, rho_min=0.5, tau=0.0)
    fine = SchedulerConfig(**base, granularity="fine")
    whole = SchedulerConfig(**base, granularity="global")
    static = SchedulerConfig(**base, granularity="none", static_train_cells=2)
    assert [is_satellite(fine, c) for c in range(4)] == [False, True, True, True]
    assert not any(is_satellite(whole, c) for c in range(4))   # every cell switches with the core
    assert not any(is_satellite(static, c) for c in range(4))  # a static split has no satellite


def test_the_group_ask_rule_over_every_small_state() -> None:
    for asked, fed, queued, cells in itertools.product(range(3), range(5), range(5), range(4)):
        wants = asks_for_group(asked=asked, fed=fed, batch_size=3, queued=queued, training_cells=cells)
        expected = asked == 0 and fed < 3 and queued < max(1, cells)
        assert wants == expected, (asked, fed, queued, cells)


def test_the_group_ask_rule_boundaries() -> None:
    ask = dict(asked=0, fed=0, batch_size=2, queued=1, training_cells=2)
    assert asks_for_group(**ask)
    assert not asks_for_group(**{**ask, "asked": 1})          # one ask outstanding at a time
    assert not asks_for_group(**{**ask, "fed": 2})            # the batch has its B groups
    assert not asks_for_group(**{**ask, "queued": 2})         # as many micro-steps queued as cells train
    assert asks_for_group(**{**ask, "queued": 0, "training_cells": 0})  # no member yet: an empty queue asks
    assert not asks_for_group(**{**ask, "training_cells": 0})


def test_breakdown_category_first_match_in_order() -> None:
    flags = (False, True)
    for running, training, publishing, switching in itertools.product((0, 1, 3, 4), flags, flags, flags):
        got = breakdown_category(running=running, capacity=4, training=training, publishing=publishing,
                                 switching=switching)
        assert got in CATEGORIES
        if running >= 4:
            assert got == "rollout_full"
        elif running > 0:
            assert got == "rollout_tail"   # training hidden behind rollout counts as rollout
        elif training:
            assert got == "training_exposed"
        elif publishing:
            assert got == "publication"
        elif switching:
            assert got == "transitions"
        else:
            assert got == "waiting"


def test_breakdown_full_at_capacity_up_to_rounding() -> None:
    edge = dict(capacity=3.0, training=False, publishing=False, switching=False)
    assert breakdown_category(running=3.0 - 1e-12, **edge) == "rollout_full"  # float sums of interval levels
    assert breakdown_category(running=2.0, **edge) == "rollout_tail"


def test_group_staleness() -> None:
    assert group_staleness(v_d=2, v_t=5) == 3
    assert group_staleness(v_d=4, v_t=4) == 0
    with pytest.raises(ValueError, match="dispatched at version 5 cannot be trained at version 4"):
        group_staleness(v_d=5, v_t=4)
    assert list(staleness_by_group({0: 0, 1: 1, 2: 1}, {2: 3, 0: 1}).items()) == [(0, 1), (2, 2)]


sizes_st = st.lists(st.integers(min_value=1, max_value=5000), max_size=24)


@settings(max_examples=examples(400), deadline=None)
@given(sizes=sizes_st, budget=st.integers(min_value=1, max_value=6000), flush=st.booleans())
def test_micro_step_packing_places_every_execution_once(sizes: list[int], budget: int, flush: bool) -> None:
    emitted, kept = pack_micro_steps(sizes, budget, flush=flush)
    assert sorted([i for bin_ in emitted for i in bin_] + kept) == list(range(len(sizes)))
    assert all(bin_ for bin_ in emitted)
    for bin_ in emitted:
        load = sum(sizes[i] for i in bin_)
        assert len(bin_) == 1 or load <= budget  # only a lone execution over the budget exceeds it
        assert flush or load >= EMIT_FILL * budget  # before the flush, only what is full enough leaves
    if flush:
        assert kept == []
    # first-fit decreasing: each bin's first execution is no smaller than any later bin's
    bins = first_fit_decreasing(sizes, budget)
    firsts = [sizes[b[0]] for b in bins]
    assert firsts == sorted(firsts, reverse=True)
    # no execution of a later bin fitted into an earlier one when it was placed
    for b, bin_ in enumerate(bins):
        for i in bin_:
            placed_before = [sum(sizes[j] for j in earlier if (-sizes[j], j) < (-sizes[i], i)) for earlier in bins[:b]]
            assert all(load + sizes[i] > budget for load in placed_before)


@settings(max_examples=examples(200), deadline=None)
@given(sizes=st.lists(st.sampled_from([1.0, 2.5, 2.5, 7.0, 3000.0]), max_size=24),
       budget=st.sampled_from([1.0, 4.0, 6000.0]))
def test_first_fit_takes_executions_in_decreasing_size_ties_in_input_order(sizes: list[float],
                                                                          budget: float) -> None:
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))  # the rule, spelled out
    bins = first_fit_decreasing(sizes, budget)
    placed = sorted((i for bin_ in bins for i in bin_), key=order.index)
    assert placed == order and all(bin_ == sorted(bin_, key=order.index) for bin_ in bins)
    if len(sizes) > 1 and sizes[order[-1]] + sizes[order[-2]] > budget:  # no two fit: one bin each, in order
        assert bins == [[i] for i in order]


def test_micro_step_packing_by_hand() -> None:
    # 4000 alone; 3000 + 500 + 200 + 100 = 3800 <= 4096; nothing reaches 0.9 x 4096 = 3686.4 except both bins
    emitted, kept = pack_micro_steps([3000, 500, 100, 4000, 200], 4096, flush=False)
    assert emitted == [[3], [0, 1, 4, 2]] and kept == []
    emitted, kept = pack_micro_steps([3000, 500], 4096, flush=False)
    assert emitted == [] and kept == [0, 1]  # 3500 waits for more
    assert pack_micro_steps([3000, 500], 4096, flush=True) == ([[0, 1]], [])
    assert pack_micro_steps([], 4096, flush=True) == ([], [])
    with pytest.raises(ValueError, match="token_budget"):
        pack_micro_steps([1], 0, flush=True)
