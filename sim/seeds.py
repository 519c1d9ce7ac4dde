"""Grid figures over trace seeds: mean and spread, and the pairwise orderings that hold on every seed.

A figure from one trace seed can hinge on which queries the seed drew; a
grid run with ``--seeds S`` repeats every run on seeds ``seed .. seed+S-1``
and reports each figure as its mean and its spread (the sample standard
deviation over seeds, 0 for one seed; min and max beside it), and, for the
total time, every ordered pair ``a < b`` (a finishes sooner) that holds on
every seed; a pair whose order changes with the seed is listed as unsettled.

Invariants: a mean lies between its min and max; a pair is "holds" exactly
when ``a``'s total is below ``b``'s on every seed, so at most one of
``a < b`` and ``b < a`` holds and a pair is either settled or unsettled.
"""

from __future__ import annotations

from itertools import combinations
from typing import Any, Mapping, Sequence

import numpy as np


def spread_row(values: Sequence[float | None]) -> dict[str, float | None]:
    """Mean, sample standard deviation, min and max of one figure over seeds (None values left out)."""
    xs = np.array([v for v in values if v is not None], dtype=float)
    if xs.size == 0:
        return {"mean": None, "sd": None, "min": None, "max": None}
    return {"mean": round(float(xs.mean()), 6), "sd": round(float(xs.std(ddof=1)) if xs.size > 1 else 0.0, 6),
            "min": round(float(xs.min()), 6), "max": round(float(xs.max()), 6)}


def orderings(hours: Mapping[str, Sequence[float]]) -> tuple[list[str], list[str]]:
    """(orderings that hold on every seed as "a < b", unsettled pairs as "a ~ b") of total times."""
    settled, unsettled = [], []
    for a, b in combinations(hours, 2):
        xa, xb = np.asarray(hours[a], float), np.asarray(hours[b], float)
        if (xa < xb).all():
            settled.append(f"{a} < {b}")
        elif (xb < xa).all():
            settled.append(f"{b} < {a}")
        else:
            unsettled.append(f"{a} ~ {b}")
    return settled, unsettled


def seed_rows(label: str, names: Sequence[str], per_seed: Mapping[str, Sequence[Mapping[str, Any]]],
              keys: Sequence[str]) -> list[dict[str, Any]]:
    """One row per name: ``label`` = name, then ``key_mean`` and ``key_sd`` per figure."""
    rows = []
    for name in names:
        row: dict[str, Any] = {label: name, "seeds": len(per_seed[name])}
        for key in keys:
            s = spread_row([summary.get(key) for summary in per_seed[name]])
            row[f"{key}_mean"], row[f"{key}_sd"] = s["mean"], s["sd"]
        rows.append(row)
    return rows


def format_orderings(settled: list[str], unsettled: list[str], seeds: int) -> str:
    lines = [f"orderings of total time holding on every one of {seeds} seed(s): "
             + (", ".join(settled) if settled else "none")]
    lines.append("unsettled (the order changes with the seed): " + (", ".join(unsettled) if unsettled else "none"))
    return "\n".join(lines)
