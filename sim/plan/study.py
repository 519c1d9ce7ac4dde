"""The search itself: an Optuna multi-objective study over the schedule space, kept in SQLite.

``run_study(request, db_path, budget, mapper)`` opens (or creates) the study
``plan`` in ``sqlite:///DB`` and asks the sampler for candidates until the
study holds ``budget`` finished trials; it then returns every trial as a
``TrialRecord``. Objectives, all minimised: mean total time (h), mean
staleness, max staleness (``gyre.sim.plan.evaluate``). The sampler is
Optuna's multi-objective TPE, seeded, with the staleness target as
constraints (``Trial.set_constraint``) (measured mean <= target mean, and max <= target max when given),
so it learns where the feasible schedules are.

- A candidate that cannot be a schedule (``space.Refused``: cells that do not
  fit, phi * B not whole, anything the policy core or the simulator refuses)
  is told to the study as FAIL with its reason in the user attribute
  ``refused``: it counts against the budget, stops nothing, and is reported.
- A candidate already evaluated (the sampler may propose a point twice) reuses
  the stored values: same values, no simulation (attribute ``reused``).
- A new study first asks the paper's Gyre schedule at the target on each
  cell size (``warm_start``), then what the sampler proposes.
- Candidates are asked ``batch`` at a time and their (candidate, seed) runs
  go through ``mapper`` together; the batch does not depend on the mapper or
  its workers, so local processes and Ray tasks give the same study.
- Resume and extend: rerunning with the same folder continues the stored
  study up to the new budget. The sampler is reseeded from the request's seed
  and the number of trials already finished, so a rerun is deterministic
  given the stored history. A trial left RUNNING by an interrupted process is
  not counted and is marked FAIL (``interrupted``) when the study reopens.

Invariants: the stored request (``user_attrs["request"]``) must match a
reopened study's (a different space or workload raises ValueError naming
the difference); counted trials never exceed ``max(budget, stored)``;
``optuna`` is imported here and nowhere else in the simulator.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gyre.sim.plan.evaluate import Mapper, Workload, aggregate, serial_map, simulate
from gyre.sim.plan.space import Cluster, Refused, SearchSpace, cells_key, schedule_of

STUDY = "plan"
OBJECTIVES = ("time_h", "staleness", "staleness_max")


@dataclass(frozen=True)
class PlanRequest:
    workload: Workload
    cluster: Cluster
    space: SearchSpace = field(default_factory=SearchSpace)
    target_mean: float = 1.5
    target_max: float | None = None
    seed: int = 0
    batch: int = 4
    startup: int = 10  # random candidates before TPE models the front
    warm: bool = True  # ask the warm-start schedules first (``warm_start``)

    def fingerprint(self) -> str:
        """What a stored study must match to be resumed (everything but the budget)."""
        return json.dumps(asdict(self), sort_keys=True, default=str)

    def violations(self, staleness: float, staleness_max: float) -> list[float]:
        """Optuna constraint values (<= 0 means met) for the staleness target."""
        out = [staleness - self.target_mean]
        if self.target_max is not None:
            out.append(staleness_max - self.target_max)
        return out


@dataclass(frozen=True)
class TrialRecord:
    number: int
    point: dict[str, Any]
    schedule: dict[str, Any] | None
    values: tuple[float, float, float] | None  # OBJECTIVES, None when refused
    attrs: dict[str, Any]
    refused: str | None

    @property
    def feasible(self) -> bool:
        return self.values is not None and not any(v > 1e-9 for v in self.attrs.get("constraints", [1.0]))

    @property
    def scores(self) -> tuple[float, float, float]:
        """``values`` of an evaluated trial; a refused one has none (ValueError naming it)."""
        if self.values is None:
            raise ValueError(f"trial {self.number} has no objective values: refused ({self.refused})")
        return self.values

    @property
    def evaluated_schedule(self) -> dict[str, Any]:
        """``schedule`` of an evaluated trial; a refused one has none (ValueError naming it)."""
        if self.schedule is None:
            raise ValueError(f"trial {self.number} has no evaluated schedule: refused ({self.refused})")
        return self.schedule


def _suggest(trial: Any, request: PlanRequest) -> dict[str, Any]:
    cluster, space = request.cluster, request.space
    size = trial.suggest_categorical("nodes_per_cell", list(cluster.cell_sizes))
    point = {"nodes_per_cell": size, cells_key(size): trial.suggest_int(cells_key(size), 1, cluster.nodes // size)}
    for name, values in space.choices().items():
        point[name] = trial.suggest_categorical(name, list(values))
    return {**point, **space.fixed}


def warm_start(request: PlanRequest) -> list[dict[str, Any]]:
    """The paper's Gyre schedule at the target on each cell size, where the space holds it: every node in
    fine cells, streaming, phi = 0.5 and mu = 2 (E[d] - 0.5) + 1 (phi = E[d], mu = 1 below 0.5), the core's
    default rho_min and tau. Asked first, so the search starts from the known schedule, not from nothing."""
    target, space = request.target_mean, request.space
    phi, mu = (0.5, 2 * (target - 0.5) + 1) if target >= 0.5 else (target, 1.0)
    wanted: dict[str, Any] = {"phi": phi, "mu": mu, "rho_min": 0.5, "tau": 30.0, "streaming": True,
                              "granularity": "fine"}
    choices = space.choices()
    if any(name in choices and value not in choices[name] for name, value in wanted.items()):
        return []
    rest = {name: (int(value) if name == "mu" else value) for name, value in wanted.items() if name in choices}
    return [{"nodes_per_cell": size, cells_key(size): request.cluster.nodes // size, **rest}
            for size in request.cluster.cell_sizes]


def _key(point: dict[str, Any]) -> str:
    return json.dumps(point, sort_keys=True)


def open_study(request: PlanRequest, db_path: Path) -> Any:
    """The stored study (created if new), checked against ``request``, with a freshly seeded sampler."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{db_path}"
    study = optuna.create_study(storage=storage, study_name=STUDY, load_if_exists=True,
                                directions=["minimize"] * len(OBJECTIVES))
    stored = study.user_attrs.get("request")
    if stored is None:
        study.set_user_attr("request", request.fingerprint())
    elif stored != request.fingerprint():
        raise ValueError(f"{db_path} holds a plan for another request; use a new --out folder or the same "
                         f"arguments.\nstored:    {stored}\nrequested: {request.fingerprint()}")
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        study._storage.set_trial_user_attr(trial._trial_id, "refused", "interrupted")
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
    finished = len(_finished(study))
    if request.warm and not study.get_trials(deepcopy=False):
        for point in warm_start(request):
            study.enqueue_trial(point)
    with warnings.catch_warnings():  # ``group`` (conditional cells@S) is marked experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.sampler = optuna.samplers.TPESampler(seed=request.seed * 1_000_003 + finished, multivariate=True,
                                                   group=True, n_startup_trials=request.startup)
    return study


def _finished(study: Any) -> list[Any]:
    import optuna

    return study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,
                                                     optuna.trial.TrialState.FAIL))


def _counted(study: Any) -> int:
    """Finished trials that count against the budget (an interrupted one does not)."""
    return sum(t.user_attrs.get("refused") != "interrupted" for t in _finished(study))


def run_study(request: PlanRequest, db_path: Path, budget: int, mapper: Mapper = serial_map,
              progress: Any = None) -> list[TrialRecord]:
    """Search until the study holds ``budget`` finished trials; every trial as a record (module docstring)."""
    if budget < 1:
        raise ValueError(f"budget must be >= 1 evaluation, got {budget}")
    study = open_study(request, db_path)
    known = {_key(r.point): r for r in records(study) if r.values is not None}
    while (left := budget - _counted(study)) > 0:
        trials = [study.ask() for _ in range(min(request.batch, left))]
        points = [_suggest(t, request) for t in trials]
        schedules: list[dict[str, Any] | str] = []
        for point in points:
            try:
                schedules.append(schedule_of(request.cluster, point))
            except Refused as exc:
                schedules.append(str(exc))
        jobs = [(request.workload, "E0", s, seed) for p, s in zip(points, schedules)
                if isinstance(s, dict) and _key(p) not in known for seed in request.workload.seeds]
        rows = iter(mapper(simulate, jobs))
        for trial, point, schedule in zip(trials, points, schedules):
            _tell(study, request, trial, point, schedule, rows, known)
        if progress is not None:
            progress(_counted(study))
    return records(study)


def _tell(study: Any, request: PlanRequest, trial: Any, point: dict[str, Any], schedule: dict[str, Any] | str,
          rows: Any, known: dict[str, TrialRecord]) -> None:
    import optuna

    trial.set_user_attr("point", point)
    if isinstance(schedule, str):
        return _refuse(study, trial, schedule)
    if _key(point) in known:
        old = known[_key(point)]
        for name, value in {**old.attrs, "reused": old.number}.items():
            trial.set_user_attr(name, value)
        _constrain(trial, old.attrs["constraints"])
        study.tell(trial, list(old.scores))
        return None
    per_seed = [next(rows) for _ in request.workload.seeds]
    try:
        result = aggregate(per_seed)
    except Refused as exc:
        return _refuse(study, trial, str(exc))
    trial.set_user_attr("schedule", schedule)
    for name, value in result.as_attrs().items():
        trial.set_user_attr(name, value)
    constraints = request.violations(result.staleness, result.staleness_max)
    trial.set_user_attr("constraints", constraints)
    _constrain(trial, constraints)
    values = [result.time_h, result.staleness, result.staleness_max]
    frozen = study.tell(trial, values, state=optuna.trial.TrialState.COMPLETE)
    known[_key(point)] = _record(frozen)
    return None


def _constrain(trial: Any, constraints: list[float]) -> None:
    """The staleness target as the trial's constraints (<= 0: met), which the sampler reads."""
    for name, value in zip(("staleness_mean", "staleness_max"), constraints):
        trial.set_constraint(name, value)


def _refuse(study: Any, trial: Any, reason: str) -> None:
    import optuna

    trial.set_user_attr("refused", reason)
    study.tell(trial, state=optuna.trial.TrialState.FAIL)


def _record(trial: Any) -> TrialRecord:
    attrs = dict(trial.user_attrs)
    values = tuple(trial.values) if trial.values is not None else None
    return TrialRecord(number=trial.number, point=attrs.get("point", {}), schedule=attrs.get("schedule"),
                       values=values, attrs=attrs, refused=attrs.get("refused"))


def records(study: Any) -> list[TrialRecord]:
    """Every finished trial of the study, in trial order."""
    return [_record(t) for t in _finished(study)]
