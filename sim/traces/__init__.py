"""Rollout-duration traces for the simulator: presets, statistics, ``gyre trace``.

- ``presets``: synthetic traces from named presets calibrated to SPEC.md 5;
- ``stats``: achieved statistics of a trace beside its targets, and the fit;
- ``cli``: ``gyre trace gen|stats|presets``.

The table format shared with the real backend is ``gyre.formats.trace``.
May import: ``gyre`` only.
"""
