"""Role classes per harness (roles.py)."""

from __future__ import annotations

import numpy as np
import pytest

from gyre.trajectory.harness_roles import (AUXILIARY, MAIN, MAIN_SUMMARY, SUB_AGENT, SUB_AGENT_SUMMARY, ClaudeCodeRoles,
                                   CodexRoles, GenericRoles, leaf_roles, roles_for)
from gyre.trajectory.synthetic import synthetic_execution, ExecutionShape
from gyre.trajectory.tree import TrajectoryTree

MAIN_SYS = "You are Claude Code, Anthropic's official CLI for Claude.\nYou are an interactive CLI tool that helps users"
SUB_SYS = "You are Claude Code, Anthropic's official CLI for Claude.\nYou are an agent for Claude Code, ..."
COMPACT = "Your task is to create a detailed summary of the conversation so far, paying close attention"
SUMMARISER = "You are a helpful AI assistant tasked with summarizing conversations."


@pytest.mark.parametrize("path, role", [
    ([{"system": MAIN_SYS}], MAIN),
    ([{"system": SUB_SYS}], SUB_AGENT),
    ([{"system": "You are a meticulous code reviewer."}], SUB_AGENT),  # custom sub-agent
    ([{"system": MAIN_SYS}, {"system": MAIN_SYS, "last_user": COMPACT}], MAIN_SUMMARY),
    ([{"system": SUB_SYS}, {"system": SUB_SYS, "last_user": COMPACT}], SUB_AGENT_SUMMARY),
    ([{"system": SUB_SYS}, {"system": SUMMARISER}], SUB_AGENT_SUMMARY),  # agent taken from the path
    ([{"system": SUMMARISER}], MAIN_SUMMARY),
    ([{"system": MAIN_SYS, "last_user": "Please write a 5-10 word title for this"}], AUXILIARY),
    ([{"system": MAIN_SYS, "role": SUB_AGENT}], SUB_AGENT),  # explicit hint wins
])
def test_claude_code_heuristics(path, role):
    assert ClaudeCodeRoles().leaf_role(path) == role


@pytest.mark.parametrize("hints, role", [
    ({}, MAIN),
    ({"last_user": "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff"}, MAIN_SUMMARY),
    ({"x-openai-subagent": "compact"}, MAIN_SUMMARY),
    ({"x-openai-subagent": "review"}, SUB_AGENT),
    ({"x-codex-parent-thread-id": "t1"}, SUB_AGENT),
    ({"x-codex-parent-thread-id": "t1", "x-openai-subagent": "compact"}, SUB_AGENT_SUMMARY),
    ({"x-openai-subagent": "memory_consolidation"}, AUXILIARY),
])
def test_codex_heuristics(hints, role):
    assert CodexRoles().leaf_role([hints]) == role


def test_generic_fallback_trusts_explicit_hints_only():
    roles = GenericRoles()
    assert roles.leaf_role([{"system": SUB_SYS}]) == MAIN
    assert roles.leaf_role([{"agent": "sub-agent"}, {"summary": "true"}]) == SUB_AGENT_SUMMARY
    assert roles.leaf_role([{"role": MAIN_SUMMARY}]) == MAIN_SUMMARY


def test_priority_and_registry():
    assert ClaudeCodeRoles().priority == (MAIN, MAIN_SUMMARY, SUB_AGENT, SUB_AGENT_SUMMARY)
    assert roles_for("codex").name == "codex"
    with pytest.raises(ValueError, match="unknown harness 'aider'"):
        roles_for("aider")
    with pytest.raises(ValueError, match="at least its own request"):
        GenericRoles().leaf_role([])


def test_leaf_roles_of_the_synthetic_execution():
    shape = ExecutionShape(main_segments=(20, 10), subagent_segments=((15, 5), (6,)), spawn_turns=(3, 8),
                           retry_turns=(("main", 4),), main_system_tokens=200, subagent_system_tokens=100)
    tree = TrajectoryTree.from_records(synthetic_execution(np.random.default_rng(0), shape))
    counts = {}
    for role in leaf_roles(tree, ClaudeCodeRoles()).values():
        counts[role] = counts.get(role, 0) + 1
    # main: pre-compaction turn, post-compaction end, retry; sub-1: pre turn + end; sub-2: end
    assert counts == {MAIN: 3, MAIN_SUMMARY: 1, SUB_AGENT: 3, SUB_AGENT_SUMMARY: 1}
