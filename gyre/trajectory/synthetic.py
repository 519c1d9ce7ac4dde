"""A synthetic Claude Code execution shaped like the example of docs/trajectories.md#trajectory-trees.

Default shape: 636 requests, about 1M unique tokens, 10 leaves. The main agent
compacts once (after 168 turns) and continues for 120 turns; sub-agent 1 runs
193 turns, compacts, and runs 60 more; sub-agents 2 and 3 run interleaved
(round-robin) for 50 and 39 turns; two requests are retried (same input, new
output; the first output is discarded by the harness). Main and sub-agents
have different system prompts, hence separate roots; sub-agents share theirs.

A compaction point produces two requests that share the whole context: the
turn the harness sent before deciding to compact (its output is dropped, a
leaf of the agent's role) and the summary request (context + compaction
instruction, a ``*-summary`` leaf); the agent then restarts from its system
prompt and the summary.

Token ids are uniform random; tool results have log-normal lengths; output
log-probabilities are ``-Exponential(0.5)``. Request inputs are read-only
views into one growing buffer per conversation, so the records cost no more
memory than the conversations themselves. Everything random comes from the
generator passed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from gyre.trajectory.records import ModelCall

MAIN_SYSTEM = ("You are Claude Code, Anthropic's official CLI for Claude. "
               "You are an interactive CLI tool that helps users with software engineering tasks.")
SUBAGENT_SYSTEM = ("You are an agent for Claude Code, Anthropic's official CLI for Claude. "
                   "Given the user's message, you should use the tools available to complete the task.")
COMPACTION_REQUEST = "Your task is to create a detailed summary of the conversation so far, paying close attention..."


@dataclass(frozen=True, kw_only=True)
class ExecutionShape:
    execution_id: str = "synthetic-0"
    vocab: int = 151_000
    main_system_tokens: int = 12_000
    subagent_system_tokens: int = 3_000
    task_tokens: int = 1_500
    instruction_tokens: int = 600
    summary_tokens: int = 2_500
    output_tokens: tuple[int, int] = (40, 520)
    tool_result_mean: float = 1_150.0
    main_segments: tuple[int, ...] = (168, 120)
    subagent_segments: tuple[tuple[int, ...], ...] = ((193, 60), (50,), (39,))
    spawn_turns: tuple[int, ...] = (30, 100, 100)  # main turn at which each sub-agent runs
    retry_turns: tuple[tuple[str, int], ...] = (("main", 50), ("sub-1", 80))

    @property
    def requests(self) -> int:
        segments = [self.main_segments, *self.subagent_segments]
        return sum(sum(s) + 2 * (len(s) - 1) for s in segments) + len(self.retry_turns)


class _Conversation:
    def __init__(self, prefix: np.ndarray) -> None:
        self._buf = np.empty(max(4 * len(prefix), 1 << 16), dtype=np.int32)
        self._len = 0
        self.extend(prefix)

    def extend(self, tokens: np.ndarray) -> None:
        need = self._len + len(tokens)
        if need > len(self._buf):
            grown = np.empty(max(need, 2 * len(self._buf)), dtype=np.int32)
            grown[: self._len] = self._buf[: self._len]
            self._buf = grown  # earlier views keep the old buffer alive, unchanged
        self._buf[self._len : need] = tokens
        self._len = need

    def context(self) -> np.ndarray:
        view = self._buf[: self._len]
        view.setflags(write=False)
        return view


class _Generator:
    def __init__(self, rng: np.random.Generator, shape: ExecutionShape) -> None:
        self.rng = rng
        self.shape = shape
        self.count = 0
        self.systems = {"main": self.tokens(shape.main_system_tokens),
                        "sub-agent": self.tokens(shape.subagent_system_tokens)}

    def tokens(self, n: int) -> np.ndarray:
        return self.rng.integers(0, self.shape.vocab, size=n, dtype=np.int32)

    def tool_result(self) -> np.ndarray:
        sigma = 0.8
        mean_log = np.log(self.shape.tool_result_mean) - sigma**2 / 2
        return self.tokens(max(1, int(self.rng.lognormal(mean_log, sigma))))

    def call(self, context: np.ndarray, kind: str, *, summary: bool = False) -> ModelCall:
        low, high = self.shape.output_tokens
        n_out = self.shape.summary_tokens if summary else int(self.rng.integers(low, high + 1))
        system = MAIN_SYSTEM if kind == "main" else SUBAGENT_SYSTEM
        hints = {"system": system, **({"last_user": COMPACTION_REQUEST} if summary else {})}
        self.count += 1
        return ModelCall(execution_id=self.shape.execution_id, request_id=f"req-{self.count:05d}",
                         input_ids=context, output_ids=self.tokens(n_out),
                         output_logprobs=-self.rng.exponential(0.5, size=n_out), policy_version=0,
                         started_at=float(self.count), finished_at=float(self.count) + 0.5, role_hints=hints)

    def agent(self, name: str, kind: str, segments: tuple[int, ...],
              spawns: dict[int, list[Iterator[ModelCall]]]) -> Iterator[ModelCall]:
        retries = {turn for agent, turn in self.shape.retry_turns if agent == name}
        conv = _Conversation(np.concatenate([self.systems[kind], self.tokens(self.shape.task_tokens)]))
        turn = 0
        for index, turns in enumerate(segments):
            for _ in range(turns):
                yield from _round_robin(spawns.get(turn, []))
                if turn in retries:
                    yield self.call(conv.context(), kind)  # output discarded by the harness
                record = self.call(conv.context(), kind)
                yield record
                conv.extend(record.output_ids)
                conv.extend(self.tool_result())
                turn += 1
            if index < len(segments) - 1:
                yield self.call(conv.context(), kind)  # sent before compaction was decided
                conv.extend(self.tokens(self.shape.instruction_tokens))
                summary = self.call(conv.context(), kind, summary=True)
                yield summary
                conv = _Conversation(np.concatenate([self.systems[kind], summary.output_ids]))


def _round_robin(iterators: list[Iterator[ModelCall]]) -> Iterator[ModelCall]:
    active = list(iterators)
    while active:
        for it in list(active):
            try:
                yield next(it)
            except StopIteration:
                active.remove(it)


def synthetic_execution(rng: np.random.Generator, shape: ExecutionShape = ExecutionShape()) -> list[ModelCall]:
    """The records of one synthetic execution, in arrival order."""
    gen = _Generator(rng, shape)
    spawns: dict[int, list[Iterator[ModelCall]]] = {}
    for i, (segments, turn) in enumerate(zip(shape.subagent_segments, shape.spawn_turns), start=1):
        spawns.setdefault(turn, []).append(gen.agent(f"sub-{i}", "sub-agent", segments, {}))
    return list(gen.agent("main", "main", shape.main_segments, spawns))
