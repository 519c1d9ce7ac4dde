"""Example counts per test tier (see tests/conftest.py)."""

from __future__ import annotations

import os


def examples(full: int) -> int:
    """``full`` examples under ``make test``; an eighth (at least 10) under ``make check``."""
    if os.environ.get("GYRE_TEST_TIER", "full") == "check":
        return max(10, full // 8)
    return full
