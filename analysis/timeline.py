"""Time-line views of one run: bursts, publications, satellites joining, rollout load.

Definitions:
- burst b trains steps b*mu .. b*mu + mu - 1; ``burst_span`` runs from the end
  of the previous burst's last step (0 for burst 0) to the end of its own
  publication (PublishDone), or to its last step's end when no publication
  was recorded;
- a publication starts at the end of a burst's last step and ends at the
  ``publish_done`` event carrying the new version;
- a satellite join is a cell other than the core (cell 0) entering the
  training role while a step is in flight (start_s <= t < end_s of that step):
  it joins the running batch through a weight pull (docs/streaming.md#joining-a-step);
- ``running_executions`` is the number of executions running at each change
  point (starts count at their start, ends at their end; still-running ones
  never end).

Invariants: tables are sorted by time; the running count never goes below 0.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gyre.analysis.runs import Run


def publications(run: Run) -> pd.DataFrame:
    """One row per publication: version, start_s (last step's end) and done_s."""
    events = run.events[run.events["kind"] == "publish_done"]
    steps = run.steps.set_index("step")["end_s"]
    rows = [{"version": int(v), "start_s": float(steps.get(int(v) - 1, np.nan)), "done_s": float(now)}
            for v, now in zip(events["version"], events["now"])]
    return pd.DataFrame(rows, columns=["version", "start_s", "done_s"]).sort_values("done_s").reset_index(drop=True)


def burst_span(run: Run, burst: int) -> tuple[float, float]:
    """(start_s, end_s) of burst ``burst`` (see module docstring); ValueError if it did not complete."""
    mu = int(run.config.get("mu", 1))
    steps = run.steps.set_index("step")
    first, last = burst * mu, burst * mu + mu - 1
    if last not in steps.index or pd.isna(steps.loc[last, "end_s"]):
        raise ValueError(f"burst {burst} (steps {first}..{last}) did not complete in this run")
    start = float(steps.loc[first - 1, "end_s"]) if first > 0 else 0.0
    pubs = publications(run)
    done = pubs.loc[pubs["version"] == last + 1, "done_s"]
    return start, float(done.iloc[0]) if len(done) else float(steps.loc[last, "end_s"])


def satellite_joins(run: Run) -> pd.DataFrame:
    """Cells other than the core entering training during an in-flight step: cell, joined_at_s, step."""
    entries = run.roles[(run.roles["role"] == "training") & (run.roles["cell"] != 0)]
    steps = run.steps[run.steps["end_s"].notna()]
    rows = []
    for cell, t in zip(entries["cell"], entries["start_s"]):
        inflight = steps[(steps["start_s"] <= t) & (t < steps["end_s"])]
        if len(inflight):
            rows.append({"cell": int(cell), "joined_at_s": float(t), "step": int(inflight["step"].iloc[0])})
    return pd.DataFrame(rows, columns=["cell", "joined_at_s", "step"]).sort_values("joined_at_s").reset_index(drop=True)


def running_executions(run: Run) -> pd.DataFrame:
    """Step function of running executions: time_s and running (value from time_s on)."""
    execs = run.executions
    starts = execs["start_s"].to_numpy(dtype=float)
    ends = execs["end_s"].dropna().to_numpy(dtype=float)
    times = np.concatenate([starts, ends])
    deltas = np.concatenate([np.ones(starts.size, dtype=int), -np.ones(ends.size, dtype=int)])
    order = np.lexsort((deltas, times))  # at equal times, ends (-1) before starts (+1)
    frame = pd.DataFrame({"time_s": times[order], "running": np.cumsum(deltas[order])})
    return frame.groupby("time_s", as_index=False)["running"].last()
