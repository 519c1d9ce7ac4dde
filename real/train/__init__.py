"""Training cells: Megatron models, prefix groups, Mooncake joins, one optimizer (docs/streaming.md#joining-a-step).

- ``plane``: the driver side: control store, K cell processes, supervision,
  commands; ``cell``: one cell process serving those commands;
- ``context``: the plane's configuration and each process's context;
- ``ranks``: the ranks of a cell (tensor parallel): the leader hands every
  tensor operation to the other ranks, each works on its own shard;
- ``core`` / ``satellite``: the core cell's step (expose, train with whoever
  joins, reduce, one update) and a satellite's (join, pull, claim, reduce);
- ``membership``: control store, prefix groups, join seats, done marks;
- ``state`` / ``model`` / ``loss``: a cell's model, flat weights, gradients and
  optimizer; the Megatron GPT; the execution-level objective of docs/trajectories.md#execution-level-loss;
- ``transport``: moving the core's weight snapshot to a satellite (Mooncake);
- ``bridge``: Hugging Face checkpoints in (a model config naming a folder) and
  out (publication), through mbridge;
- ``publish``: publishing new weights to SGLang engines;
- ``cpu_compat``: the one place that adapts Megatron and Mooncake to a CPU.

May import: ``gyre`` (trajectory packing and rows) and ``gyre.real.store``.
"""
