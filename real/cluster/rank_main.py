"""``python -m gyre.real.cluster.rank_main``: one rank of a training cell, started by a node agent.

Reads ``(CellConfig, cell, rank)`` pickled on stdin (``cluster.agent``
writes it) and runs ``train.cell.cell_main``, the same entry point a
single-machine run forks (``train.plane``): the process arms its parent-death
signal first thing, so it ends with the agent that started it.
"""

from __future__ import annotations

import pickle
import sys


def main() -> None:
    cfg, cell, rank = pickle.load(sys.stdin.buffer)
    from gyre.real.train.cell import cell_main

    cell_main(cfg, cell, rank)


if __name__ == "__main__":
    main()
