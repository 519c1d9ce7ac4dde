"""The checks of ``Trace.from_columns``: a trace's table as numpy columns, validated without pandas.

A generator (``gyre.sim.traces``) draws its columns already in the normalized
form ``Trace(frame)`` produces; this module holds them to the same format
(``gyre.formats.trace``'s invariants) with numpy alone, so a simulation on a
generated trace never imports pandas.

Invariants: ``check_columns`` returns only for columns that ``Trace(frame)``
would accept and leave unchanged: every required column, rows > 0, all columns
of one length, numbers finite and non-negative (integers where the format says
so), ``harness_s <= duration_s``, ``model_call_share <= 1``, outcome codes into
OUTCOMES, and rows in blocks of N (one query per block, queries increasing,
execution indices increasing within it). Otherwise it raises ``TraceError``
naming the row (from 1) and the column.
"""

from __future__ import annotations

import numpy as np

from gyre.formats.trace import (
    COUNT_COLUMNS,
    HARNESS_COLUMN,
    MODEL_SHARE_COLUMN,
    OUTCOMES,
    REQUIRED_COLUMNS,
    TraceError,
    _fail,
    _show,
)

FLOAT_COLUMNS = ("duration_s", HARNESS_COLUMN, MODEL_SHARE_COLUMN)
INTEGER_COLUMNS = ("execution_index", *COUNT_COLUMNS)


def check_columns(columns: dict, N: int, source: str) -> None:
    """Raise TraceError (or ValueError for a bad N) unless ``columns`` are a normalized, sorted trace."""
    if isinstance(N, bool) or int(N) != N or N < 1:
        raise ValueError(f"N must be a positive integer, got {N!r}")
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        _fail(source, 0, missing[0], f"required column is missing (found: {', '.join(map(str, columns))})")
    rows = len(columns["query_id"])
    if rows == 0:
        raise TraceError(f"{source}: the trace has no rows")
    for name, values in columns.items():
        if len(values) != rows:
            raise TraceError(f"{source}: column {name!r} has {len(values)} rows, query_id has {rows}")
    for name in (c for c in FLOAT_COLUMNS + INTEGER_COLUMNS if c in columns):
        _check_numbers(columns[name], name, source, integer=name in INTEGER_COLUMNS)
    if HARNESS_COLUMN in columns:
        _first_bad(np.asarray(columns[HARNESS_COLUMN]) > np.asarray(columns["duration_s"]), source,
                   HARNESS_COLUMN, columns, "is above the row's duration_s")
    if MODEL_SHARE_COLUMN in columns:
        _first_bad(np.asarray(columns[MODEL_SHARE_COLUMN]) > 1, source, MODEL_SHARE_COLUMN, columns,
                   "is above 1 (a share of harness_s)")
    codes = np.asarray(columns["outcome"])
    if codes.dtype.kind not in "iu":
        raise TraceError(f"{source}: column 'outcome' must hold integer codes into {OUTCOMES}, got {codes.dtype}")
    _first_bad((codes < 0) | (codes >= len(OUTCOMES)), source, "outcome", columns, "is not a code into OUTCOMES")
    _check_blocks(columns, int(N), source)


def _check_numbers(values: np.ndarray, name: str, source: str, *, integer: bool) -> None:
    array = np.asarray(values)
    expected = "iu" if integer else "f"
    if array.dtype.kind not in expected:
        raise TraceError(f"{source}: column {name!r} must be {'int64' if integer else 'float64'}, got {array.dtype}")
    if integer:
        _first_bad(array < 0, source, name, {name: array}, "is negative")
        return
    _first_bad(~np.isfinite(array), source, name, {name: array}, "is not a finite number")
    _first_bad(array < 0, source, name, {name: array}, "is negative")


def _check_blocks(columns: dict, N: int, source: str) -> None:
    """Rows come in blocks of N: one query each, queries increasing, execution indices increasing within."""
    rows = len(columns["query_id"])
    if rows % N:
        _fail(source, rows - rows % N + 1, "query_id", f"{rows} rows are not whole groups of N={N} executions")
    ids = np.asarray(columns["query_id"]).reshape(-1, N)
    if ids.dtype.kind not in "iuUO":
        raise TraceError(f"{source}: column 'query_id' must be int64 or text, got {ids.dtype}")
    same = np.column_stack([np.ones(len(ids), bool), ids[:, 1:] == ids[:, :1]])
    _first_bad(~same.ravel(), source, "query_id", columns, f"breaks its block of N={N} executions of one query")
    after = np.concatenate([[True], ids[1:, 0] > ids[:-1, 0]])
    _first_bad(np.repeat(~after, N), source, "query_id", columns, "is not above the previous query (rows sorted)")
    index = np.asarray(columns["execution_index"]).reshape(-1, N)
    rising = np.column_stack([np.ones(len(index), bool), index[:, 1:] > index[:, :-1]])
    _first_bad(~rising.ravel(), source, "execution_index", columns, "is not above the previous execution's")


def _first_bad(bad: np.ndarray, source: str, name: str, columns: dict, problem: str) -> None:
    if bad.any():
        position = int(np.flatnonzero(bad)[0])
        _fail(source, position + 1, name, f"value {_show(np.asarray(columns[name])[position])} {problem}")
