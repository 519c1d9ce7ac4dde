"""One real run: the controller, the backend applying the core's actions, the job, ``gyre run``.

- ``controller``: the shared ``gyre.loop.DriverLoop`` fed by reports from real
  components, stamped with a wall clock; writes the replayable event log;
- ``backend``: ``RealBackend``, the real world's ``ActionHandler`` (its
  module docstring holds the table action -> real effect -> event reported);
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
