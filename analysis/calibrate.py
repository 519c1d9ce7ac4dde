"""``gyre calibrate RUN_DIR``: the simulator's cost constants measured from a real run's records.

A real run (``gyre run``) leaves ``summary.json`` (per-transition, per-publication
and per-step measurements of the backend and the training cells), ``trace.csv``
(each execution's measured duration and tokens) and ``log/events.csv``. This
module turns them into a cost file the simulator reads (``gyre sim --costs``):

| constant              | measured as                                                                |
|-----------------------|----------------------------------------------------------------------------|
| to_training_s         | mean time of the core unit's rollout -> training transitions, BeginTransition |
|                       | to TransitionDone in the event log (drain wait included)                     |
| to_rollout_s          | mean time of the core unit's training -> rollout transitions, from the later |
|                       | of BeginTransition and the PublishDone of a publication then in flight to   |
|                       | TransitionDone: the simulator waits for that publication itself. (The      |
|                       | backend's own per-transition timer cannot be used: the core cell leaves     |
|                       | training only after exporting the publication, a wait it does not see.)     |
| satellite_to_*_s      | the same two means over the satellites' transitions (omitted when no       |
|                       | satellite moved): the core enters training with the optimizer state, a      |
|                       | satellite holds weights only, so one mean over both mispredicts either      |
|                       | (measured here: core 1.4-3.3 s, satellites 0.1-1.5 s into training). A core |
|                       | unit that never moved one way takes the satellites' mean for that way       |
| publish_s             | time from a burst's final StepDone to its PublishDone in the event log      |
|                       | (what the core waited: export, engines loading it, the backend's own        |
|                       | latency; the backend's narrower ``wall_s`` misses the last), the           |
|                       | simulator's Publish -> PublishDone: the intercept of a least-squares fit   |
|                       | against the rollout engines serving at the Publish (the mean when they     |
|                       | never differ); one run publishes one size, so bytes cannot be split from   |
|                       | the fixed part: bandwidth set huge                                          |
| publish_engine_s      | that fit's slope: seconds per engine loading the weights (0 when one count) |
| node_peak_tflops      | 6 x parameters x trained tokens / cell compute seconds, at utilisation 1:   |
|                       | the cells' own forward+backward seconds (``compute_s`` per micro-step) over |
|                       | the trace's tokens of the groups trained                                    |
| micro_step_tokens     | the packer's token budget, ``token_budget`` in ``job.json`` (set, not     |
|                       | measured: the simulator packs the trace's tokens by the real packer's rule)  |
| optimizer_s           | mean optimizer update seconds of the core cell                              |
| weight_pull_s         | mean Mooncake pull of a joining satellite (0 when none joined)              |

A resumed run (``gyre run --resume``): its log's clock goes on from the last
event the resume kept (``attempts/N/resume.json``, ``runtime.resume``), with
the crash and the restore left out (``runtime.controller``), and the resumed
attempt applies again every transition and publication outstanding there. So
one that spans a resume point is measured from that point: the redone one.

Set to zero, with the reason: warm-up, drain and gradient reduction (one CPU
process per cell, no pipeline), broadcast (inside the measured step), sandbox
start-up and evaluation (inside the measured execution durations), and the
engine load curve (the durations were measured under the run's own load).

Invariants: a pure function of the run folder's files; every constant written
is a field of ``gyre.sim.costs.CostModel`` and passes its checks; a folder
missing a file or a measurement raises ``CalibrationError`` naming it.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path
from typing import Any

from gyre.sim.costs import CostModel

COST_FILE = "costs.toml"
FLOPS_PER_PARAM_TOKEN = 6.0  # forward + backward (the simulator's own formula, gyre.sim.sizes)
HUGE_GBPS = 1e6
EVENTS = "log/events.csv"


class CalibrationError(ValueError):
    """A run folder without what calibration needs; the message names the file or the field."""


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise CalibrationError(f"{path}: missing (is this a `gyre run` folder?)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CalibrationError(f"{path}: not JSON ({exc})") from None


def _mean(values: list[float], what: str, source: str = "summary.json") -> float:
    values = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not values:
        raise CalibrationError(f"{source}: no {what} measured")
    return statistics.fmean(values)


def _group_tokens(trace_path: Path) -> dict[int, float]:
    """Tokens of each complete group (input + output of its executions) from the run's trace."""
    if not trace_path.is_file():
        raise CalibrationError(f"{trace_path}: missing (the run wrote no complete group)")
    tokens: dict[int, float] = {}
    with open(trace_path, newline="") as fh:
        for line, row in enumerate(csv.DictReader(fh), start=2):
            try:
                q = int(row["query_id"])
                tokens[q] = tokens.get(q, 0.0) + float(row["input_tokens"]) + float(row["output_tokens"])
            except (KeyError, ValueError) as exc:
                raise CalibrationError(f"{trace_path}: line {line}: no token counts ({exc})") from None
    return tokens


def model_parameters(run_dir: Path) -> int:
    """Parameters of the model the run trained, read from its engine checkpoint's safetensors headers."""
    folder = run_dir / "engine-model"
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CalibrationError(f"{folder}: no safetensors files (the model the run served)")
    total = 0
    for path in files:
        with open(path, "rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(size))
        for name, info in header.items():
            if name != "__metadata__":
                total += math.prod(info["shape"])
    return total


def _timeline(run_dir: Path):
    from gyre.analysis.role_timeline import timeline
    from gyre.formats.eventlog import load_events, run_config

    log = run_dir / "log"
    for name in ("events.csv", "summary.json"):
        if not (log / name).is_file():
            raise CalibrationError(f"{log / name}: missing (is this a `gyre run` folder?)")
    cfg = run_config(log)
    events = load_events(log / "events.csv")
    return cfg, timeline(cfg, events), [e.now for e in events]


def resume_times(run_dir: Path, now: list[float]) -> list[float]:
    """Event-log times at which a resumed attempt's clock began (its last kept event's ``now``; ``now``:
    the final log's event times), for the attempts whose lineage the final log holds (a later resume
    that kept fewer events discarded the earlier attempt's later start). An attempt that kept no event
    started over at 0: no point."""
    points: list[int] = []
    attempts = [p for p in (run_dir / "attempts").glob("*/resume.json") if p.parent.name.isdigit()]
    for path in sorted(attempts, key=lambda p: int(p.parent.name)):
        kept = _read_json(path).get("events_kept")
        if not isinstance(kept, int) or kept < 0:
            raise CalibrationError(f"{path}: no events_kept count")
        points = [b for b in points if b <= kept] + [kept]
    return sorted({now[b - 1] for b in points if 0 < b <= len(now)})


def _redone_from(start: float, end: float, cuts: list[float]) -> float:
    """When the span [start, end] last began: ``start``, or the latest resume point inside it (the
    resumed attempt applied the action again there)."""
    return max([start, *(t for t in cuts if start < t < end)])


def publication_engines(cfg, tl, at: float) -> int:
    """Rollout engines serving at ``at``: the cells whose role span holds ``at`` is rollout, plus the
    separate pool's engine."""
    from gyre.roles import ROLLOUT

    cells = sum(any(span.label == ROLLOUT and span.start_s <= at < span.end_s for span in spans)
                for spans in tl.roles.values())
    return cells + (cfg.C_s > 0)


def publication_fit(engines: list[int], seconds: list[float]) -> tuple[float, float]:
    """(fixed seconds, seconds per engine) of publications by least squares; with one engine count (or
    none) the slope cannot be told from the fixed part: all fixed, slope 0. Slope and fixed part >= 0."""
    if not seconds:
        return 0.0, 0.0
    if len(set(engines)) < 2:
        return statistics.fmean(seconds), 0.0
    slope, intercept = statistics.linear_regression(engines, seconds)
    if slope <= 0:
        return statistics.fmean(seconds), 0.0
    if intercept < 0:
        return 0.0, sum(seconds) / sum(engines)
    return intercept, slope


def _transition_times(cfg, tl, cuts: list[float] = ()) -> dict[tuple[bool, str], list[float]]:
    """(satellite?, destination role) -> the completed transitions' costs, as the simulator models them
    (``cuts``: resume times; a transition spanning one is measured from the latest, where it was redone)."""
    from gyre.roles import DESTINATION, TO_ROLLOUT

    publications = list(tl.publications.values())
    out: dict[tuple[bool, str], list[float]] = {}
    for cell, spans in tl.roles.items():
        for span, _ in zip(spans, spans[1:]):  # a transition still open at the run's end is no sample
            if span.label not in DESTINATION:
                continue
            start = _redone_from(span.start_s, span.end_s, cuts)
            if span.label == TO_ROLLOUT:  # the simulator starts the cost once the publication in flight is done
                start = max([start, *(p.end_s for p in publications if p.start_s <= start < p.end_s)])
            out.setdefault((cell not in cfg.core_unit, DESTINATION[span.label]), []).append(
                max(0.0, span.end_s - start))
    return out


def measure(run_dir: str | Path) -> dict[str, Any]:
    """Every measured quantity calibration uses, with its sample count (for the cost file's comments)."""
    run_dir = Path(run_dir)
    s = _read_json(run_dir / "summary.json")
    reports = s.get("step_reports")
    if not reports:
        raise CalibrationError(f"{run_dir / 'summary.json'}: no step_reports (a run from an older gyre?)")
    cfg, tl, now = _timeline(run_dir)
    cuts = resume_times(run_dir, now)
    transitions = _transition_times(cfg, tl, cuts)
    # a core unit that never moved one way (it stayed in training all run) takes the satellites' mean
    to_training, to_rollout = (transitions.get((False, role)) or transitions.get((True, role), [])
                               for role in ("training", "rollout"))
    satellite = {f"satellite_to_{role}_s": (statistics.fmean(values), len(values))
                 for role in ("training", "rollout") if (values := transitions.get((True, role)))}
    compute_s = sum(sum(r.get("compute_s_by_cell", {}).values()) for r in reports)
    microsteps = sum(int(r.get("microsteps", 0)) for r in reports)
    fed = [g for groups in s.get("groups_fed", {}).values() for g in groups]
    tokens_by_group = _group_tokens(run_dir / "trace.csv")
    trained = [tokens_by_group[g] for g in fed if g in tokens_by_group]
    if compute_s <= 0 or not trained:
        raise CalibrationError(f"{run_dir / 'summary.json'}: no training compute or no trained group with tokens")
    spans = list(tl.publications.values())
    publications = [span.end_s - _redone_from(span.start_s, span.end_s, cuts)  # final StepDone -> PublishDone
                    for span in spans]
    fixed, per_engine = publication_fit([publication_engines(cfg, tl, span.start_s) for span in spans],
                                        publications)
    pulls = [j["pull_s"] for r in reports for j in (r.get("joins") or {}).values() if j and "pull_s" in j]
    return {
        "to_training_s": (_mean(to_training, "core rollout -> training transition", EVENTS), len(to_training)),
        "to_rollout_s": (_mean(to_rollout, "core training -> rollout transition", EVENTS), len(to_rollout)),
        **satellite,
        "publish_s": (fixed if publications else _mean(publications, "publication", EVENTS), len(publications)),
        "publish_engine_s": (per_engine, len(publications)),
        "optimizer_s": (_mean([r.get("update_s") for r in reports], "optimizer update"), len(reports)),
        "weight_pull_s": (statistics.fmean(pulls) if pulls else 0.0, len(pulls)),
        "compute_s": (compute_s, microsteps),
        "trained_tokens": (sum(trained) * len(fed) / len(trained), len(fed)),
        "groups_trained": (len(fed), len(fed)),
        "parameters": (model_parameters(run_dir), 1),
        "micro_step_tokens": (_token_budget(run_dir), 0),
    }


def _token_budget(run_dir: Path) -> int:
    """The run's packer token budget (``job.json``, ``runtime.job``)."""
    job = _read_json(run_dir / "job.json")
    budget = job.get("token_budget")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise CalibrationError(f"{run_dir / 'job.json'}: token_budget must be an integer >= 1, got {budget!r}")
    return budget


def calibrate(run_dir: str | Path) -> dict[str, float | int]:
    """The ``CostModel`` fields measured from ``run_dir`` (see the module docstring for each)."""
    m = measure(run_dir)
    params, tokens, compute_s = m["parameters"][0], m["trained_tokens"][0], m["compute_s"][0]
    fields = {
        "to_training_s": m["to_training_s"][0], "to_rollout_s": max(0.0, m["to_rollout_s"][0]),
        **{k: max(0.0, m[k][0]) for k in ("satellite_to_training_s", "satellite_to_rollout_s") if k in m},
        "publish_s": m["publish_s"][0], "publish_engine_s": m["publish_engine_s"][0], "publish_node_gbps": HUGE_GBPS,
        "params_b": params / 1e9, "active_params_b": params / 1e9, "bytes_per_param": 4.0,
        "node_peak_tflops": FLOPS_PER_PARAM_TOKEN * params * tokens / compute_s / 1e12,
        "train_utilisation": 1.0,
        "micro_step_tokens": m["micro_step_tokens"][0],
        "optimizer_s": m["optimizer_s"][0], "weight_pull_s": m["weight_pull_s"][0],
        "warmup_s": 0.0, "drain_s": 0.0, "grad_reduce_s": 0.0, "broadcast_s": 0.0,
        "sandbox_start_s": 0.0, "evaluation_s": 0.0, "engine_load_alpha": 0.0,
    }
    known = CostModel.__dataclass_fields__
    fields = {k: v for k, v in fields.items() if k in known}
    CostModel(**fields)  # the simulator's own checks
    return fields


def write_cost_file(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write ``costs.toml`` (default: in ``run_dir``) with each constant and how it was measured."""
    run_dir = Path(run_dir)
    fields, m = calibrate(run_dir), measure(run_dir)
    out = Path(out) if out is not None else run_dir / COST_FILE
    lines = [f"# gyre calibrate {run_dir}: cost constants measured from a real run (gyre.analysis.calibrate)",
             f"# trained {m['groups_trained'][0]} groups, {m['compute_s'][1]} micro-steps, "
             f"{m['compute_s'][0]:.3f} cell compute seconds, {m['trained_tokens'][0]:.0f} tokens, "
             f"{m['parameters'][0]} parameters", "[costs]"]
    for key, value in fields.items():
        samples = m.get(key, (None, None))[1]
        note = f"  # mean of {samples}" if samples else ""
        lines.append(f"{key} = {value!r}{note}" if isinstance(value, int) else f"{key} = {float(value)!r}{note}")
    out.write_text("\n".join(lines) + "\n")
    return out
