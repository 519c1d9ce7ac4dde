"""Real runs written as rollout-duration traces in the simulator's format.

A real run reports one ``ExecutionResult`` per harness execution it started:
query id, execution index, wall-clock start and end, outcome, and optionally
the model-call counts taken from its execution records (``counts_from_calls``).
``trace_from_results`` turns them into a ``gyre.formats.trace.Trace`` and
``write_trace`` saves it (CSV or Parquet by suffix) with ``save_trace``, so
``load_trace`` reads it back and ``gyre.sim.runner.run_simulation`` replays it.

Oversampling: a run may start more than N executions of a query and cancel
the surplus once N have finished. A cancelled surplus execution is not part
of the query's group of N and has no reward, so it is **dropped**: it is
reported with ``outcome="cancelled"`` (``CANCELLED``) and never reaches the
trace. Kept executions keep their original ``execution_index`` (indices may
have gaps; the format needs them distinct, not contiguous).

Start: ``start_s`` is when the backend was told to start the execution (the
core's StartExecutions), not when its process came up: the simulator starts
an execution at that action, so the backend's own start latency (issuing the
key, routing, building the workspace, spawning the process; 0.1-5 s per
execution measured in the CPU demo, as starts queue behind each other) must be
inside the duration for the simulator to predict when groups become ready.

Evaluation: ``end_s`` is when the execution ended, its evaluation included
(what the core saw as ExecutionFinished). ``harness_end_s`` is set only for
an execution whose harness stopped well before that, i.e. whose evaluation
went into retries (the backend then reports ``HarnessStopped``): the trace
then has a ``harness_s`` column (``harness_end_s - start_s``, or the duration
where unset), and the simulator frees the slot at that time as the real core
did. A first evaluation attempt is folded into the duration, as the real core
holds the slot through it.

Model-call share: ``model_call_s`` is the wall time the execution spent
waiting on model calls through the proxy (the union of its calls'
``started_at``..``finished_at`` intervals, so concurrent calls count once;
``counts_from_calls``). The trace's ``model_call_share`` is that over its
harness time (``harness_s``, or the duration), capped at 1: the part of the
execution the simulator slows with engine load. It is written only when
every kept result has it.

Invariants: ``duration_s = end_s - start_s``; every kept result has an outcome
in ``gyre.formats.trace.OUTCOMES``, finite times with ``end_s >= start_s``,
and non-negative integer counts; an optional count column is written only
when every kept result has it (some with and some without is an error). Bad
input raises ``TraceError`` naming the execution (query_id, execution_index)
before anything is written; the ``Trace`` constructor then checks the
table-level rules (no duplicates, exactly N kept executions per query).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, TypedDict, cast

import pandas as pd

from gyre.formats.trace import HARNESS_COLUMN, MODEL_SHARE_COLUMN, OUTCOMES, Trace, TraceError, save_trace

CANCELLED = "cancelled"
COUNT_FIELDS = ("input_tokens", "output_tokens", "call_count")


@dataclass(frozen=True, kw_only=True)
class ExecutionResult:
    """How one harness execution of a real run went (times in wall-clock seconds)."""

    query_id: int | str
    execution_index: int
    start_s: float
    end_s: float
    outcome: str
    input_tokens: int | None = None
    output_tokens: int | None = None
    call_count: int | None = None
    harness_end_s: float | None = None  # the harness stopped, evaluation retries followed (see the module doc)
    model_call_s: float | None = None  # wall seconds spent in model calls (see the module doc)

    @property
    def name(self) -> str:
        return f"execution (query_id={self.query_id!r}, execution_index={self.execution_index!r})"


class CallCounts(TypedDict):
    """What ``counts_from_calls`` takes from one execution's records (``ExecutionResult`` fields)."""

    input_tokens: int
    output_tokens: int
    call_count: int
    model_call_s: float


def counts_from_calls(calls: Iterable[Any]) -> CallCounts:
    """Token and call counts of one execution from its records (``ModelCall``-like objects).

    ``input_tokens`` sums every call's prompt length (the tokens fed to the
    model over the execution's life), ``output_tokens`` every call's output.
    """
    calls = list(calls)
    return {"input_tokens": sum(len(c.input_ids) for c in calls),
            "output_tokens": sum(len(c.output_ids) for c in calls),
            "call_count": len(calls),
            "model_call_s": call_wall_s((c.started_at, c.finished_at) for c in calls)}


def call_wall_s(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of (start, end) intervals: wall time with at least one model call open."""
    total, reach = 0.0, -math.inf
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def check_result(result: ExecutionResult) -> None:
    """Raise ``TraceError`` naming the execution if one result is unusable."""
    if result.outcome not in OUTCOMES and result.outcome != CANCELLED:
        raise TraceError(f"{result.name}: unknown outcome {result.outcome!r} "
                         f"(expected one of {', '.join(OUTCOMES)}, or {CANCELLED!r} for dropped surplus)")
    if isinstance(result.execution_index, bool) or not isinstance(result.execution_index, int) \
            or result.execution_index < 0:
        raise TraceError(f"{result.name}: execution_index must be an integer >= 0")
    if not (math.isfinite(result.start_s) and math.isfinite(result.end_s)):
        raise TraceError(f"{result.name}: start_s={result.start_s!r} and end_s={result.end_s!r} must be finite")
    if result.end_s < result.start_s:
        raise TraceError(f"{result.name}: negative duration (start_s={result.start_s}, end_s={result.end_s})")
    stop = result.harness_end_s
    if stop is not None and not (math.isfinite(stop) and result.start_s <= stop <= result.end_s):
        raise TraceError(f"{result.name}: harness_end_s={stop!r} must lie between start_s={result.start_s} "
                         f"and end_s={result.end_s}")
    for field in COUNT_FIELDS:
        value = getattr(result, field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise TraceError(f"{result.name}: {field}={value!r} must be an integer >= 0")
    calls = result.model_call_s
    if calls is not None and not (isinstance(calls, (int, float)) and math.isfinite(calls) and calls >= 0):
        raise TraceError(f"{result.name}: model_call_s={calls!r} must be a finite number >= 0")


def _count_columns(kept: list[ExecutionResult]) -> list[str]:
    """Count fields every kept result has; partial presence raises naming a result without it."""
    columns = []
    for field in COUNT_FIELDS:
        missing = [r for r in kept if getattr(r, field) is None]
        if len(missing) == len(kept):
            continue
        if missing:
            raise TraceError(f"{missing[0].name}: has no {field} although other executions do")
        columns.append(field)
    return columns


def trace_from_results(results: Iterable[ExecutionResult], N: int | None = None,
                       source: str = "<real run>") -> Trace:
    """Validate results, drop cancelled surplus, and build the simulator's ``Trace``."""
    results = list(results)
    for result in results:
        check_result(result)
    kept = [r for r in results if r.outcome != CANCELLED]
    if not kept:
        raise TraceError(f"{source}: no kept executions ({len(results)} results, all cancelled or none)")
    columns = _count_columns(kept)
    rows = [{"query_id": r.query_id, "execution_index": r.execution_index, "duration_s": r.end_s - r.start_s,
             "outcome": r.outcome, **{c: getattr(r, c) for c in columns}} for r in kept]
    if any(r.harness_end_s is not None for r in kept):
        for row, r in zip(rows, kept):
            row[HARNESS_COLUMN] = (r.end_s if r.harness_end_s is None else r.harness_end_s) - r.start_s
    shares = [r.model_call_s for r in kept]
    if kept and all(s is not None for s in shares):
        for row, r, model_s in zip(rows, kept, shares):
            harness = (r.end_s if r.harness_end_s is None else r.harness_end_s) - r.start_s
            row[MODEL_SHARE_COLUMN] = min(1.0, cast(float, model_s) / harness) if harness > 0 else 0.0
    return Trace(pd.DataFrame(rows), N=N, source=source)


def write_trace(results: Iterable[ExecutionResult], path: str | os.PathLike, N: int | None = None) -> Path:
    """Write a real run's results as a CSV or Parquet trace (suffix decides); return the path."""
    path = Path(path)
    return save_trace(trace_from_results(results, N=N, source=str(path)), path)
