"""Toy parts, all in one place: what the CPU demo and the tests train and score.

- ``tiny_model``: a tiny Qwen-style model and a tokenizer trained locally
  (nothing is downloaded);
- ``microsteps``: seeded toy micro-steps for the training plane's tests and
  benchmark;
- ``tasks``: toy tasks with computable rewards (``EmitCharTask``,
  ``EmitTokenTask``).

May import: ``gyre`` and ``gyre.real.harness`` (the task interface).
"""
