"""A toy black-box harness and tokenizer for property tests.

It speaks Anthropic-like messages, keeps its own history, and *reformats* tool
calls when it sends the history back (the model's raw argument text is parsed
and re-dumped canonically), like real harnesses do. The proxy side restores
cached raw tool-call blocks (``ToolCallCache``) before serializing. Agents:
the main agent and sub-agents with a different system prompt (separate
roots); actions: step, retry (output dropped), compaction (restart from the
summary), evaluator critique (EVALUATOR tokens), harness-injected assistant
text (EXTERNAL), interleaved freely by the caller.

Serialization: a system message is its text then END (no header, so agents
with different system prompts differ from the first token); other messages
are ROLE token, body, END. The generation prompt is the ASSISTANT token and
the model's output tokens are body + END, so a faithfully re-sent assistant
message reproduces exactly the tokens the model produced.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gyre.trajectory.records import ModelCall, Provenance
from gyre.trajectory.tool_calls import ToolCallCache

USER, ASSISTANT, END, TOOL_USE, TOOL_RESULT = range(1_000_000, 1_000_005)
MAIN_SYSTEM = "Main. You are Claude Code, Anthropic's official CLI for Claude."
SUB_SYSTEM = "Sub. You are an agent for Claude Code, Anthropic's official CLI for Claude."
COMPACT = "Your task is to create a detailed summary of the conversation so far."
WORDS = ("read", "the", "file", "then", "fix", "tests", "ok", "done", "build", "spec", "a", "b")


def _chars(text: str) -> list[int]:
    return [ord(c) for c in text]


def _block_tokens(block: dict[str, Any]) -> list[int]:
    kind = block["type"]
    if kind == "text":
        return _chars(block["text"])
    if kind == "tool_use":
        raw = block.get("raw", json.dumps(block["input"], sort_keys=True))
        return [TOOL_USE, *_chars(block["name"]), *_chars(raw)]
    if kind == "tool_result":
        return [TOOL_RESULT, *_chars(block["content"])]
    raise ValueError(f"unknown block type {kind}")


def body_tokens(message: dict[str, Any]) -> list[int]:
    content = message["content"]
    if isinstance(content, str):
        return _chars(content)
    return [t for block in content for t in _block_tokens(block)]


def serialize(messages: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """Token ids and provenance of a message list, plus the generation prompt."""
    tokens: list[int] = []
    prov: list[int] = []
    for message in messages:
        header = [] if message["role"] == "system" else [USER if message["role"] == "user" else ASSISTANT]
        chunk = header + body_tokens(message) + [END]
        kind = Provenance.EVALUATOR if message.get("evaluator") else Provenance.EXTERNAL
        tokens += chunk
        prov += [int(kind)] * len(chunk)
    return tokens + [ASSISTANT], prov + [int(Provenance.EXTERNAL)]


def _words(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def model_output(rng: random.Random, counter: list[int], *, summary: bool) -> dict[str, Any]:
    """The toy model's assistant message; tool calls carry their raw argument text."""
    blocks: list[dict[str, Any]] = [{"type": "text", "text": _words(rng, 1, 5)}]
    for _ in range(0 if summary else rng.randint(0, 2)):
        counter[0] += 1
        args = {"path": rng.choice(WORDS), "n": rng.randint(0, 9)}
        items = list(args.items())
        rng.shuffle(items)
        separator = rng.choice([",", ", ", " , "])
        raw = "{" + separator.join(f'"{k}":{rng.choice(["", " "])}{json.dumps(v)}' for k, v in items) + "}"
        blocks.append({"type": "tool_use", "id": f"toolu_{counter[0]}", "name": rng.choice(["Read", "Bash"]),
                       "input": args, "raw": raw})
    return {"role": "assistant", "content": blocks}


def harness_copy(message: dict[str, Any]) -> dict[str, Any]:
    """What the harness keeps of a model output: parsed tool calls, raw text dropped."""
    return {"role": "assistant", "content": [{k: v for k, v in b.items() if k != "raw"} for b in message["content"]]}


@dataclass
class Agent:
    kind: str
    system: str
    history: list[dict[str, Any]] = field(default_factory=list)


class ToyHarness:
    """Drives agents of one execution and records their model calls."""

    def __init__(self, execution_id: str = "exec-1", *, restore: bool = True) -> None:
        self.execution_id = execution_id
        self.restore = restore
        self.cache = ToolCallCache()
        self.agents: list[Agent] = []
        self.calls = 0
        self._tool_ids = [0]

    def start_agent(self, kind: str, rng: random.Random) -> int:
        system = MAIN_SYSTEM if kind == "main" else SUB_SYSTEM
        history = [{"role": "system", "content": system}, {"role": "user", "content": "task: " + _words(rng, 1, 4)}]
        self.agents.append(Agent(kind, system, history))
        return len(self.agents) - 1

    def _call(self, agent: Agent, messages: list[dict[str, Any]], rng: random.Random, *,
              summary: bool = False) -> tuple[ModelCall, dict[str, Any]]:
        sent = self.cache.restore(messages).messages if self.restore else messages
        tokens, prov = serialize(sent)
        output = model_output(rng, self._tool_ids, summary=summary)
        out_tokens = body_tokens(output) + [END]
        self.cache.remember(output)
        self.calls += 1
        last_user = next((m["content"] for m in reversed(sent)
                          if m["role"] == "user" and isinstance(m["content"], str)), "")
        call = ModelCall(
            execution_id=self.execution_id, request_id=f"r{self.calls}", input_ids=np.array(tokens),
            output_ids=np.array(out_tokens), output_logprobs=-np.array([rng.expovariate(2.0) for _ in out_tokens]),
            policy_version=0, input_provenance=np.array(prov) if any(prov) else None,
            role_hints={"system": agent.system, "last_user": last_user},
        )
        return call, output

    def step(self, index: int, rng: random.Random) -> ModelCall:
        agent = self.agents[index]
        call, output = self._call(agent, agent.history, rng)
        agent.history.append(harness_copy(output))
        results = [{"type": "tool_result", "tool_use_id": b["id"], "content": _words(rng, 1, 6)}
                   for b in output["content"] if b["type"] == "tool_use"]
        agent.history.append({"role": "user", "content": results or "continue " + _words(rng, 0, 2)})
        return call

    def retry(self, index: int, rng: random.Random) -> ModelCall:
        """A request whose output the harness throws away (e.g. malformed)."""
        agent = self.agents[index]
        return self._call(agent, agent.history, rng)[0]

    def compact(self, index: int, rng: random.Random) -> ModelCall:
        agent = self.agents[index]
        call, output = self._call(agent, agent.history + [{"role": "user", "content": COMPACT}], rng, summary=True)
        summary = output["content"][0]["text"]
        agent.history = [agent.history[0], {"role": "user", "content": "summary: " + summary}]
        return call

    def critique(self, index: int, rng: random.Random) -> None:
        self.agents[index].history.append({"role": "user", "content": "critique: " + _words(rng, 1, 4),
                                           "evaluator": True})

    def inject_assistant_text(self, index: int, rng: random.Random) -> None:
        self.agents[index].history.append({"role": "assistant", "content": "noted " + _words(rng, 0, 2)})
        self.agents[index].history.append({"role": "user", "content": "go on"})
