"""Cost files: a TOML ``[costs]`` table of ``CostModel`` fields (``gyre sim --costs FILE``).

``gyre calibrate RUN_DIR`` writes one from a real run; anyone may write one by
hand. ``--cost key=value`` overrides still apply on top of the file.

Invariants: every key is a ``CostModel`` field (an unknown key, a removed
one, a non-number or an impossible value raises ``CostError`` naming the file
and the key); a file without a ``[costs]`` table is an error, not defaults.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from gyre.sim.costs import CostError, CostModel, parse_cost_overrides


def load_cost_file(path: str | Path) -> dict[str, Any]:
    """The ``[costs]`` table of ``path`` as CostModel keyword arguments (checked)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise CostError(f"cost file {path}: not found") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise CostError(f"cost file {path}: {exc}") from None
    table = data.get("costs")
    if not isinstance(table, dict):
        raise CostError(f"cost file {path}: no [costs] table")
    for key, value in table.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CostError(f"cost file {path}: {key} must be a number, got {value!r}")
    try:
        fields = parse_cost_overrides([f"{k}={v!r}" for k, v in table.items()])
        CostModel(**fields)
    except CostError as exc:
        raise CostError(f"cost file {path}: {exc}") from None
    return fields
