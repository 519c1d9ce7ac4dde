"""Toy parts, all in one place: what the CPU demo and the tests train and score.

- ``tiny_model``: a tiny Qwen-style model and a tokenizer trained locally
  (nothing is downloaded);
- ``microsteps``: seeded toy micro-steps for the training plane's tests and
  benchmark;
- ``tasks``: toy tasks with computable rewards (``EmitCharTask``,
  ``EmitTokenTask``);
- ``learning_replica``: the CPU demo's learning loop replayed offline, seed
  by seed, to measure how often its toy reward rises in a number of steps.

May import: ``gyre`` (``gyre.analysis`` included) and ``gyre.real.harness``
(the task interface, the scripted harness's prompt); ``learning_replica``
also the loss (``gyre.real.train.loss``).
"""
