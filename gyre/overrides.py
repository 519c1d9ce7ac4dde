"""One ``--set section.field=value`` syntax for every command that configures a run.

``gyre sim`` and ``gyre run`` both take ``--set section.field=value``: the
section names a component of the run's configuration (``schedule``,
``costs``; ``job``, ``model``, ``cluster``, ...) and the field one of its
fields. The section may be left out: the first section, in the command's
order, with a field of that name takes it (``gyre sim --set phi=0.5`` is
``--set schedule.phi=0.5``, ``gyre run --set steps=8`` is ``--set
job.steps=8``), so the short forms that worked before still work.

``parse_assignments(flag, items, sections)`` turns the command line's strings
into ``Assignment``s; each keeps the flag and the text it came from, so a
command that cannot use a value names both (``assignment.problem(message)``).
Typing the value is the command's own business (each component knows its
fields' types); ``toml_value`` is the shared reader for values written as
TOML, with a bare word read as text (``--set job.workdir=runs/x``).

Invariants: pure (no I/O); every error is an ``OverrideError`` whose message
starts with the flag and the assignment as given and names the unknown
section or field and the known ones; an assignment's section is
always one of ``sections`` and its field one of that section's fields (a
section whose fields are ``None`` takes any field: a free-form table).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from typing import Any, Iterable, Mapping


class OverrideError(ValueError):
    """A ``--set`` assignment that cannot be used; the message names the flag, the text and the field."""


@dataclass(frozen=True)
class Assignment:
    flag: str
    text: str      # as given on the command line
    section: str
    field: str
    raw: str       # the value's text

    @property
    def name(self) -> str:
        return f"{self.section}.{self.field}"

    def problem(self, message: str) -> OverrideError:
        return OverrideError(f"{self.flag} {self.text}: {message}")


def parse_assignments(flag: str, items: Iterable[str],
                      sections: Mapping[str, Iterable[str] | None]) -> list[Assignment]:
    """``section.field=value`` strings (section optional when unambiguous) checked against ``sections``."""
    known = {name: None if fields is None else tuple(fields) for name, fields in sections.items()}
    out = []
    for text in items:
        key, eq, raw = text.partition("=")
        key = key.strip()
        if not eq or not key:
            raise OverrideError(f"{flag} {text}: expected section.field=value, e.g. {flag} schedule.phi=0.5")
        section, field = _locate(flag, text, key, known)
        out.append(Assignment(flag, text, section, field, raw.strip()))
    return out


def _locate(flag: str, text: str, key: str, known: Mapping[str, tuple[str, ...] | None]) -> tuple[str, str]:
    section, dot, field = key.partition(".")
    if dot:
        if section not in known:
            raise OverrideError(f"{flag} {text}: unknown section {section!r}; sections: {', '.join(known)}")
        fields = known[section]
        if not field or "." in field or (fields is not None and field not in fields):
            listed = "any key" if fields is None else ", ".join(fields)
            raise OverrideError(f"{flag} {text}: unknown field {field!r} in {section}; its fields: {listed}")
        return section, field
    owners = [name for name, fields in known.items() if fields is not None and key in fields]
    if owners:
        return owners[0], key
    raise OverrideError(f"{flag} {text}: unknown field {key!r} (in no section: {', '.join(known)}); write "
                        f"{flag} section.field=value")


def toml_value(assignment: Assignment) -> Any:
    """The value read as TOML (``20``, ``0.5``, ``true``, ``"x"``, ``[1, 2]``, ``{a = 1}``); a bare word
    that is no TOML value is its own text (``runs/x``)."""
    try:
        return tomllib.loads(f"v = {assignment.raw}")["v"]
    except tomllib.TOMLDecodeError:
        if assignment.raw and not assignment.raw.startswith(("[", "{", '"', "'")):
            return assignment.raw
        raise assignment.problem(f"{assignment.raw!r} is not a TOML value") from None


def check_type(assignment: Assignment, value: Any, default: Any) -> Any:
    """``value`` when it has the type of the field's ``default`` (an int passes for a float)."""
    if default is None or isinstance(default, (dict, list, tuple)):
        return value
    expected = type(default)
    ok = isinstance(value, expected) and not (isinstance(value, bool) and expected is not bool)
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not ok:
        raise assignment.problem(f"{assignment.name} takes {_kind(expected)}, not {assignment.raw!r}")
    return value


def _kind(expected: type) -> str:
    return {bool: "true or false", int: "an integer", float: "a number", str: "text"}.get(
        expected, expected.__name__)
