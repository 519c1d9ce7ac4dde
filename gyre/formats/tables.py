"""The one CSV writer for every table a run leaves behind.

Invariants: columns come out in the order given; ``None`` is written as an
empty cell and floats with six decimals, so equal rows give equal bytes.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Iterable


def cell(value: Any) -> Any:
    """How one value is written: '' for None, six decimals for floats."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6f}"
    return value


def write_csv(path: str | Path, columns: Iterable[str], rows: Iterable[dict[str, Any]]) -> Path:
    """Write ``rows`` (dicts; missing keys become empty cells) under a header of ``columns``."""
    path, columns = Path(path), list(columns)
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow([cell(row.get(c)) for c in columns])
    return path
