"""The job file's keys and the job's configuration tree (``runtime.job_config``), mapped both ways.

A job file is a flat ``[job]`` table with sub-tables (``schedule``,
``harness_options``, ``layout``, ``cluster``) and a ``[model]`` table; each
field of the tree names the key it reads (``job_config.file_key``).
``job_from_table`` builds the tree, ``job_to_table`` writes it back (what
``job.json`` and the summary's ``config`` hold), ``field_path`` tells where
the tree's ``section.field`` lives in the file and ``field_default`` the
default of the field at a place (``gyre run --set`` takes both spellings).

Invariants: pure (no I/O); ``job_from_table(job_to_table(job)) == job``; a key
no field reads, in ``[job]`` or in a table with known keys, is refused naming
it and the known ones; a key left out takes its field's default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import fields
from typing import Any, Mapping

from gyre.real.runtime.job_config import JobConfig, file_key, section_class

SECTIONS: dict[str, type] = {f.name: cls for f in fields(JobConfig) if (cls := section_class(f)) is not None}


def job_from_table(table: Mapping[str, Any]) -> JobConfig:
    """The tree from a job file's flat ``[job]`` table (with ``model``/``cluster`` tables in it); an unknown
    key, a value of the wrong type or an impossible one raises ValueError naming it."""
    if not isinstance(table, Mapping):
        raise ValueError(f"the [job] table must be a table, not {table!r}")
    claimed: dict[str, set[str]] = {}
    values = {name: _read(cls, table, claimed) for name, cls in SECTIONS.items()}
    top = {f.name: _read_field(f, table, claimed) for f in fields(JobConfig) if f.name not in SECTIONS}
    _refuse_unknown(table, claimed)
    values.update({name: value for name, value in top.items() if value is not dataclasses.MISSING})
    return JobConfig(**values)


def _read(cls: type, table: Mapping[str, Any], claimed: dict[str, set[str]]) -> Any:
    found = {f.name: _read_field(f, table, claimed) for f in fields(cls)}
    return cls(**{name: value for name, value in found.items() if value is not dataclasses.MISSING})


def _read_field(f: dataclasses.Field[Any], table: Mapping[str, Any], claimed: dict[str, set[str]]) -> Any:
    outer, dot, inner = file_key(f).partition(".")
    claimed.setdefault(outer, set()).add(inner)
    holder = table.get(outer) if dot else table
    if dot and holder is not None and not isinstance(holder, Mapping):
        raise ValueError(f"[{outer}] must be a table, not {holder!r}")
    key = inner if dot else outer
    if holder is None or key not in holder:
        return dataclasses.MISSING
    parse = f.metadata.get("table")
    return parse(holder[key]) if parse is not None else holder[key]


def _refuse_unknown(table: Mapping[str, Any], claimed: dict[str, set[str]]) -> None:
    unknown = sorted(set(table) - set(claimed))
    if unknown:
        raise ValueError(f"unknown field(s) {unknown}; known: {sorted(claimed)}")
    for outer, inner in claimed.items():
        if "" not in inner and isinstance(table.get(outer), Mapping):
            extra = sorted(set(table[outer]) - inner)
            if extra:
                raise ValueError(f"[{outer}]: unknown key(s) {extra}; known: {sorted(inner)}")


def job_to_table(job: JobConfig) -> dict[str, Any]:
    """The job as its file's flat ``[job]`` table (``job_from_table`` reads it back to an equal job)."""
    out: dict[str, Any] = {}
    for owner in (job, *(getattr(job, name) for name in SECTIONS)):
        for f in fields(owner):
            if f.name in SECTIONS and owner is job:
                continue
            value = getattr(owner, f.name)
            if f.metadata.get("table") is not None:
                if value is None:
                    continue
                value = dataclasses.asdict(value)
            outer, dot, inner = file_key(f).partition(".")
            if dot:
                out.setdefault(outer, {})[inner] = value
            else:
                out[outer] = dict(value) if isinstance(value, Mapping) else value
    return out


def field_path(section: str, name: str) -> tuple[str, ...] | None:
    """Where the tree's ``section.name`` lives in the job file (None: ``name`` is no field of ``section``)."""
    cls = SECTIONS.get(section)
    for f in fields(cls) if cls is not None else ():
        if f.name == name:
            return tuple(file_key(f).split("."))
    return None


def field_default(path: tuple[str, ...]) -> Any:
    """The default of the field the job file holds at ``path`` (None: a table entry, or no such field)."""
    for owner in (JobConfig, *SECTIONS.values()):
        for f in fields(owner):
            if tuple(file_key(f).split(".")) == path and f.name not in SECTIONS:
                return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return None
