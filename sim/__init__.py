"""The discrete-event simulator: the unchanged policy core on SimPy time (imports as ``gyre.sim``).

- ``driver``: ``Simulation``, the simulator's ``ActionHandler`` on the shared
  ``gyre.loop.DriverLoop``; executions carry their trace durations as work;
- ``engines``: processor-sharing rollout engines (rate falls with load; trace
  durations hold at the reference load), calibrated on SGLang's CPU engine;
- ``training``: the simulated training plane (micro-steps claimed by cells);
- ``costs``: every cost constant, each with the source of its default;
- ``sizes``: times from sizes: training work from trained tokens and FLOPs,
  publication from parameter bytes and the publishing pool, sandbox start-up;
- ``record``: what a run records and the tables it writes;
- ``runner`` / ``grids`` / ``report`` / ``progress`` / ``cli``: one run, the
  ablation and methods grids, text tables, ``gyre sim``;
- ``traces/``: calibrated synthetic trace presets, trace statistics and fits,
  ``gyre trace`` (the trace format itself is ``gyre.formats.trace``).

May import: ``gyre`` only (core, formats, trajectory). Never ``gyre.real``
(what both worlds need lives in ``gyre``) nor ``gyre.analysis``.
"""
