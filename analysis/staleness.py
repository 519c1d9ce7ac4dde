"""Staleness statistics of consumed groups (docs/staleness.md#staleness-identity).

Staleness of a consumed group is d = v_t - v_d. Statistics:
- ``mean``: group-weighted mean, the quantity Theorem A.1 predicts;
- ``token_weighted_mean``: sum(d * tokens) / sum(tokens), what the optimizer
  actually sees when long executions carry more tokens (NaN without tokens);
- ``max``, ``min`` and percentiles ``p50``/``p90``/``p99``: percentiles are
  taken with numpy's ``inverted_cdf`` method, so they are staleness values
  that actually occur (no interpolation between integers);
- ``distribution``: share of groups at each staleness value.

The steady-state window (``steady_window``) and the predicted mean are
defined once, in ``gyre.staleness``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

PERCENTILES = (50, 90, 99)


def in_window(groups: pd.DataFrame, window: tuple[int, int] | None) -> pd.DataFrame:
    """Consumed groups whose training version v_t lies in [first, stop) (all consumed if None)."""
    consumed = groups[groups["staleness"].notna()]
    if window is None:
        return consumed
    first, stop = window
    return consumed[(consumed["v_t"] >= first) & (consumed["v_t"] < stop)]


def staleness_stats(groups: pd.DataFrame, window: tuple[int, int] | None = None) -> dict[str, Any]:
    """Summary statistics of the staleness of consumed groups (see module docstring).

    ``groups`` needs columns ``staleness`` and ``v_t`` (and ``tokens`` for the
    token-weighted mean). An empty selection gives ``groups`` 0 and NaN elsewhere.
    """
    chosen = in_window(groups, window)
    d = chosen["staleness"].to_numpy(dtype=float)
    out: dict[str, Any] = {"groups": int(d.size)}
    if d.size == 0:
        out.update(mean=math.nan, token_weighted_mean=math.nan, min=math.nan, max=math.nan,
                   **{f"p{q}": math.nan for q in PERCENTILES})
        return out
    tokens = chosen["tokens"].to_numpy(dtype=float) if "tokens" in chosen else np.array([])
    weighted = float(np.average(d, weights=tokens)) if tokens.size and tokens.sum() > 0 else math.nan
    out.update(mean=float(d.mean()), token_weighted_mean=weighted, min=float(d.min()), max=float(d.max()))
    for q in PERCENTILES:
        out[f"p{q}"] = float(np.percentile(d, q, method="inverted_cdf"))
    return out


def staleness_distribution(groups: pd.DataFrame, window: tuple[int, int] | None = None) -> pd.Series:
    """Share of consumed groups at each staleness value, indexed by the integer value (sums to 1)."""
    d = in_window(groups, window)["staleness"].astype(int)
    if d.empty:
        return pd.Series(dtype=float, name="share")
    counts = d.value_counts().sort_index()
    return (counts / counts.sum()).rename("share").rename_axis("staleness")


def token_distribution(groups: pd.DataFrame, window: tuple[int, int] | None = None) -> pd.Series:
    """Share of consumed *tokens* at each staleness value (sums to 1)."""
    chosen = in_window(groups, window)
    if chosen.empty or chosen["tokens"].sum() <= 0:
        return pd.Series(dtype=float, name="share")
    tokens = chosen.groupby(chosen["staleness"].astype(int))["tokens"].sum().sort_index()
    return (tokens / tokens.sum()).rename("share").rename_axis("staleness")
