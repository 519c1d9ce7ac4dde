"""The trajectory processor (docs/trajectories.md): pure data plane, no I/O, no torch.

From a recorded model call to a training micro-step:

- ``records``: TITO records (``ModelCall``) and per-token ``Provenance``;
- ``tool_calls``: tool-call payload cache restoring raw blocks by call id;
- ``tree`` / ``tree_stats``: one radix trajectory tree per execution;
- ``harness_roles``: role classes per harness (Claude Code, Codex, generic);
- ``evaluation`` / ``groups``: evaluation state, trajectory buffer by group,
  group-relative advantages;
- ``admission``: bounded admission by role priority (J_max, seeded);
- ``rows`` / ``packing``: materialization into token rows, stream packing
  into micro-steps;
- ``synthetic``: a seeded synthetic execution shaped like docs/trajectories.md#trajectory-trees;

No module here touches a file, a thread or a socket (tests/core/
test_import_contracts.py checks it). Where records are kept on disk, and the
micro-step queues, live in ``gyre.real.store``; the prefix-graph drawing in
``gyre.analysis.prefix_graph``; the loss in ``gyre.real.train.loss`` (torch).
May import: the rest of ``gyre``'s pure modules only.
"""
