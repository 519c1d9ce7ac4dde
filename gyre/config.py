"""Scheduler configuration: one frozen, keyword-only dataclass.

Field names follow the symbols of docs/README.md#vocabulary so that ``--set phi=0.5`` reads like
the paper.

Invariants (enforced by ``__post_init__``, each error names its field):
- ``K >= 1`` cells, ``C_e >= 1`` executions per cell, ``C_s >= 0``;
- ``N >= 1``, ``B >= 1``, ``phi >= 0`` with ``phi * B`` a whole number of groups,
  ``mu >= 1`` an integer;
- ``0 < rho_min <= 1``, ``tau >= 0``;
- ``granularity == "none"`` (static split, the Async family) exactly when
  ``static_train_cells >= 1``, and then ``static_train_cells < K``;
- the rollout side always has capacity: ``C_s + (K - static_train_cells) * C_e > 0``;
- for the elastic granularities the capacity left while the first unit trains
  (``C_s`` for global/coarse, ``C_s + (K - 1) * C_e`` for fine) may be 0, but then
  the training unit can only switch when nothing is outstanding.

A configuration never does I/O and is hashable; ``replace_fields`` returns a
validated copy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from gyre.staleness import DISPATCH_POLICIES, predicted_staleness

Granularity = Literal["none", "global", "coarse", "fine"]
GRANULARITIES: tuple[str, ...] = ("none", "global", "coarse", "fine")


class ConfigError(ValueError):
    """An impossible configuration; the message names the offending field."""


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """Everything the policy core needs to decide; nothing about costs or time.

    ``granularity``:
      - ``none``: static split (Async): cells ``0..static_train_cells-1`` train
        forever, the rest roll out forever;
      - ``global``: all K cells switch as one unit, and only when no execution
        is outstanding (Colocate: training waits for the burst's rollouts);
      - ``coarse``: all K cells switch as one unit by the waterlevel rule; the
        separate pool keeps rolling out;
      - ``fine``: cells switch one at a time, core first, by the waterlevel rule.
    ``oversample``: extra executions dispatched per group (group of ``N + oversample``);
      a group is ready once ``N`` have closed, the surplus is cancelled.
    ``dispatch``: ``boundary`` (docs/staleness.md#staleness-identity: mu*B new groups after each
      publication) or ``continuous`` (a consumed group's slot is refilled at
      once, at the newest published version; same depth (phi + mu) * B).
    ``nodes_per_cell``: informational for drivers' cost models (training speed);
      the policy never uses it.
    """

    K: int = 8
    C_e: int = 144
    C_s: int = 0
    N: int = 16
    B: int = 32
    phi: float = 0.5
    mu: int = 3
    rho_min: float = 0.5
    tau: float = 30.0
    granularity: Granularity = "fine"
    streaming: bool = True
    static_train_cells: int = 0
    oversample: int = 0
    dispatch: str = "boundary"
    nodes_per_cell: int = 4

    def __post_init__(self) -> None:
        _validate(self)

    # ---- derived quantities -------------------------------------------------
    @property
    def group_size(self) -> int:
        """Executions dispatched per group (N plus oversampling surplus)."""
        return self.N + self.oversample

    @property
    def extra_groups(self) -> int:
        """phi * B as a whole number of groups."""
        return round(self.phi * self.B)

    @property
    def initial_groups(self) -> int:
        """Groups dispatched at the start: (phi + mu) * B."""
        return self.extra_groups + self.mu * self.B

    @property
    def predicted_staleness(self) -> float:
        """Theorem A.1's E[d] for this schedule (``gyre.staleness.predicted_staleness``)."""
        return predicted_staleness(self.phi, self.mu, self.dispatch)

    @property
    def static(self) -> bool:
        return self.granularity == "none"

    def transition_units(self) -> tuple[tuple[int, ...], ...]:
        """Ordered units that switch together; unit 0 holds the core cell."""
        if self.static:
            return ()
        if self.granularity == "fine":
            return tuple((c,) for c in range(self.K))
        return (tuple(range(self.K)),)

    @property
    def core_unit(self) -> tuple[int, ...]:
        """The cells that switch with the core cell (unit 0); empty for a static split."""
        units = self.transition_units()
        return units[0] if units else ()

    def replace_fields(self, **changes: Any) -> SchedulerConfig:
        """A validated copy with some fields changed."""
        return dataclasses.replace(self, **changes)


_INT_FIELDS = ("K", "C_e", "C_s", "N", "B", "mu", "static_train_cells", "oversample", "nodes_per_cell")


def _validate(cfg: SchedulerConfig) -> None:
    for name in _INT_FIELDS:
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
    for name in ("phi", "rho_min", "tau"):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{name} must be a number, got {value!r}")
    if not isinstance(cfg.streaming, bool):
        raise ConfigError(f"streaming must be true or false, got {cfg.streaming!r}")
    _check(cfg.K >= 1, "K", f"K must be >= 1 cell, got {cfg.K}")
    _check(cfg.C_e >= 1, "C_e", f"C_e must be >= 1 execution per cell, got {cfg.C_e}")
    _check(cfg.C_s >= 0, "C_s", f"C_s must be >= 0, got {cfg.C_s}")
    _check(cfg.N >= 1, "N", f"N must be >= 1 execution per group, got {cfg.N}")
    _check(cfg.B >= 1, "B", f"B must be >= 1 group per step, got {cfg.B}")
    _check(cfg.phi >= 0, "phi", f"phi must be >= 0, got {cfg.phi}")
    _check(abs(cfg.phi * cfg.B - round(cfg.phi * cfg.B)) < 1e-9, "phi",
           f"phi * B must be a whole number of groups, got phi={cfg.phi}, B={cfg.B}")
    _check(cfg.mu >= 1, "mu", f"mu must be >= 1 step per burst, got {cfg.mu}")
    _check(0 < cfg.rho_min <= 1, "rho_min", f"rho_min must be in (0, 1], got {cfg.rho_min}")
    _check(cfg.tau >= 0, "tau", f"tau must be >= 0 seconds, got {cfg.tau}")
    _check(cfg.oversample >= 0, "oversample", f"oversample must be >= 0, got {cfg.oversample}")
    _check(cfg.nodes_per_cell >= 1, "nodes_per_cell", f"nodes_per_cell must be >= 1, got {cfg.nodes_per_cell}")
    _check(cfg.dispatch in DISPATCH_POLICIES, "dispatch",
           f"dispatch must be one of {', '.join(DISPATCH_POLICIES)}, got {cfg.dispatch!r}")
    _check(cfg.granularity in GRANULARITIES, "granularity",
           f"granularity must be one of {', '.join(GRANULARITIES)}, got {cfg.granularity!r}")
    if cfg.granularity == "none":
        _check(cfg.static_train_cells >= 1, "static_train_cells",
               "granularity 'none' (static split) needs static_train_cells >= 1")
        _check(cfg.static_train_cells < cfg.K or cfg.C_s > 0, "static_train_cells",
               f"static_train_cells={cfg.static_train_cells} leaves no rollout capacity "
               f"with K={cfg.K} and C_s={cfg.C_s}")
        _check(cfg.static_train_cells <= cfg.K, "static_train_cells",
               f"static split of {cfg.static_train_cells} training cells is larger than the cluster (K={cfg.K})")
    else:
        _check(cfg.static_train_cells == 0, "static_train_cells",
               f"static_train_cells={cfg.static_train_cells} needs granularity 'none', got {cfg.granularity!r}")


def _check(ok: bool, field: str, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def parse_overrides(pairs: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Parse ``key=value`` strings into typed field values of SchedulerConfig.

    Unknown keys and unparsable values raise ConfigError naming the key.
    """
    fields = {f.name: f for f in dataclasses.fields(SchedulerConfig)}
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"override {pair!r} is not key=value")
        key, raw = (s.strip() for s in pair.split("=", 1))
        if key not in fields:
            raise ConfigError(f"unknown field {key!r}; known: {', '.join(fields)}")
        out[key] = _coerce(key, raw, fields[key].default)
    return out


def _coerce(key: str, raw: str, default: Any) -> Any:
    try:
        if isinstance(default, bool):
            lowered = raw.lower()
            if lowered in ("1", "true", "on", "yes"):
                return True
            if lowered in ("0", "false", "off", "no"):
                return False
            raise ValueError(raw)
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
        return raw
    except ValueError:
        raise ConfigError(f"{key}: cannot parse {raw!r} as {type(default).__name__}") from None
