"""Count the ways to configure a run: ``python tools/count_config_ways.py`` prints them as JSON.

A way is one thing a user sets that changes what a run does:
- a command-line flag of ``gyre run`` or ``gyre sim`` (``--help`` excluded);
- a key of a job file: each ``[job]`` key holding a value, each entry of its
  tables with known entries (``[model]``, ``[job.schedule]``: SchedulerConfig's
  fields, ``[job.layout]``: GpuLayout's, ``[cluster]``: ClusterConfig's), and a
  free-form table (``[job.harness_options]``: the adapter's own keywords) as one;
- an environment variable ``GYRE_*`` that gyre/, sim/ or real/ reads
  (``os.environ.get(NAME ...)`` or ``os.environ[NAME]``, NAME a literal or a
  module constant).

It reads the job file's keys from ``job_file.job_to_table(JobConfig())`` when there is
one, else from the fields of ``JobConfig`` (its form before the tree), so the
same script counts any revision: run it with that revision importable as ``gyre``
(and ``--root`` its checkout).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("gyre", "sim", "real")
FREE_TABLES = ("harness_options",)


def cli_flags() -> dict[str, list[str]]:
    from gyre.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    return {name: sorted(flag for action in commands[name]._actions for flag in action.option_strings
                         if flag.startswith("--") and flag != "--help") for name in ("run", "sim")}


def job_file_keys() -> list[str]:
    from gyre.config import SchedulerConfig
    from gyre.real.cluster.config import ClusterConfig
    from gyre.real.runtime.job import JobConfig
    from gyre.real.runtime.layout import GpuLayout

    try:
        from gyre.real.runtime.job_file import job_to_table

        table: dict[str, Any] = job_to_table(JobConfig())
    except ImportError:  # the flat JobConfig of before
        table = dataclasses.asdict(JobConfig())
    entries = {"schedule": SchedulerConfig, "layout": GpuLayout, "cluster": ClusterConfig}
    keys = []
    for key in table:
        if key in FREE_TABLES:
            keys.append(f"{key}.*")
        elif key in entries:
            keys += [f"{key}.{f.name}" for f in dataclasses.fields(entries[key])]
        elif key == "model":
            keys += ["model.checkpoint", "model.dtype"]
        else:
            keys.append(key)
    keys += [f"{key}.{f.name}" for key, cls in entries.items() if key not in table
             for f in dataclasses.fields(cls)]  # tables a default job leaves out
    return sorted(set(keys))


def environment_variables(root: Path = ROOT) -> list[str]:
    names = set()
    for room in SCANNED:
        for path in sorted((root / room).rglob("*.py")):
            names |= _environment_reads(ast.parse(path.read_text()))
    return sorted(names)


def _environment_reads(tree: ast.Module) -> set[str]:
    constants = {target.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
                 and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
                 for target in node.targets if isinstance(target, ast.Name)}
    found = set()
    for node in ast.walk(tree):
        arg = None
        if isinstance(node, ast.Call) and _is_environ(getattr(node.func, "value", None)) and node.args:
            arg = node.args[0] if getattr(node.func, "attr", "") == "get" else None
        elif isinstance(node, ast.Subscript) and _is_environ(node.value):
            arg = node.slice
        name = arg.value if isinstance(arg, ast.Constant) else constants.get(getattr(arg, "id", ""))
        if isinstance(name, str) and name.startswith("GYRE_"):
            found.add(name)
    return found


def _is_environ(node: Any) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ"


def count(root: Path = ROOT) -> dict[str, Any]:
    flags, keys, env = cli_flags(), job_file_keys(), environment_variables(root)
    total = sum(len(v) for v in flags.values()) + len(keys) + len(env)
    return {"total": total, "cli_flags": flags, "job_file_keys": keys, "environment": env}


if __name__ == "__main__":  # -v: list every way; --root DIR: scan that checkout's sources for GYRE_* reads
    result = count(Path(sys.argv[sys.argv.index("--root") + 1]) if "--root" in sys.argv else ROOT)
    json.dump(result if "-v" in sys.argv else {k: (len(v) if isinstance(v, list) else v)
                                                   for k, v in result.items() if k != "cli_flags"}
              | {"cli_flags": {k: len(v) for k, v in result["cli_flags"].items()}}, sys.stdout, indent=1)
    print()
