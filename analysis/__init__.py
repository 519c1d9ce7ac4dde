"""Tables and checks computed from simulator outputs (imports as ``gyre.analysis``).

- ``runs``: ``load_run(DIR)`` for any ``gyre sim --out`` folder, ``run_from_result``
  for an in-memory result; a ``Run`` holds the tables as DataFrames.
- ``timing``: per-step durations, cumulative speedup of one run over another.
- ``utilization``: role shares per cell, rollout/training overlap (slack),
  transition counts and costs.
- ``staleness``: group and token-weighted statistics, percentiles, the
  steady-state window.
- ``timeline``: bursts, publications, satellites joining, rollout load.
- ``dispatch``: closed forms for boundary and continuous dispatch and a
  group-level queue model of both.
- ``theorem`` / ``theorem_report`` / ``theorem_cli``: ``gyre theorem``, the numerical
  check of Theorem A.1.
- ``plotting``: the figures' shared look (``gyre figs`` lives in ``gyre.paper_figs.cli``);
- ``prefix_graph``: drawing a trajectory tree's prefix graph (``gyre traj show``,
  figure 7);
- ``real_run``: the picture of one real run (``gyre run``).

May import: ``gyre`` and ``gyre.sim`` (the theorem check runs simulations);
never ``gyre.real``.
"""
