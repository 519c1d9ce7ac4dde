"""Configuration of the black-box proxy (``gyre proxy --config FILE``).

One frozen, keyword-only dataclass per concern; ``load_proxy_config`` reads a
JSON or TOML file (by suffix) into them. Constructors never do I/O, and every
validation error names its field.

File shape (JSON shown; TOML has the same keys)::

    {
      "host": "127.0.0.1", "port": 8400,
      "model_path": "/models/tiny", "model_name": "gyre-policy",
      "records_dir": "/data/records", "admin_token": "...",
      "engines": [{"id": "e0", "url": "http://127.0.0.1:30000"}],
      "executions": {"<api key>": "<execution id>"},
      "retry": {"attempts": 4, "budget_s": 30, "connect_timeout_s": 2, "read_timeout_s": 120},
      "limits": {"max_body_bytes": 33554432, "default_max_tokens": 1024, "max_context_tokens": 262144,
                 "client_read_timeout_s": 60, "client_write_timeout_s": 60, "record_write_timeout_s": 10},
      "policy_version": 0, "harness": "generic", "fsync": true,
      "dump_requests": false
    }

``dump_requests`` (a debug mode, like slime's record-one-half-replay-the-other)
writes each accepted request body to
``records_dir/requests/<execution>/<request_id>.json`` so a test can compare
the records with exactly what the harness sent.

Keys registered at run time through the admin API are kept in
``records_dir/keys.json`` next to the record logs, so a restarted proxy still
knows them; the file holds only SHA-256 digests of keys (never a key) and is
readable by its owner only (0600). Execution and engine ids follow one rule
(``ID_RULE``, checked by ``check_id``) everywhere.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, TypeGuard

ID_RULE = "1-128 characters of [A-Za-z0-9._:-], starting with a letter or digit"
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


class ProxyConfigError(ValueError):
    """A proxy configuration that cannot be used; the message names the field."""


def valid_id(value: object) -> TypeGuard[str]:
    """The one id rule of the proxy (execution and engine ids; see ``ID_RULE``).

    An execution id names its record log and appears in admin URLs, so ".",
    "..", hidden names, slashes and very long names are refused everywhere:
    in the configuration, before the admin API issues a key, and when keys
    are loaded from disk. Ids that pass are also valid ``ModelCall`` ids."""
    return isinstance(value, str) and _ID.fullmatch(value) is not None


def check_id(field_name: str, value: object) -> str:
    if not valid_id(value):
        raise ProxyConfigError(f"{field_name} must be {ID_RULE}, got {str(value)[:140]!r}")
    return value


@dataclass(frozen=True, kw_only=True)
class EngineSpec:
    """One SGLang-compatible engine (``/generate`` and ``/abort_request``)."""

    id: str
    url: str

    def __post_init__(self) -> None:
        check_id("engines[].id", self.id)
        if not self.url.startswith(("http://", "https://")):
            raise ProxyConfigError(f"engines[{self.id}].url must be an http(s) URL, got {self.url!r}")
        object.__setattr__(self, "url", self.url.rstrip("/"))


def _check_numbers(settings: Any, section: str) -> None:
    """Every field of the dataclass ``settings`` is a number (not a bool, not NaN), named if not."""
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise ProxyConfigError(f"{section}.{f.name} must be a number, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How hard the proxy tries before answering with the API's overload error.

    ``attempts`` counts engine submissions of one call (first try, retries
    after failures, not reroutes ordered by the admin API); ``budget_s`` bounds
    the wall time spent retrying; ``backoff_s`` is the pause between tries.
    ``hold_s``: a call that finds no engine to take it (every engine draining,
    or every other one failed for it) waits up to that long for one, trying
    again every ``hold_poll_s`` (an engine undrained, added, or restarted under
    its id), each time with a fresh ``attempts``/``budget_s``, before the
    overload answer. 0 (the default): answer at once, as agent CLIs retry
    overload themselves; a training job holds, since an engine restart can
    outlast a harness's own retries (``gyre run`` sets it).
    """

    attempts: int = 4
    budget_s: float = 30.0
    backoff_s: float = 0.05
    connect_timeout_s: float = 2.0
    read_timeout_s: float = 120.0
    hold_s: float = 0.0
    hold_poll_s: float = 0.25

    def __post_init__(self) -> None:
        _check_numbers(self, "retry")
        if self.attempts < 1:
            raise ProxyConfigError("retry.attempts must be >= 1")
        for name in ("budget_s", "connect_timeout_s", "read_timeout_s", "hold_poll_s"):
            if getattr(self, name) <= 0:
                raise ProxyConfigError(f"retry.{name} must be > 0")
        for name in ("backoff_s", "hold_s"):
            if getattr(self, name) < 0:
                raise ProxyConfigError(f"retry.{name} must be >= 0")


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Request limits: bodies over ``max_body_bytes`` get 413, prompts over
    ``max_context_tokens`` get 400; ``default_max_tokens`` applies when the
    API allows omitting it (OpenAI); a body not received within
    ``client_read_timeout_s`` gets 408; a client that stops reading its
    response for ``client_write_timeout_s`` is cut off (its engine request
    aborted, its call not recorded unless its record was already committed); a
    record the disk has not made durable within ``record_write_timeout_s`` fails
    its call with 503 (``proxy.recording``: a stalled disk holds no one else)."""

    max_body_bytes: int = 32 * 1024 * 1024
    default_max_tokens: int = 1024
    max_context_tokens: int = 262_144
    client_read_timeout_s: float = 60.0
    client_write_timeout_s: float = 60.0
    record_write_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        _check_numbers(self, "limits")
        for name in ("max_body_bytes", "default_max_tokens", "max_context_tokens"):
            if getattr(self, name) < 1:
                raise ProxyConfigError(f"limits.{name} must be >= 1")
        for name in ("client_read_timeout_s", "client_write_timeout_s", "record_write_timeout_s"):
            if not getattr(self, name) > 0:
                raise ProxyConfigError(f"limits.{name} must be > 0")


@dataclass(frozen=True, kw_only=True)
class ProxyConfig:
    model_path: str
    records_dir: str
    admin_token: str
    engines: tuple[EngineSpec, ...]
    host: str = "127.0.0.1"
    port: int = 8400
    model_name: str = "gyre-policy"
    executions: Mapping[str, str] = field(default_factory=dict)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    limits: Limits = field(default_factory=Limits)
    policy_version: int = 0
    harness: str = "generic"
    fsync: bool = True
    stop_tokens: tuple[str, ...] = ("<|im_end|>", "<|endoftext|>")
    dump_requests: bool = False  # debug: keep every accepted body under records_dir/requests/<execution>/

    def __post_init__(self) -> None:
        if not self.engines:
            raise ProxyConfigError("engines must list at least one engine")
        ids = [e.id for e in self.engines]
        if len(set(ids)) != len(ids):
            raise ProxyConfigError(f"engines[].id must be unique, got {ids}")
        if len(self.admin_token) < 8:
            raise ProxyConfigError("admin_token must be at least 8 characters")
        if not 0 <= self.port < 65536:
            raise ProxyConfigError(f"port must be in [0, 65536), got {self.port}")
        if self.policy_version < 0:
            raise ProxyConfigError("policy_version must be >= 0")
        for key, execution in self.executions.items():
            if not isinstance(key, str) or not key:
                raise ProxyConfigError("executions maps non-empty API keys to execution ids")
            check_id("executions[].execution_id", execution)
            if key == self.admin_token:
                raise ProxyConfigError("an execution key must differ from admin_token")
        object.__setattr__(self, "executions", dict(self.executions))

    def with_overrides(self, **changes: Any) -> ProxyConfig:
        values = {name: getattr(self, name) for name in self.__dataclass_fields__}
        values.update(changes)
        return ProxyConfig(**values)


def _require(cls: type, data: Mapping[str, Any], what: str) -> None:
    """Name the fields of ``cls`` without a default that ``data`` lacks (not Python's own wording)."""
    missing = sorted(f.name for f in dataclasses.fields(cls) if f.name not in data
                     and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
    if missing:
        raise ProxyConfigError(f"missing {what}: {missing}")


def config_from_mapping(data: Mapping[str, Any]) -> ProxyConfig:
    """Build a ``ProxyConfig`` from parsed JSON/TOML; unknown keys are errors."""
    data = dict(data)
    known = set(ProxyConfig.__dataclass_fields__)
    unknown = set(data) - known
    if unknown:
        raise ProxyConfigError(f"unknown configuration keys: {sorted(unknown)}")
    _require(ProxyConfig, data, "configuration keys")
    engines = data["engines"]
    if not isinstance(engines, (list, tuple)) or not all(isinstance(e, Mapping) for e in engines):
        raise ProxyConfigError(f"engines must be a list of tables ({{id, url}}), got {engines!r:.80}")
    for index, engine in enumerate(engines):
        _require(EngineSpec, engine, f"keys of engines[{index}]")
    for section in ("retry", "limits"):
        if not isinstance(data.get(section, {}), Mapping):
            raise ProxyConfigError(f"{section} must be a table of settings, got {data[section]!r:.80}")
    try:
        data["engines"] = tuple(EngineSpec(**e) for e in data.get("engines", ()))
        data["retry"] = RetryPolicy(**data.get("retry", {}))
        data["limits"] = Limits(**data.get("limits", {}))
        if "stop_tokens" in data:
            data["stop_tokens"] = tuple(data["stop_tokens"])
        return ProxyConfig(**data)
    except TypeError as exc:
        raise ProxyConfigError(f"bad configuration: {exc}") from None


def load_proxy_config(path: str | Path) -> ProxyConfig:
    """Read ``path`` (``.toml`` or JSON) into a ``ProxyConfig``."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ProxyConfigError(f"{path}: cannot read: {exc}") from None
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ProxyConfigError(f"{path}: cannot parse: {exc}") from None
    return config_from_mapping(data)
