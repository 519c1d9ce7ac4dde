"""Placing a real run on a Ray cluster (the ``[cluster]`` table, ``gyre run --cluster ADDRESS``).

- ``config``: ``ClusterConfig`` and the table's checks (no Ray import: a job
  without ``[cluster]``, and ``make run``, never need Ray);
- ``placement``: connect, one ``STRICT_PACK`` placement group per cell (its
  ranks and its SGLang engine on one node), the driver on the head, and the
  handles the training plane and the engine manager drive remote processes by;
- ``agent``: the node agent (a Ray actor in each group) that starts a cell's
  ranks and its engine on its node with the single-machine command lines;
- ``rank_main``: the entry point of a rank started by an agent;
- ``holder``: what an agent starts an engine's reaper behind, so the reaper
  survives Ray's SIGKILL of an exiting worker's children long enough to end
  the engine's process group.

A single-machine run places nothing: the plane forks its cells and the engine
manager starts its engines on this machine, as before.

May import: ``gyre``, ``gyre.real.runtime.lifetime`` / ``engine_watch`` (the
launcher thread), ``gyre.real.runtime.tables`` (the table check), ``gyre.real.engines`` (the engine command line) and
``gyre.real.train`` (the cell entry point); Ray only lazily.
"""
