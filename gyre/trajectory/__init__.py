"""The trajectory processor (SPEC.md section 4): pure logic, no torch, no network.

From a recorded model call to a training micro-step:

- ``records``: TITO records (``ModelCall``) and per-token ``Provenance``;
- ``storage``: durable append-only record logs, one per execution;
- ``tool_calls``: tool-call payload cache restoring raw blocks by call id;
- ``tree`` / ``tree_stats``: one radix trajectory tree per execution;
- ``roles``: role classes per harness (Claude Code, Codex, generic);
- ``evaluation`` / ``groups``: evaluation state, trajectory buffer by group,
  group-relative advantages;
- ``admission``: bounded admission by role priority (J_max, seeded);
- ``rows`` / ``packing`` / ``microstep_queue``: materialization into token rows,
  stream packing into micro-steps, queues with atomic claims;
- ``synthetic``: a seeded synthetic execution shaped like SPEC.md 4.2;
- ``prefix_graph`` / ``cli``: ``gyre traj stats`` and ``gyre traj show``.

The loss lives in ``gyre.real.loss`` because it needs torch.
"""
