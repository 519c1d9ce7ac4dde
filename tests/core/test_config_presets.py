"""Configuration validation, override parsing, presets, and the light-import rule."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gyre.config import ConfigError, SchedulerConfig, parse_overrides
from gyre.presets import ABLATION_NAMES, METHOD_NAMES, PRESETS, WORKLOAD_SHAPES, build_preset


@pytest.mark.parametrize("fields, field", [
    ({"K": 0}, "K"), ({"phi": -0.5}, "phi"), ({"mu": 0}, "mu"), ({"C_e": 0}, "C_e"),
    ({"rho_min": 0.0}, "rho_min"), ({"tau": -1.0}, "tau"), ({"B": 0}, "B"), ({"N": 0}, "N"),
    ({"phi": 0.3, "B": 32}, "phi"), ({"granularity": "medium"}, "granularity"),
    ({"granularity": "none", "static_train_cells": 0}, "static_train_cells"),
    ({"granularity": "none", "static_train_cells": 9, "K": 8}, "static_train_cells"),
    ({"granularity": "none", "static_train_cells": 8, "K": 8, "C_s": 0}, "static_train_cells"),
    ({"static_train_cells": 2}, "static_train_cells"), ({"mu": 1.5}, "mu"),
])
def test_impossible_configs_name_the_field(fields, field):
    with pytest.raises(ConfigError, match=field):
        SchedulerConfig(**fields)


def test_overrides_parse_like_the_paper():
    assert parse_overrides(["phi=0.5", "mu=3", "streaming=off", "granularity=coarse"]) == {
        "phi": 0.5, "mu": 3, "streaming": False, "granularity": "coarse"}
    with pytest.raises(ConfigError, match="unknown field 'rho'"):
        parse_overrides(["rho=1"])
    with pytest.raises(ConfigError, match="mu: cannot parse"):
        parse_overrides(["mu=three"])
    with pytest.raises(ConfigError, match="not key=value"):
        parse_overrides(["phi"])


@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.parametrize("workload", sorted(WORKLOAD_SHAPES))
def test_every_preset_builds_on_every_workload(name, workload):
    cfg = build_preset(name, WORKLOAD_SHAPES[workload])
    assert cfg.B == WORKLOAD_SHAPES[workload].B


def test_presets_match_spec_table():
    expected = {  # id: (phi, mu, granularity, streaming, training/colocated nodes, separate nodes)
        "A0": (1.5, 1, "none", False), "A1": (1.5, 1, "none", False), "A2": (0.5, 3, "none", False),
        "A3": (1.5, 1, "none", True), "C0": (0.0, 4, "global", False), "C1": (0.5, 3, "coarse", False),
        "C2": (0.5, 3, "coarse", True), "C3": (0.5, 3, "coarse", True), "E0": (0.5, 3, "fine", True),
        "E1": (1.5, 1, "fine", True), "E2": (0.5, 3, "fine", True)}
    for name, (phi, mu, gran, streaming) in expected.items():
        cfg = build_preset(name)
        assert (cfg.phi, cfg.mu, cfg.granularity, cfg.streaming) == (phi, mu, gran, streaming), name
        assert cfg.predicted_staleness == 1.5
    assert build_preset("A0").static_train_cells * 4 == 16 and build_preset("A1").static_train_cells * 4 == 8
    assert build_preset("C1").K * 4 == 28 and build_preset("C1").C_s == 4 * 36
    assert build_preset("C3").K * 4 == 16 and build_preset("C3").C_s == 16 * 36
    assert (build_preset("E0").K, build_preset("E0").C_e) == (8, 144)
    assert (build_preset("E2").K, build_preset("E2").C_e, build_preset("E2").nodes_per_cell) == (4, 288, 8)
    assert set(ABLATION_NAMES) == set(expected)
    for name in METHOD_NAMES:
        target = float(name.split("-")[1])
        assert build_preset(name).predicted_staleness == target


def test_preset_overrides_validate():
    assert build_preset("E0", phi=1.0).phi == 1.0
    with pytest.raises(ConfigError, match="unknown preset 'E9'"):
        build_preset("E9")
    with pytest.raises(ConfigError, match="mu"):
        build_preset("E0", mu=0)


def test_policy_core_imports_nothing_heavy():
    code = ("import sys, gyre, gyre.scheduler, gyre.presets, gyre.config, gyre.events, gyre.actions; "
            "heavy = {'torch', 'megatron', 'sglang', 'mooncake', 'aiohttp', 'fastapi', 'uvicorn', 'httpx', "
            "'simpy', 'pandas', 'matplotlib', 'numpy', 'scipy', 'ray', 'transformers'}; "
            "print(sorted(heavy & {m.split('.')[0] for m in sys.modules}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
