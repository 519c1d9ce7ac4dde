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
- ``plotting`` / ``figs_cli``: the figures' shared look and ``gyre figs``.
"""
