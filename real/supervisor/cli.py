"""``gyre stop RUN_DIR``: stop a run cleanly, whatever is left of it.

The run's driver (``gyre run``, the pid holding ``RUN_DIR/.gyre-run.lock``)
gets SIGTERM and stops its engines, cells, proxy and harnesses in order, as
after Ctrl-C; the run's supervisor (``RUN_DIR/supervisor``) stops every
process it owns and exits, also when the driver is already gone (a killed
run: nothing then waits for its lease to expire); so does each node's
supervisor of a run placed on a Ray cluster (``cluster.node_supervisor``). Exits 0 with one line per
thing stopped; 2 when RUN_DIR is not a folder.
"""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("stop", help="stop a run: its driver (gyre run) and its supervisor's harnesses")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run's folder (the job's workdir)")
    parser.set_defaults(func=stop)


def stop(args: argparse.Namespace) -> int:
    from gyre.real.supervisor.client import stop_run

    try:
        lines = stop_run(args.run_dir)
    except FileNotFoundError as exc:
        print(f"gyre stop: error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0
