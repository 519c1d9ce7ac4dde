"""Interchange formats between the two worlds: event logs and rollout traces.

The simulator and the real backend both write and read these, so they live in
``gyre`` (what both need lives here). This package is the only part of
``gyre`` that touches files: it reads and writes plain tables (CSV, Parquet,
JSON) and nothing else. It imports only ``gyre``'s pure modules, numpy and
pandas; never ``gyre.sim``, ``gyre.real`` or ``gyre.analysis``.

- ``tables``: the one CSV writer (fixed float formatting, equal runs give
  equal bytes);
- ``eventlog``: the event-log schema, derived from ``gyre.events``, the log a
  driver loop records, and replay through a fresh core;
- ``journal``: the durable event journal a real run appends as it goes
  (``events.jsonl``, readable after a kill -9, torn tail named);
- ``trace``: rollout-duration traces, the table a real run writes and the
  simulator reads.
"""
