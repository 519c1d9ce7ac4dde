"""A built-in scripted multi-call harness: a real HTTP client shaped like an agent.

Run as ``python -m gyre.real.harness.scripted --base-url URL --calls N``
with ``OPENAI_API_KEY`` set to the execution's proxy key, in the execution's
working directory. It speaks OpenAI Chat Completions (non-streaming) with
only the standard library, so it starts in milliseconds, and reproduces the
shapes that matter to Gyre's trajectory trees:
- a main agent whose history grows call by call (tool results appended);
- compaction every ``--compact-every`` calls: a summary request, then a fresh
  context of system prompt + task + summary;
- sub-agents on their own system prompt and context (separate tree roots);
- request-level retries with backoff on 429/5xx/connection errors (the
  harness never sees a transient error; retries touch no counter);
- after every main call it rewrites ``answer.txt`` with the text so far, so
  an execution killed by its timeout still leaves evaluable work;
- one tool, an exact string replacement: every block
  ``<<<EDIT path`` / old text / ``===`` / new text / ``>>>`` in a main call's
  reply replaces the one occurrence of the old text in that workspace file
  (the tool output, the next user turn, says ``applied`` or why not: a path
  outside the workspace, a missing file, old text absent or not unique).
  The model's reply is the only source of edits: this is how the scripted
  harness repairs code (the repair tasks' CPU tests script the engine's reply).

Exit status: 0 when all calls were made, 3 when the retry budget of one call
ran out (the runner reports the execution as failed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

MAIN_SYSTEM = "You are the main coding agent. Work in the current directory."
SUB_SYSTEM = "You are a sub-agent. Answer the delegated question briefly."
SUMMARY_REQUEST = "Summarize the conversation so far for a fresh context."


EDIT_BLOCK = re.compile(r"<<<EDIT ([^\n]+)\n(.*?)\n===\n(.*?)\n?>>>", re.DOTALL)


class RetryBudgetExhausted(RuntimeError):
    pass


def apply_edits(text: str, root: Path) -> list[str]:
    """Apply every edit block of ``text`` under ``root``; one report line per block."""
    reports = []
    base = root.resolve()
    for path, old, new in EDIT_BLOCK.findall(text):
        target = (root / path.strip()).resolve()
        if base not in target.parents:
            reports.append(f"edit {path.strip()}: refused, outside the workspace")
        elif not target.is_file():
            reports.append(f"edit {path.strip()}: no such file")
        else:
            content = target.read_text()
            count = content.count(old + "\n") if old else 0
            if count != 1:
                reports.append(f"edit {path.strip()}: old text found {count} times, need exactly 1")
            else:
                target.write_text(content.replace(old + "\n", new + "\n" if new else "", 1))
                reports.append(f"edit {path.strip()}: applied")
    return reports


def chat(base_url: str, key: str, messages: list[dict], retries: int, model: str) -> str:
    """One model call with request-level retries; returns the assistant text."""
    body = json.dumps({"model": model, "messages": messages, "stream": False}).encode()
    delay = 0.05
    for attempt in range(retries + 1):
        request = urllib.request.Request(f"{base_url.rstrip('/')}/v1/chat/completions", data=body, method="POST",
                                         headers={"Content-Type": "application/json",
                                                  "Authorization": f"Bearer {key}"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                payload = json.loads(response.read())
            return payload["choices"][0]["message"].get("content") or ""
        except urllib.error.HTTPError as exc:
            if exc.code not in (429, 500, 502, 503, 504, 529) or attempt == retries:
                raise RetryBudgetExhausted(f"call failed with HTTP {exc.code}") from exc
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            if attempt == retries:
                raise RetryBudgetExhausted(f"call failed: {exc}") from exc
        time.sleep(delay)
        delay = min(delay * 2, 1.0)
    raise AssertionError("unreachable")


def run(args: argparse.Namespace, key: str) -> int:
    task = Path(args.task_file).read_text() if args.task_file else "Write the answer."
    fresh = [{"role": "system", "content": MAIN_SYSTEM}, {"role": "user", "content": task}]
    history = list(fresh)
    answer: list[str] = []
    ask = lambda messages: chat(args.base_url, key, messages, args.retries, args.model)  # noqa: E731
    for call in range(1, args.calls + 1):
        if call in args.subagent_at:
            sub = [{"role": "system", "content": SUB_SYSTEM}, {"role": "user", "content": f"Sub-task {call}"}]
            sub.append({"role": "assistant", "content": ask(sub)})
            sub.append({"role": "user", "content": "Anything else?"})
            history.append({"role": "user", "content": "Sub-agent reported: " + ask(sub)})
        text = ask(history)
        answer.append(text)
        Path("answer.txt").write_text(" ".join(answer))
        reports = apply_edits(text, Path.cwd())
        output = "; ".join(reports) if reports else "ok"
        history += [{"role": "assistant", "content": text},
                    {"role": "user", "content": f"Tool output {call}: {output}"}]
        if args.compact_every and call % args.compact_every == 0 and call < args.calls:
            summary = ask(history + [{"role": "user", "content": SUMMARY_REQUEST}])
            history = fresh + [{"role": "assistant", "content": summary}]
        if args.sleep:
            time.sleep(args.sleep)
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gyre-scripted-harness")
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", default="gyre")
    p.add_argument("--calls", type=int, default=6)
    p.add_argument("--compact-every", type=int, default=0)
    p.add_argument("--subagent-at", type=int, nargs="*", default=[])
    p.add_argument("--retries", type=int, default=5)
    p.add_argument("--sleep", type=float, default=0.0, help="seconds of 'tool work' after each call")
    p.add_argument("--task-file")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    key = os.environ.get("OPENAI_API_KEY")
    if not key:
        print("scripted harness: OPENAI_API_KEY is not set", file=sys.stderr)
        return 2
    try:
        return run(args, key)
    except RetryBudgetExhausted as exc:
        print(f"scripted harness: {exc}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
