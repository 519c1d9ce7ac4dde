"""Rollout-duration traces: the table format, its loader and its validator.

A trace is one row per harness execution; the N executions of one query form
its rollout group. Columns:

=================  ========  ==================================================
column             required  meaning
=================  ========  ==================================================
query_id           yes       query identifier; integers, or any text
execution_index    yes       integer >= 0, distinct within a query; orders it
duration_s         yes       wall-clock seconds from start to termination, >= 0
outcome            yes       one of ``OUTCOMES`` (see ``Outcome``)
harness_s          no        seconds from start until the harness stopped (its
                             model calls over), 0 <= harness_s <= duration_s;
                             the rest of duration_s is evaluation (e.g. the
                             retries after a harness timeout), which uses no
                             rollout engine; absent: harness_s = duration_s
model_call_share   no        share of harness_s the execution spent waiting
                             on model calls (the rest: tool, sandbox and
                             evaluation time), in [0, 1]; only this share
                             slows with its engine's load in the simulator;
                             absent: ``DEFAULT_MODEL_CALL_SHARE`` (0.35, see
                             below); a real run measures it (proxy call time
                             over wall time, ``gyre.real.runtime.trace``)
input_tokens       no        tokens the execution fed the model over its life
output_tokens      no        tokens the model generated for it
call_count         no        number of model calls the execution made
call_durations_s   no        JSON list of per-call seconds, e.g. ``[3.1, 12.0]``;
                             its length equals ``call_count`` when both exist
trajectory_tokens  no        JSON list of the token counts of the execution's
                             candidate trajectories in admission order (docs/trajectories.md#admission: main agent
                             first), e.g. ``[41000, 9000]``; at least one entry; the first ``J_max`` of them
                             are what training keeps (``kept_tokens``)
=================  ========  ==================================================

``DEFAULT_MODEL_CALL_SHARE`` = 0.35 is ours (no measured figure for the
paper's runs): the nl2repo-122b preset's ~18 s per model call with its tool
time and ~130 output tokens per call (2,587 tokens, 5 % output), at an
assumed ~25 tokens/s per request on a full 122B-A10B engine (5.2 s) plus
~1 s to prefill the call's new input, spend 6.2 s of 18 s in the model
call. docs/simulator.md section 2 derives it and its sensitivity.

Both CSV and Parquet hold the same table; ``call_durations_s`` and
``trajectory_tokens`` are JSON text in both; traces written before
``trajectory_tokens`` existed load unchanged (without it). Other columns are
kept untouched. Integer ``query_id`` values (in CSV:
canonical decimals such as ``12``, not ``012``) become int64 and sort
numerically; any other ids stay text and sort lexicographically.

Invariants of every ``Trace`` (checked when it is built, whatever the source):

* every required column exists and holds a value in every row;
* durations are finite and non-negative, and so is ``harness_s``, never
  above its row's ``duration_s``; ``model_call_share`` lies in [0, 1]; token and call counts are
  non-negative integers; outcomes are known; each ``trajectory_tokens``
  cell is a non-empty list of non-negative integers;
* no (query_id, execution_index) pair repeats;
* every query has exactly N executions (N given, or taken from the query of
  the first row), so the trace reshapes to a (queries, N) grid;
* ``frame`` is sorted by (query_id, execution_index) with a fresh RangeIndex.

A rejected table raises ``TraceError`` naming the row and the column. Rows are
numbered from 1 in file order and the header is row 0, so in a CSV file row r
is on line r + 1.

The simulator draws queries in trace order and cycles: ``query_at(k)`` is group
``k mod queries``, a pure function of k.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, NoReturn

import numpy as np
import pandas as pd


class TraceError(ValueError):
    """A trace file or table breaks the format; the message names row and column."""


class Outcome(StrEnum):
    """How an execution ended, and what that means for its reward (docs/trajectories.md#evaluation-and-outcomes)."""

    COMPLETED = "completed"  # harness finished; scored
    HARNESS_TIMEOUT = "harness_timeout"  # hit the harness ceiling; partial work scored
    OVERALL_TIMEOUT = "overall_timeout"  # total budget spent, no valid reward: excluded
    FAILED = "failed"  # nothing evaluable; a reward-0 placeholder keeps the group whole


OUTCOMES: tuple[str, ...] = tuple(o.value for o in Outcome)
REQUIRED_COLUMNS = ("query_id", "execution_index", "duration_s", "outcome")
HARNESS_COLUMN = "harness_s"
MODEL_SHARE_COLUMN = "model_call_share"
DEFAULT_MODEL_CALL_SHARE = 0.35  # ours: derived in the module docstring and docs/simulator.md section 2
COUNT_COLUMNS = ("input_tokens", "output_tokens", "call_count")
CALL_TIMING_COLUMN = "call_durations_s"
TRAJECTORY_COLUMN = "trajectory_tokens"
CSV_SUFFIXES = (".csv",)
PARQUET_SUFFIXES = (".parquet", ".pq")


def _fail(source: str, row: int, column: str, problem: str) -> NoReturn:
    raise TraceError(f"{source}: row {row}, column {column!r}: {problem}")


def _show(value: object) -> str:
    """repr without numpy's scalar wrappers: 3, not np.int64(3)."""
    return repr(value.item() if isinstance(value, np.generic) else value)


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


@dataclass(frozen=True, eq=False)
class QueryGroup:
    """The N executions of one query, ordered by execution_index.

    Count arrays are None when the trace lacks the column; per-call durations,
    when present, stay in ``trace.frame["call_durations_s"]`` as JSON text.
    """

    position: int  # index of the query in the trace, 0-based
    query_id: object
    durations_s: np.ndarray
    outcomes: np.ndarray  # str values from OUTCOMES
    input_tokens: np.ndarray | None = None
    output_tokens: np.ndarray | None = None
    call_count: np.ndarray | None = None

    @property
    def query_duration_s(self) -> float:
        """A group is ready only when its slowest execution ends."""
        return float(self.durations_s.max())


def _frozen(values: np.ndarray, N: int) -> np.ndarray:
    grid = np.ascontiguousarray(values).reshape(-1, N)
    grid.setflags(write=False)
    return grid


@dataclass(frozen=True, eq=False, repr=False)
class Trace:
    """A validated trace: a sorted DataFrame plus (queries, N) array views.

    ``Trace(frame)`` validates and normalizes ``frame`` (a copy is kept; do not
    mutate ``trace.frame``). ``N=None`` infers the group size from the query of
    the first row. ``trajectories=(sizes, counts)`` hands over the parsed
    ``trajectory_tokens`` of an already sorted frame (a generator's fast path:
    the column's JSON is then trusted to say the same, not parsed again).
    """

    frame: pd.DataFrame
    N: int | None = None
    source: str = "<frame>"
    trajectories: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)
    if TYPE_CHECKING:  # set once in __post_init__ (object.__setattr__), not dataclass fields
        _grids: dict[str, np.ndarray] = field(init=False)
        _query_ids: np.ndarray = field(init=False)
        _trajectories: tuple[np.ndarray, np.ndarray] | None = field(init=False)

    def __post_init__(self) -> None:
        given = self.trajectories
        if given is not None:
            flat, counts = (np.asarray(a, dtype=np.int64) for a in given)
            if (TRAJECTORY_COLUMN not in self.frame or counts.size != len(self.frame) or counts.min(initial=1) < 1
                    or flat.size != counts.sum() or flat.min(initial=0) < 0):
                raise ValueError("trajectories must be (sizes >= 0, counts >= 1) matching the frame's "
                                 f"{TRAJECTORY_COLUMN} column row by row")
        frame, n = validate_frame(self.frame, self.N, self.source, check_trajectories=given is None)
        object.__setattr__(self, "frame", frame)
        object.__setattr__(self, "N", n)
        columns = ("duration_s", HARNESS_COLUMN, MODEL_SHARE_COLUMN, *COUNT_COLUMNS)
        grids = {c: _frozen(frame[c].to_numpy(), n) for c in columns if c in frame}
        grids["outcome"] = _frozen(np.asarray(OUTCOMES)[frame["outcome"].cat.codes.to_numpy()], n)
        object.__setattr__(self, "_grids", grids)
        object.__setattr__(self, "_query_ids", frame["query_id"].to_numpy()[::n].copy())
        object.__setattr__(self, "_trajectories", None if given is None else (flat, counts))
        object.__setattr__(self, "trajectories", None)  # parsed sizes live in _trajectories

    def __repr__(self) -> str:
        return f"Trace(queries={self.queries}, N={self.N}, source={self.source!r})"

    @property
    def queries(self) -> int:
        return len(self._query_ids)

    @property
    def durations_s(self) -> np.ndarray:
        """Read-only (queries, N) grid of execution durations in seconds."""
        return self._grids["duration_s"]

    @property
    def harness_s(self) -> np.ndarray:
        """Read-only (queries, N) grid of seconds until each harness stopped (``durations_s`` without the column)."""
        return self._grids.get(HARNESS_COLUMN, self._grids["duration_s"])

    @property
    def model_call_share(self) -> np.ndarray:
        """Read-only (queries, N) grid of model-call shares (``DEFAULT_MODEL_CALL_SHARE`` without the column)."""
        grid = self._grids.get(MODEL_SHARE_COLUMN)
        if grid is None:
            assert self.N is not None  # set by __post_init__
            grid = _frozen(np.full(self._grids["duration_s"].size, DEFAULT_MODEL_CALL_SHARE), self.N)
            self._grids[MODEL_SHARE_COLUMN] = grid
        return grid

    @property
    def outcomes(self) -> np.ndarray:
        """Read-only (queries, N) grid of outcome strings."""
        return self._grids["outcome"]

    def column(self, name: str) -> np.ndarray | None:
        """Read-only (queries, N) grid of an optional count column, or None."""
        return self._grids.get(name)

    def trajectory_sizes(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(flat token counts, trajectories per execution) in frame order, or None without the column."""
        if TRAJECTORY_COLUMN not in self.frame:
            return None
        if self._trajectories is None:
            _, flat, counts = _trajectories(self.frame, self.source)
            object.__setattr__(self, "_trajectories", (flat, counts))
        return self._trajectories

    def kept_tokens(self, j_max: int) -> np.ndarray | None:
        """(queries, N) tokens of each execution's first ``j_max`` trajectories, or None without the column."""
        if isinstance(j_max, bool) or int(j_max) != j_max or j_max < 1:
            raise ValueError(f"j_max must be a positive integer, got {j_max!r}")
        sizes = self.trajectory_sizes()
        if sizes is None:
            return None
        flat, counts = sizes
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        rank = np.arange(flat.size) - np.repeat(starts, counts)
        kept = np.add.reduceat(np.where(rank < j_max, flat, 0), starts)
        assert self.N is not None  # set by __post_init__
        return _frozen(kept, self.N)

    def group(self, i: int) -> QueryGroup:
        """The i-th query's executions in execution_index order (0 <= i < queries)."""
        if not 0 <= i < self.queries:
            raise IndexError(f"query {i} out of range for a trace of {self.queries} queries")
        counts = {c: (None if c not in self._grids else self._grids[c][i]) for c in COUNT_COLUMNS}
        return QueryGroup(i, self._query_ids[i], self.durations_s[i], self.outcomes[i], **counts)

    def query_at(self, k: int) -> QueryGroup:
        """The k-th query drawn by a simulator: group k mod queries (k >= 0)."""
        if k < 0:
            raise IndexError(f"draw index must be >= 0, got {k}")
        return self.group(k % self.queries)

    def iter_groups(self) -> Iterator[QueryGroup]:
        return (self.group(i) for i in range(self.queries))

    def equals(self, other: Trace) -> bool:
        return self.N == other.N and self.frame.equals(other.frame)


def _suffix(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in CSV_SUFFIXES + PARQUET_SUFFIXES:
        known = ", ".join(CSV_SUFFIXES + PARQUET_SUFFIXES)
        raise TraceError(f"{path}: unknown trace file suffix {suffix!r} (expected one of {known})")
    return suffix


def load_trace(path: str | Path, N: int | None = None) -> Trace:
    """Read a CSV or Parquet trace (chosen by suffix) and validate it."""
    path = Path(path)
    suffix = _suffix(path)
    try:
        if suffix in CSV_SUFFIXES:
            frame = pd.read_csv(path, dtype=str, keep_default_na=False)
        else:
            frame = pd.read_parquet(path)
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except (OSError, ValueError) as exc:  # pandas and pyarrow parse errors are ValueErrors
        raise TraceError(f"{path}: cannot read trace: {exc}") from exc
    return Trace(frame, N=N, source=str(path))


def save_trace(trace: Trace, path: str | Path) -> Path:
    """Write a trace as CSV or Parquet (chosen by suffix); return the path."""
    path = Path(path)
    try:
        if _suffix(path) in CSV_SUFFIXES:
            trace.frame.to_csv(path, index=False)
        else:
            trace.frame.to_parquet(path, index=False)
    except OSError as exc:
        raise TraceError(f"{path}: cannot write trace: {exc}") from exc
    return path
