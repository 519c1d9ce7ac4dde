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

A table arrives as a pandas DataFrame (``Trace(frame)``, ``load_trace``; checked
in ``gyre.formats.trace_frame``) or as numpy columns already in that normalized
form (``Trace.from_columns``, a generator's path; checked in
``gyre.formats.trace_columns``): both give equal traces for equal tables. pandas
is imported only on the first path or when ``frame`` is asked for, so a
simulation on a generated trace does without it (~0.35 CPU s of imports).

A rejected table raises ``TraceError`` naming the row and the column. Rows are
numbered from 1 in file order and the header is row 0, so in a CSV file row r
is on line r + 1.

The simulator draws queries in trace order and cycles: ``query_at(k)`` is group
``k mod queries``, a pure function of k.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, NoReturn

import numpy as np

if TYPE_CHECKING:
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


def _given_trajectories(trajectories: tuple[np.ndarray, np.ndarray],
                        table: pd.DataFrame | dict) -> tuple[np.ndarray, np.ndarray]:
    """Pre-parsed ``(sizes, counts)`` of ``table``'s trajectory column, checked against its rows."""
    flat, counts = (np.asarray(a, dtype=np.int64) for a in trajectories)
    rows = len(table["query_id"]) if isinstance(table, dict) else len(table)
    if (TRAJECTORY_COLUMN not in table or counts.size != rows or counts.min(initial=1) < 1
            or flat.size != counts.sum() or flat.min(initial=0) < 0):
        raise ValueError("trajectories must be (sizes >= 0, counts >= 1) matching the frame's "
                         f"{TRAJECTORY_COLUMN} column row by row")
    return flat, counts


def _frozen(values: np.ndarray, N: int) -> np.ndarray:
    grid = np.ascontiguousarray(values).reshape(-1, N)
    grid.setflags(write=False)
    return grid


class Trace:
    """A validated trace: its sorted columns plus (queries, N) array views.

    ``Trace(frame)`` validates and normalizes a pandas DataFrame (a copy is
    kept; do not mutate ``trace.frame``). ``N=None`` infers the group size from
    the query of the first row. ``trajectories=(sizes, counts)`` hands over the
    parsed ``trajectory_tokens`` of an already sorted frame (a generator's fast
    path: the column's JSON is then trusted to say the same, not parsed again).
    ``Trace.from_columns`` builds one from numpy columns without pandas;
    ``trace.frame`` is then built (and pandas imported) only when asked for.
    """

    __slots__ = ("N", "source", "_columns", "_frame", "_grids", "_query_ids", "_trajectories")
    N: int
    source: str
    _columns: dict[str, Any]  # name -> array in frame order (``outcome`` as codes into OUTCOMES)
    _frame: pd.DataFrame | None  # built on first use for from_columns
    _grids: dict[str, np.ndarray]
    _query_ids: np.ndarray
    _trajectories: tuple[np.ndarray, np.ndarray] | None

    def __init__(self, frame: pd.DataFrame, N: int | None = None, source: str = "<frame>",
                 trajectories: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        from gyre.formats.trace_frame import frame_columns, validate_frame

        given = None if trajectories is None else _given_trajectories(trajectories, frame)
        frame, n = validate_frame(frame, N, source, check_trajectories=given is None)
        self._build(frame_columns(frame), n, source, given, frame)

    @classmethod
    def from_columns(cls, columns: dict[str, np.ndarray | list], N: int, source: str = "<columns>",
                     trajectories: tuple[np.ndarray, np.ndarray] | None = None) -> Trace:
        """A trace of columns already in ``frame``'s normalized form and order, without pandas: query_id
        int64 (or text), execution_index and counts int64, durations float64, ``outcome`` int codes into
        OUTCOMES, rows sorted in blocks of N executions per query (``gyre.formats.trace_columns`` checks
        all of it, as ``Trace(frame)`` does; ``trajectory_tokens`` cells are trusted when sizes are given)."""
        from gyre.formats.trace_columns import check_columns

        check_columns(columns, N, source)
        given = None if trajectories is None else _given_trajectories(trajectories, columns)
        trace = cls.__new__(cls)
        trace._build(dict(columns), int(N), source, given, None)
        return trace

    def _build(self, columns: dict, n: int, source: str, given: tuple[np.ndarray, np.ndarray] | None,
               frame: pd.DataFrame | None) -> None:
        names = ("duration_s", HARNESS_COLUMN, MODEL_SHARE_COLUMN, *COUNT_COLUMNS)
        grids = {c: _frozen(np.asarray(columns[c]), n) for c in names if c in columns}
        grids["outcome"] = _frozen(np.asarray(OUTCOMES)[np.asarray(columns["outcome"])], n)
        for name, value in (("N", n), ("source", source), ("_columns", columns), ("_trajectories", given),
                            ("_grids", grids), ("_query_ids", np.asarray(columns["query_id"])[::n].copy()),
                            ("_frame", frame)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a Trace is never modified (cached shifted traces rely on it): cannot set {name!r}")

    def __getstate__(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)

    @property
    def frame(self) -> pd.DataFrame:
        """The sorted, normalized table (a fresh RangeIndex); built on first use for ``from_columns``."""
        if self._frame is None:
            from gyre.formats.trace_frame import frame_from_columns

            object.__setattr__(self, "_frame", frame_from_columns(self._columns))  # a cache, not a change
        return self._frame

    @property
    def columns(self) -> tuple[str, ...]:
        """The table's column names, in order."""
        return tuple(self._columns)

    def column_arrays(self) -> dict[str, np.ndarray]:
        """Each column as an array (``outcome`` as codes into OUTCOMES), in order; do not mutate them."""
        return {name: np.asarray(values) for name, values in self._columns.items()}

    def with_columns(self, **changed: np.ndarray) -> Trace:
        """The same trace with some columns replaced (checked again, as ``from_columns``), without pandas."""
        return Trace.from_columns({**self._columns, **changed}, self.N, self.source, self._trajectories)

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
        if TRAJECTORY_COLUMN not in self._columns:
            return None
        if self._trajectories is None:
            from gyre.formats.trace_frame import _trajectories

            _, flat, counts = _trajectories(self.frame, self.source)
            object.__setattr__(self, "_trajectories", (flat, counts))  # parsed once, on first use
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
    from gyre.formats.trace_frame import read_frame

    path = Path(path)
    _suffix(path)
    try:
        frame = read_frame(path)
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except (OSError, ValueError) as exc:  # pandas and pyarrow parse errors are ValueErrors
        raise TraceError(f"{path}: cannot read trace: {exc}") from exc
    return Trace(frame, N=N, source=str(path))


def save_trace(trace: Trace, path: str | Path) -> Path:
    """Write a trace as CSV or Parquet (chosen by suffix); return the path."""
    from gyre.formats.trace_frame import write_frame

    path = Path(path)
    _suffix(path)
    try:
        write_frame(trace.frame, path)
    except OSError as exc:
        raise TraceError(f"{path}: cannot write trace: {exc}") from exc
    return path
