"""``gyre traj``: inspect recorded executions.

- ``gyre traj stats PATH [--json] [--harness NAME]`` builds the trajectory tree
  of every execution in the record log PATH and prints its statistics (see
  ``tree_stats.py``) and the role of each leaf;
- ``gyre traj show PATH --out FILE [--execution ID]`` draws the prefix graph
  (``.dot``, ``.png``, ``.svg`` or ``.pdf``).

Handlers return 0 on success and 1 on a bad input (missing file, malformed
log, unknown execution), with a one-line message on stderr instead of a
traceback. A torn tail is skipped with a warning, like every reader.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from gyre.trajectory.harness_roles import HARNESS_ROLES, leaf_roles, roles_for  # no numpy: keeps `gyre --help` fast


def register(subparsers) -> None:
    parser = subparsers.add_parser("traj", help="inspect recorded executions (trajectory trees)")
    commands = parser.add_subparsers(dest="traj_command", metavar="SUBCOMMAND", required=True)
    stats = commands.add_parser("stats", help="print tree statistics of a record log")
    stats.add_argument("path", help="record log of one execution (.tito)")
    stats.add_argument("--json", action="store_true", help="print JSON instead of text")
    stats.add_argument("--harness", default="claude-code", choices=sorted(HARNESS_ROLES))
    stats.set_defaults(func=run_stats)
    show = commands.add_parser("show", help="draw the prefix graph of a record log")
    show.add_argument("path", help="record log of one execution (.tito)")
    show.add_argument("--out", required=True, help="output file: .dot, .png, .svg or .pdf")
    show.add_argument("--execution", default=None, help="execution id when the log holds several")
    show.add_argument("--harness", default="claude-code", choices=sorted(HARNESS_ROLES))
    show.set_defaults(func=run_show)


def load_trees(path: str | Path) -> list:
    """One closed ``TrajectoryTree`` per execution found in the log, in order of first appearance."""
    from gyre.real.store.tito_log import read_records
    from gyre.trajectory.tree import TrajectoryTree

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no record log at {path}")
    by_execution: dict[str, list] = {}
    for record in read_records(path):
        by_execution.setdefault(record.execution_id, []).append(record)
    trees = []
    for execution_id, records in by_execution.items():
        tree = TrajectoryTree.from_records(records, execution_id)
        tree.close()
        trees.append(tree)
    return trees


def _fail(message: str) -> int:
    print(f"gyre traj: {message}", file=sys.stderr)
    return 1


def _load_or_fail(path: str) -> tuple[list, int]:
    from gyre.trajectory.records import RecordError
    from gyre.trajectory.tree import TreeError

    try:
        return load_trees(path), 0
    except (OSError, RecordError, TreeError) as exc:
        return [], _fail(str(exc))


def run_stats(args: argparse.Namespace) -> int:
    from gyre.trajectory.tree_stats import tree_stats

    trees, failed = _load_or_fail(args.path)
    if failed:
        return failed
    roles = roles_for(args.harness)
    reports = []
    for tree in trees:
        report = tree_stats(tree).as_dict()
        report["leaf_roles"] = dict(Counter(leaf_roles(tree, roles).values()))
        reports.append(report)
    if args.json:
        print(json.dumps(reports, indent=2))
        return 0
    if not trees:
        print(f"{args.path}: no records")
    for tree, report in zip(trees, reports):
        print(tree_stats(tree).format())
        print("leaf roles         " + ", ".join(f"{r}={n}" for r, n in sorted(report["leaf_roles"].items())))
    return 0


def run_show(args: argparse.Namespace) -> int:
    from gyre.analysis.prefix_graph import render_prefix_graph
    from gyre.trajectory.tree_stats import tree_stats

    trees, failed = _load_or_fail(args.path)
    if failed:
        return failed
    if args.execution is not None:
        trees = [t for t in trees if t.execution_id == args.execution]
    if len(trees) != 1:
        found = "no execution" if not trees else f"{len(trees)} executions"
        return _fail(f"{args.path}: {found} to draw; pick one with --execution")
    tree = trees[0]
    stats = tree_stats(tree)
    title = f"{tree.execution_id}: {stats.requests} requests, {stats.nodes} nodes, {stats.leaves} leaves"
    try:
        out = render_prefix_graph(tree, leaf_roles(tree, roles_for(args.harness)), args.out, title)
    except (ValueError, OSError) as exc:
        return _fail(str(exc))
    print(f"wrote {out}")
    return 0
