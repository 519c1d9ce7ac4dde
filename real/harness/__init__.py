"""Harness executions: processes, sandboxes, budgets and evaluation (SPEC.md 4.1, 4.3).

- ``runner``: ``HarnessRunner``, one OS process per execution with harness and
  overall budgets, and the adapters for Claude Code, Codex, mini-swe-agent
  and the scripted harness;
- ``sandbox``: one loopback-only network namespace per harness, bridged to
  the proxy;
- ``scripted``: a built-in multi-call harness (a real HTTP client);
- ``tasks``: the evaluator interface and the preserved artifact binding;
- ``evaluation``: close a finished execution and score it with retries
  within its budget.

May import: ``gyre`` (trajectory evaluation and groups). Never the proxy,
engines or training cells: a harness reaches the model through the proxy URL.
"""
