"""The job's choice of harness and evaluator, by name or as ``"module:Class"``.

``resolve_harness(spec, options)`` turns a job's ``harness`` field into an
adapter instance the ``HarnessRunner`` can run:

- a built-in name: ``"scripted"``, ``"mini-swe-agent"``, ``"claude-code"``,
  ``"codex"`` (the adapters of ``harness.runner``);
- ``"module:Class"``: any importable class whose instances have a ``name``
  and a ``command(task, base_url, key, home) -> (argv, env)`` method (the
  ``HarnessAdapter`` protocol).

``options`` (the job's ``[job.harness_options]`` table) are the class's
keyword arguments, e.g. ``binary`` for an npm harness or ``calls`` for the
scripted one. ``resolve_class(spec, field)`` imports the ``"module:Class"``
of an evaluator.

Invariants: every failure is a ``ValueError`` whose message names the job
field and the value (unknown name, malformed spec, module that does not
import, missing attribute, not a class, missing method, bad options);
resolving imports the module but starts nothing.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Mapping

from gyre.real.harness.runner import ClaudeCode, Codex, MiniSweAgent, ScriptedHarness

BUILTIN_HARNESSES: dict[str, type] = {"scripted": ScriptedHarness, "mini-swe-agent": MiniSweAgent,
                                      "claude-code": ClaudeCode, "codex": Codex}


def resolve_class(spec: object, field: str) -> type:
    """The class named by ``"module:Class"`` (``Class`` may be dotted: ``Outer.Inner``)."""
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ValueError(f"job field {field} must be \"module:Class\", not {spec!r}")
    module_name, qualname = spec.split(":")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import-time error is the user's module's
        raise ValueError(f"job field {field}: module {module_name!r} does not import: "
                         f"{type(exc).__name__}: {exc}") from None
    for part in qualname.split("."):
        if not hasattr(target, part):
            raise ValueError(f"job field {field}: module {module_name!r} has no attribute {qualname!r}")
        target = getattr(target, part)
    if not inspect.isclass(target):
        raise ValueError(f"job field {field}: {spec!r} is not a class")
    return target


def require_method(cls: type, method: str, field: str, spec: str) -> None:
    if not callable(getattr(cls, method, None)):
        raise ValueError(f"job field {field}: {spec!r} has no {method}() method")


def construct(cls: type, options: Mapping[str, Any], field: str, spec: str) -> Any:
    """``cls(**options)``; a bad option is named (unknown keyword, wrong value)."""
    if not isinstance(options, Mapping):
        raise ValueError(f"job field {field}: options must be a table, not {options!r}")
    try:
        return cls(**dict(options))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"job field {field}: {spec!r} rejects options {dict(options)!r}: {exc}") from None


def resolve_harness(spec: object, options: Mapping[str, Any] | None = None) -> Any:
    """A harness adapter instance for the job's ``harness`` field (see the module docstring)."""
    options = options or {}
    if isinstance(spec, str) and spec in BUILTIN_HARNESSES:
        return construct(BUILTIN_HARNESSES[spec], options, "harness_options", spec)
    if not isinstance(spec, str) or ":" not in spec:
        raise ValueError(f"job field harness must be one of {sorted(BUILTIN_HARNESSES)} or \"module:Class\", "
                         f"not {spec!r}")
    cls = resolve_class(spec, "harness")
    require_method(cls, "command", "harness", spec)
    adapter = construct(cls, options, "harness_options", spec)
    if not isinstance(getattr(adapter, "name", None), str):
        raise ValueError(f"job field harness: {spec!r} instances need a name (str)")
    return adapter
