"""One real run: the controller, the backend applying the core's actions, the job, ``gyre run``.

- ``controller``: the shared ``gyre.loop.DriverLoop`` fed by reports from real
  components, stamped with a wall clock; writes the replayable event log;
- ``backend``: ``RealBackend``, the real world's ``ActionHandler``, a thin
  handler (its module docstring holds the table action -> part -> event
  reported) over its parts, each owning its state with ``snapshot()`` /
  ``restore()``: ``proxy_admin`` (the proxy's admin API, off the loop),
  ``executions`` (tasks, harnesses, evaluation), ``cell_switches`` (role
  transitions), ``batch_feed`` (steps, packing, the streaming ask) and
  ``publisher`` (publications); ``backend_context`` is what they share;
- ``restore``: resume checkpoints, and a resumed run's parts set from its plan;
- ``job``: a whole run from one TOML file (``JobConfig``, ``run_job``);
- ``cli``: ``gyre run --config FILE``;
- ``metrics``: one record per step, written live to ``metrics.jsonl`` and
  TensorBoard; ``progress``: the progress bar (or plain lines) ``gyre run`` shows;
- ``trace``: a real run's executions written as a rollout trace
  (``gyre.formats.trace``) the simulator replays;
- ``tables``: a job file's sub-tables (``[cluster]``, ``[job.layout]``) as
  checked dataclasses, unknown and missing keys named.

May import: ``gyre`` (core, formats, trajectory), the other rooms of
``gyre.real``, ``gyre.analysis`` for the run's picture.
"""
