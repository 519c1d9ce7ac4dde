"""Role classes per harness, behind one interface (docs/trajectories.md#admission).

A harness's roles object says (a) the admission priority of its role classes,
highest first, and (b) the role of a leaf, from the ``role_hints`` the proxy
recorded for the requests on the leaf's path. Roles outside ``priority`` are
never admitted: that is the harness-specific mask (e.g. Claude Code's small
utility calls).

A leaf's role is decided by its *last* request: is it a summary (compaction)
request, and whose conversation does it continue? A summary request often
carries no agent identity of its own (its system prompt may be a generic
summariser), so the agent is taken from the leaf request if it says, else from
the nearest earlier request on the path that does, else ``main``.

Hint keys read (all optional, the proxy fills what it knows): ``role``
(explicit, wins when it names a known role), ``system`` (system prompt text or
its beginning), ``last_user`` (text of the last user message), and request
headers under their lower-case names (``x-openai-subagent``,
``x-codex-parent-thread-id``).

Claude Code heuristics (``ClaudeCodeRoles``):
- utility calls (title generation, topic detection, bash prefix checks) are
  ``auxiliary``: matched on ``auxiliary_markers`` in system or last user text;
- summary: the compaction instruction ("Your task is to create a detailed
  summary of the conversation so far") in the last user message, or the
  summariser system prompt;
- agent identity from the system prompt: sub-agent markers first (built-in
  sub-agent prompts may follow the same "You are Claude Code" identity line),
  then main markers; a non-empty system prompt with neither is a custom
  sub-agent (``.claude/agents/*.md``) when ``unknown_system_is_subagent``.
Codex (``CodexRoles``): the ``x-openai-subagent`` header (``compact`` marks a
compaction of the current agent, ``memory_consolidation`` is auxiliary, any
other value a sub-agent), a parent-thread header, or the compaction prompt
("You are performing a CONTEXT CHECKPOINT COMPACTION").
Generic (``GenericRoles``): explicit ``role``, ``agent`` and ``summary`` hints only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

Hints = Mapping[str, str]

MAIN = "main"
MAIN_SUMMARY = "main-summary"
SUB_AGENT = "sub-agent"
SUB_AGENT_SUMMARY = "sub-agent-summary"
AUXILIARY = "auxiliary"
AGENT_PRIORITY = (MAIN, MAIN_SUMMARY, SUB_AGENT, SUB_AGENT_SUMMARY)


@dataclass(frozen=True)
class RequestRole:
    """What one request says about itself; ``agent`` None when it does not say."""

    agent: str | None = None
    summary: bool = False
    auxiliary: bool = False


class HarnessRoles:
    """Base of every harness's roles: subclasses implement ``request_role``."""

    name = "abstract"
    priority: tuple[str, ...] = AGENT_PRIORITY

    def request_role(self, hints: Hints) -> RequestRole:
        raise NotImplementedError

    def leaf_role(self, path_hints: Sequence[Hints]) -> str:
        """Role of a leaf given the hints of the requests on its path, leaf last."""
        if not path_hints:
            raise ValueError("a leaf's path holds at least its own request")
        explicit = path_hints[-1].get("role")
        if explicit in self.priority or explicit == AUXILIARY:
            return explicit
        last = self.request_role(path_hints[-1])
        if last.auxiliary:
            return AUXILIARY
        agent = last.agent or self._agent_along_path(path_hints[:-1])
        return f"{agent}-summary" if last.summary else agent

    def _agent_along_path(self, earlier: Sequence[Hints]) -> str:
        for hints in reversed(earlier):
            role = self.request_role(hints)
            if role.agent is not None and not role.auxiliary:
                return role.agent
        return MAIN


def _contains_any(text: str, markers: Sequence[str]) -> bool:
    return any(marker in text for marker in markers)


@dataclass(frozen=True)
class ClaudeCodeRoles(HarnessRoles):
    name = "claude-code"
    subagent_markers: tuple[str, ...] = (
        "You are an agent for Claude Code",
        "specialist for Claude Code",
        "You are the Claude guide agent",
    )
    main_markers: tuple[str, ...] = (
        "You are an interactive CLI tool",
        "You are an interactive agent",
        "You are Claude Code",
    )
    summary_markers: tuple[str, ...] = ("Your task is to create a detailed summary of the conversation so far",)
    summarizer_system_markers: tuple[str, ...] = (
        "You are a helpful AI assistant tasked with summarizing conversations",
    )
    auxiliary_markers: tuple[str, ...] = (
        "Analyze if this message indicates a new conversation topic",
        "Your task is to process Bash commands",
        "write a 5-10 word title",
    )
    unknown_system_is_subagent: bool = True

    def request_role(self, hints: Hints) -> RequestRole:
        system = hints.get("system", "")
        last_user = hints.get("last_user", "")
        if any(_contains_any(text, self.auxiliary_markers) for text in (system, last_user)):
            return RequestRole(auxiliary=True)
        summarizer = _contains_any(system, self.summarizer_system_markers)
        summary = summarizer or _contains_any(last_user, self.summary_markers)
        return RequestRole(agent=None if summarizer else self._agent(system), summary=summary)

    def _agent(self, system: str) -> str | None:
        if _contains_any(system, self.subagent_markers):
            return SUB_AGENT
        if _contains_any(system, self.main_markers):
            return MAIN
        if system and self.unknown_system_is_subagent:
            return SUB_AGENT
        return None


@dataclass(frozen=True)
class CodexRoles(HarnessRoles):
    name = "codex"
    compaction_markers: tuple[str, ...] = ("You are performing a CONTEXT CHECKPOINT COMPACTION",)
    auxiliary_subagents: tuple[str, ...] = ("memory_consolidation",)

    def request_role(self, hints: Hints) -> RequestRole:
        subagent = hints.get("x-openai-subagent", "").strip().lower()
        if subagent in self.auxiliary_subagents:
            return RequestRole(auxiliary=True)
        summary = subagent == "compact" or _contains_any(hints.get("last_user", ""), self.compaction_markers)
        if subagent not in ("", "compact", "false", "0") or hints.get("x-codex-parent-thread-id"):
            return RequestRole(agent=SUB_AGENT, summary=summary)
        return RequestRole(agent=None if summary else MAIN, summary=summary)


@dataclass(frozen=True)
class GenericRoles(HarnessRoles):
    """Fallback for unknown harnesses: trusts explicit hints, else ``main``."""

    name = "generic"

    def request_role(self, hints: Hints) -> RequestRole:
        agent = hints.get("agent", "").strip().lower()
        summary = hints.get("summary", "").strip().lower() in ("1", "true", "yes")
        if agent in ("sub-agent", "subagent", "sub_agent"):
            return RequestRole(agent=SUB_AGENT, summary=summary)
        return RequestRole(agent=MAIN if agent == MAIN else None, summary=summary)


HARNESS_ROLES: dict[str, HarnessRoles] = {
    roles.name: roles for roles in (ClaudeCodeRoles(), CodexRoles(), GenericRoles())
}


def roles_for(harness: str) -> HarnessRoles:
    """The roles of a harness by name; ``generic`` is the fallback to ask for."""
    try:
        return HARNESS_ROLES[harness]
    except KeyError:
        raise ValueError(f"unknown harness {harness!r}; known: {sorted(HARNESS_ROLES)}") from None


def leaf_roles(tree, roles: HarnessRoles) -> dict[int, str]:
    """Role of every leaf of ``tree`` (a ``TrajectoryTree``)."""
    result = {}
    for leaf in tree.leaves():
        hints = [tree.request(r).role_hints for r in tree.requests_on_path(leaf)]
        result[leaf] = roles.leaf_role(hints)
    return result
