"""A trace handed in as a pandas DataFrame: its validation, reading and writing (``gyre.formats.trace``).

``gyre.formats.trace`` imports this module only where a DataFrame is handed in
or asked for (``Trace(frame)``, ``trace.frame``, ``load_trace``, ``save_trace``),
so a run on a generated trace never imports pandas (~0.35 CPU s).

Invariants: ``validate_frame`` returns a sorted copy with a fresh RangeIndex whose
columns are normalized as ``gyre.formats.trace``'s docstring lists, or raises
``TraceError`` naming the row (from 1, the header is row 0) and the column;
``frame_from_columns`` builds exactly the frame ``validate_frame`` returns for
the same table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gyre.formats.trace import (
    CALL_TIMING_COLUMN,
    COUNT_COLUMNS,
    CSV_SUFFIXES,
    HARNESS_COLUMN,
    MODEL_SHARE_COLUMN,
    OUTCOMES,
    REQUIRED_COLUMNS,
    TRAJECTORY_COLUMN,
    TraceError,
    _fail,
    _show,
)


def _numbers(frame: pd.DataFrame, column: str, source: str, *, integer: bool) -> np.ndarray:
    """Column as finite, non-negative floats (integral if asked), or TraceError."""
    raw = frame[column]
    if pd.api.types.is_numeric_dtype(raw) and not pd.api.types.is_bool_dtype(raw):
        values = raw.to_numpy(dtype=float, na_value=np.nan)
    else:
        values = pd.to_numeric(raw.astype(object), errors="coerce").to_numpy(dtype=float)
    checks = (
        (~np.isfinite(values), "is not a finite number"),
        (values < 0, "is negative"),
        (values != np.floor(values) if integer else np.zeros(len(values), bool), "is not an integer"),
    )
    for bad, problem in checks:
        if bad.any():
            position = int(np.flatnonzero(bad)[0])
            _fail(source, position + 1, column, f"value {_show(raw.iloc[position])} {problem}")
    return values


def _harness_seconds(frame: pd.DataFrame, source: str) -> np.ndarray:
    """``harness_s`` as finite floats in [0, duration_s] (``duration_s`` already parsed), or TraceError."""
    values = _numbers(frame, HARNESS_COLUMN, source, integer=False)
    durations = frame["duration_s"].to_numpy(dtype=float)
    beyond = values > durations
    if beyond.any():
        position = int(np.flatnonzero(beyond)[0])
        problem = (f"value {_show(frame[HARNESS_COLUMN].iloc[position])} is above the row's "
                   f"duration_s {_show(durations[position])}")
        _fail(source, position + 1, HARNESS_COLUMN, problem)
    return values


def _shares(frame: pd.DataFrame, source: str) -> np.ndarray:
    """``model_call_share`` as finite floats in [0, 1], or TraceError."""
    values = _numbers(frame, MODEL_SHARE_COLUMN, source, integer=False)
    if (values > 1).any():
        position = int(np.flatnonzero(values > 1)[0])
        _fail(source, position + 1, MODEL_SHARE_COLUMN,
              f"value {_show(frame[MODEL_SHARE_COLUMN].iloc[position])} is above 1 (a share of harness_s)")
    return values


def _query_ids(frame: pd.DataFrame, source: str) -> pd.Series:
    raw = frame["query_id"]
    if pd.api.types.is_integer_dtype(raw):
        return raw.astype("int64")
    text = raw.astype(object)
    missing = text.isna().to_numpy() | (text.astype(str).str.strip() == "").to_numpy()
    if missing.any():
        _fail(source, int(np.flatnonzero(missing)[0]) + 1, "query_id", "missing value")
    text = text.astype(str)
    canonical = text.str.fullmatch(r"0|-?[1-9][0-9]{0,17}")
    return text.astype("int64") if bool(canonical.all()) else text


def _outcomes(frame: pd.DataFrame, source: str) -> pd.Categorical:
    raw = frame["outcome"]
    if isinstance(raw.dtype, pd.CategoricalDtype) and set(raw.cat.categories) <= set(OUTCOMES):
        if not raw.isna().any():  # fast path: already coded, e.g. a generated trace
            return pd.Categorical(raw, categories=OUTCOMES)
    text = raw.astype(object).astype(str)
    unknown = ~text.isin(OUTCOMES).to_numpy()
    if unknown.any():
        position = int(np.flatnonzero(unknown)[0])
        problem = f"unknown outcome {text.iloc[position]!r} (expected one of {', '.join(OUTCOMES)})"
        _fail(source, position + 1, "outcome", problem)
    return pd.Categorical(text, categories=OUTCOMES)


def _call_timing(frame: pd.DataFrame, source: str) -> list[str]:
    """Per-call durations as canonical JSON text; list-valued cells are accepted too."""
    counts = frame["call_count"].to_numpy() if "call_count" in frame else None
    canonical = []
    for position, cell in enumerate(frame[CALL_TIMING_COLUMN].tolist()):
        try:
            calls = json.loads(cell) if isinstance(cell, str) else list(cell)
            seconds = [float(c) for c in calls]
        except (TypeError, ValueError):
            _fail(source, position + 1, CALL_TIMING_COLUMN, f"{cell!r} is not a JSON list of numbers")
        if not all(np.isfinite(s) and s >= 0 for s in seconds):
            _fail(source, position + 1, CALL_TIMING_COLUMN, "call durations must be finite and >= 0")
        if counts is not None and len(seconds) != counts[position]:
            problem = f"{len(seconds)} call durations but call_count is {int(counts[position])}"
            _fail(source, position + 1, CALL_TIMING_COLUMN, problem)
        canonical.append(json.dumps(seconds))
    return canonical


def _trajectories(frame: pd.DataFrame, source: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Trajectory token lists as canonical JSON text plus (flat sizes, counts); list cells are accepted too."""
    cells = [c if isinstance(c, str) else json.dumps([int(v) for v in c]) if _is_list(c) else repr(c)
             for c in frame[TRAJECTORY_COLUMN].tolist()]
    text = pd.Series(cells, dtype=object)
    if bool(text.str.fullmatch(r"\[[0-9]+(?:,[0-9]+)*\]").all()):  # fast path: compact lists of digits
        counts = text.str.count(",").to_numpy(dtype=np.int64) + 1
        flat = np.fromstring(",".join(c[1:-1] for c in cells), dtype=np.int64, sep=",")
        return cells, flat, counts
    try:  # every cell at once
        lists = json.loads("[" + ",".join(cells) + "]")
        if len(lists) != len(cells):
            raise ValueError("a cell holds more than one value")
    except ValueError:
        lists = []
        for position, cell in enumerate(cells):
            try:
                lists.append(json.loads(cell))
            except ValueError:
                _fail(source, position + 1, TRAJECTORY_COLUMN, f"{cell!r} is not a JSON list of token counts")
    counts = np.fromiter((len(x) if isinstance(x, list) else -1 for x in lists), np.int64, len(lists))
    flat = [v for x in lists if isinstance(x, list) for v in x]
    ok_values = all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in flat)
    if counts.min() < 1 or not ok_values:
        for position, x in enumerate(lists):
            if not isinstance(x, list) or not x or not all(
                    isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in x):
                problem = f"{cells[position]!r} must be a non-empty JSON list of integers >= 0"
                _fail(source, position + 1, TRAJECTORY_COLUMN, problem)
    return cells, np.asarray(flat, dtype=np.int64), counts


def _is_list(cell: object) -> bool:
    return isinstance(cell, (list, tuple, np.ndarray))


def _check_keys(frame: pd.DataFrame, source: str) -> None:
    keys = ["query_id", "execution_index"]
    repeated = frame.duplicated(keys, keep="first").to_numpy()
    if repeated.any():
        position = int(np.flatnonzero(repeated)[0])
        qid, index = frame.at[position, "query_id"], frame.at[position, "execution_index"]
        first = frame.index[(frame["query_id"] == qid) & (frame["execution_index"] == index)][0]
        problem = f"duplicate (query_id={_show(qid)}, execution_index={index}); first seen in row {first + 1}"
        _fail(source, position + 1, "execution_index", problem)


def _group_size(frame: pd.DataFrame, N: int | None, source: str) -> int:
    sizes = frame.groupby("query_id", sort=False).size()
    expected = int(sizes.iloc[0]) if N is None else N
    wrong = sizes[sizes != expected]
    if len(wrong):
        qid, size = wrong.index[0], int(wrong.iloc[0])
        first = int(np.flatnonzero((frame["query_id"] == qid).to_numpy())[0])
        how = "given" if N is not None else f"taken from query {_show(sizes.index[0])}"
        problem = f"query {_show(qid)} has {size} executions, expected N={expected} ({how})"
        _fail(source, first + 1, "query_id", problem)
    return expected


def validate_frame(
    frame: pd.DataFrame, N: int | None = None, source: str = "<frame>", *, check_trajectories: bool = True
) -> tuple[pd.DataFrame, int]:
    """Check a raw table against the format; return (normalized sorted copy, N).

    ``check_trajectories=False`` leaves ``trajectory_tokens`` unparsed (its
    sizes come pre-parsed, see ``Trace``) and then needs rows already sorted.
    """
    if N is not None and (int(N) != N or N < 1):
        raise ValueError(f"N must be a positive integer or None, got {N!r}")
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        found = ", ".join(map(str, frame.columns))
        _fail(source, 0, missing[0], f"required column is missing (found: {found})")
    if len(frame) == 0:
        raise TraceError(f"{source}: the trace has no rows")
    out = frame.reset_index(drop=True).copy()
    out["query_id"] = _query_ids(out, source)
    out["execution_index"] = _numbers(out, "execution_index", source, integer=True).astype("int64")
    out["duration_s"] = _numbers(out, "duration_s", source, integer=False)
    if HARNESS_COLUMN in out.columns:
        out[HARNESS_COLUMN] = _harness_seconds(out, source)
    out["outcome"] = _outcomes(out, source)
    if MODEL_SHARE_COLUMN in out.columns:
        out[MODEL_SHARE_COLUMN] = _shares(out, source)
    for column in (c for c in COUNT_COLUMNS if c in out.columns):
        out[column] = _numbers(out, column, source, integer=True).astype("int64")
    if CALL_TIMING_COLUMN in out.columns:
        out[CALL_TIMING_COLUMN] = _call_timing(out, source)
    if TRAJECTORY_COLUMN in out.columns and check_trajectories:
        out[TRAJECTORY_COLUMN] = _trajectories(out, source)[0]
    _check_keys(out, source)
    n = _group_size(out, None if N is None else int(N), source)
    out = out.sort_values(["query_id", "execution_index"], kind="stable")
    if not check_trajectories and not out.index.equals(pd.RangeIndex(len(out))):
        raise ValueError(f"{source}: pre-parsed trajectory sizes need rows sorted by query_id, execution_index")
    out = out.reset_index(drop=True)
    return out, n




def frame_from_columns(columns: dict[str, Any]) -> pd.DataFrame:
    """The normalized frame of already validated, sorted columns (``outcome`` as codes into OUTCOMES)."""
    data = dict(columns)
    data["outcome"] = pd.Categorical.from_codes(np.asarray(columns["outcome"]), categories=OUTCOMES)
    return pd.DataFrame(data)


def frame_columns(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """The inverse of ``frame_from_columns`` for a validated frame."""
    columns = {c: frame[c].to_numpy() for c in frame.columns}
    columns["outcome"] = frame["outcome"].cat.codes.to_numpy()
    return columns


def read_frame(path: Path) -> pd.DataFrame:
    """The raw table of a CSV (every cell as text) or Parquet file (by suffix)."""
    if path.suffix.lower() in CSV_SUFFIXES:
        return pd.read_csv(path, dtype=str, keep_default_na=False)
    return pd.read_parquet(path)


def write_frame(frame: pd.DataFrame, path: Path) -> None:
    if path.suffix.lower() in CSV_SUFFIXES:
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path, index=False)
