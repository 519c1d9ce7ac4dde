"""A job file's sub-table as a dataclass: the one place ``[cluster]``, ``[job.layout]`` and the like are read.

Invariants: a value that is not a table, or a table with a key the dataclass
lacks, raises ValueError naming the table and the key(s), with the known keys;
so does a missing ``required`` key, with what it should hold; the dataclass is
built from the table unchanged (its own ``check`` judges the values). Stdlib
only: checking a table never imports Ray, torch or SGLang.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, ClassVar, Mapping, Protocol, TypeVar


class Dataclass(Protocol):
    """Any dataclass: what ``dataclasses.fields`` reads (the class attribute every dataclass gets)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]


T = TypeVar("T", bound=Dataclass)


def from_table(cls: type[T], table: Any, name: str, example: str = "",
               required: Mapping[str, str] | None = None) -> T:
    """``cls(**table)`` once ``table`` is a mapping of ``cls``'s fields only, holding every ``required`` key
    (key -> what it should hold); ``name`` is how errors call the table."""
    if not isinstance(table, Mapping):
        hint = f" (e.g. {example})" if example else ""
        raise ValueError(f"{name} must be a table{hint}, not {table!r}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ValueError(f"{name}: unknown key(s) {unknown}; known: {sorted(known)}")
    for key, meaning in (required or {}).items():
        if key not in table:
            raise ValueError(f"{name}.{key} is missing: {meaning}")
    return cls(**dict(table))
