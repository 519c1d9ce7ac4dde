"""The per-node supervisor: the processes of a run that outlive its driver (``gyre run``).

- ``ledger``: the durable record of every process the supervisor started and how it ended;
- ``daemon``: the supervisor process itself (``python -m gyre.real.supervisor``): spawns, waits for and
  stops the processes it owns, holds the driver's lease, stops everything when it expires;
- ``client``: what the driver uses: start or reuse the folder's supervisor, renew its lease, spawn,
  attach to and kill processes, ``gyre stop RUN_DIR`` (``cli``);
- ``services``: the proxy and the harnesses' sandbox bridge (``bridge``) run under it, adopted by a
  resumed driver;
- ``engines``: the engine manager's launcher that runs the SGLang engines under it, adopted by a
  resumed driver's manager.

May import: ``gyre`` and the other rooms of ``gyre.real`` (the daemon itself only stdlib and
``runtime.lifetime``: it starts fast and stays light).
Design and the rule of what survives a driver crash: docs/real-backend.md#supervisor.
"""
