"""The real backend: the unchanged policy core over real components (imports as ``gyre.real``).

Rooms (each a package whose docstring says what it does and may import):

- ``runtime``: the controller (the shared ``gyre.loop`` over wall-clock
  reports), the backend that applies the core's actions to real parts, the
  job file and ``gyre run``, real runs written as traces;
- ``proxy``: the black-box proxy harnesses call (Anthropic Messages, OpenAI
  Chat and Responses), TITO recording, routing, reroutes and failover;
- ``engines``: the SGLang engine manager (launch, health, quiesce, memory,
  weight updates);
- ``harness``: the harness runner (one process and one loopback-only
  network namespace per execution), adapters, the scripted harness, the
  evaluator interface and evaluation with retries;
- ``train``: Megatron training cells, prefix groups, Mooncake joins, the
  core's optimizer, publication, the loss, CPU adaptations;
- ``store``: what lives on disk: the durable TITO log per execution, the
  micro-step queue on a directory, ``gyre traj``;
- ``toy``: the tiny model and tokenizer, seeded toy micro-steps and the toy
  tasks the CPU demo and the tests use.

Arrows: ``gyre.real`` imports ``gyre`` (core, formats, trajectory) and
``gyre.analysis`` (a run draws its pictures); never ``gyre.sim``. Heavy
stacks (torch, Megatron, SGLang, Mooncake, aiohttp, transformers) are
imported only inside this package, and importing a package here stays light:
modules load their heavy dependencies themselves.
"""
