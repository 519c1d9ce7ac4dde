"""Harness executions: processes, sandboxes, budgets and evaluation (docs/trajectories.md).

- ``runner``: ``HarnessRunner``, one OS process per execution with harness and
  overall budgets, and the adapters for Claude Code, Codex, mini-swe-agent
  and the scripted harness;
- ``sandbox``: one loopback-only network namespace per harness, bridged to
  the proxy;
- ``scripted``: a built-in multi-call harness (a real HTTP client);
- ``tasks``: the evaluator interface and the preserved artifact binding;
- ``evaluation``: close a finished execution and score it with retries
  within its budget;
- ``plugins``: the job's harness and evaluator, by built-in name or ``"module:Class"``;
- ``taskset``: JSONL task sets, their evaluator and each execution's starting workspace;
- ``workspace_setup``: builds a task's workspace in the execution's process, then execs the harness;
- ``repair``: the repair task family's evaluator (reward: share of the repository's tests that pass);
- ``repair_runner``: runs a repository's unittest files in a scratch copy, recording each outcome;
- ``repair_repos``: the repair family's tiny repositories, planted bugs and the tests each bug breaks.

May import: ``gyre`` (trajectory evaluation and groups). Never the proxy,
engines or training cells: a harness reaches the model through the proxy URL.
"""
