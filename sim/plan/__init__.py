"""``gyre plan``: find the schedule for a workload and a cluster before booking it (imports as ``gyre.sim.plan``).

- ``space``: the cluster, the schedule space searched, a point -> a schedule (or refused);
- ``evaluate``: one schedule on several trace seeds through a mapper, its mean and spread;
  Async and Colocate at a staleness target;
- ``study``: the Optuna multi-objective study in SQLite (resumable, extendable);
- ``report``: Pareto front, recommendation, the ``gyre run`` job file;
- ``plan``: ``run_plan``, which searches and writes the plan's files.

Built on the simulator's public API (``gyre.sim.runner.run_simulation``).
May import: ``gyre`` and ``gyre.sim``; ``optuna`` only inside ``study`` (the
``plan`` extra). Never ``gyre.real`` nor ``gyre.analysis`` (``gyre plan``'s
command line and its plot live in ``gyre.analysis.plan``).
"""
