"""``toy.learning_replica``: the offline replica of the CPU demo's learning loop (its docstring's invariants).

On the tests' tiny random Qwen2 (the demo's shape): a seed gives the same
curve twice and another seed another curve; each step's groups are sampled by
the version the staleness pattern names; the rise check is the e2e test's
(``reward_trend``'s t >= 4 and the last five steps above the first five);
and the command line prints one JSON line per seed and a count on stderr,
and names a bad seed range or step count before loading anything.
"""

from __future__ import annotations

import json

import pytest

from gyre.analysis.real_run import reward_trend
from gyre.real.toy.learning_replica import Loop, Settings, main, staleness_at

try:
    from proxy_fixtures import shared_tiny_dir
except ImportError:
    from .proxy_fixtures import shared_tiny_dir


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    from gyre.real.toy.tiny_model import build_tiny_qwen2

    return build_tiny_qwen2(shared_tiny_dir(tmp_path_factory, "tiny-qwen2"))


def test_the_staleness_pattern_starts_then_alternates_its_last_two():
    assert [staleness_at(Settings(), s) for s in range(8)] == [0, 1, 2, 1, 2, 1, 2, 1]
    assert [staleness_at(Settings(staleness=(0, 1)), s) for s in range(5)] == [0, 1, 0, 1, 0]
    assert [staleness_at(Settings(staleness=(1,)), s) for s in range(3)] == [1, 1, 1]


def test_a_seed_replays_its_curve_and_samples_by_the_stale_versions(qwen2):
    loop = Loop(str(qwen2), Settings(steps=5, max_tokens=4))
    first, again, other = loop.run(0), loop.run(0), loop.run(1)
    assert first == again
    assert first.curve != other.curve
    assert len(first.curve) == 5 and all(0.0 <= r <= 1.0 for r in first.curve)
    assert first.versions == [[0, 0], [0, 0], [0, 0], [2, 2], [2, 2]]  # step - staleness: 0, 1-1, 2-2, 3-1, 4-2
    assert 0.0 <= first.clip_fraction <= 1.0
    assert first.t == reward_trend(first.curve)[1]
    k = 5
    assert first.rose == (first.t >= 4 and sum(first.curve[-k:]) > sum(first.curve[:k]))


def test_the_command_prints_a_line_per_seed_and_a_count(qwen2, capsys):
    assert main(["--model", str(qwen2), "--seeds", "3:5", "--steps", "3", "--max-tokens", "2"]) == 0
    out, err = capsys.readouterr()
    lines = [json.loads(line) for line in out.splitlines()]
    assert [r["seed"] for r in lines] == [3, 4] and all(len(r["curve"]) == 3 for r in lines)
    assert f"{sum(r['rose'] for r in lines)} of 2 rose in 3 steps" in err


@pytest.mark.parametrize("argv, message", [(["--seeds", "a:b"], "is not FIRST:END"),
                                           (["--seeds", "5:5"], "names no seed"),
                                           (["--steps", "2"], "at least 3 steps"),
                                           (["--steps", "many"], "at least 3 steps"),
                                           ([], "/nonexistent: no config.json there")])
def test_the_command_names_a_bad_range_or_step_count(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", "/nonexistent", *argv])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
