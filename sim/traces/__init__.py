"""Rollout-duration traces for the simulator: presets, statistics, ``gyre trace``.

- ``model``: the duration model (per-query difficulty, hard queries whose
  executions time out together, ceiling and budget) and its random draws;
- ``presets``: the preset type, registry and ``generate_trace``;
- ``catalogue``: the four calibrated presets (docs/workload.md), with the
  source of every target (the paper's, or ours);
- ``stats``: achieved statistics of a trace beside its targets;
- ``fit``: re-deriving a preset's fitted parameters;
- ``cli``: ``gyre trace gen|stats|presets``.

The table format shared with the real backend is ``gyre.formats.trace``.
May import: ``gyre`` only.
"""
