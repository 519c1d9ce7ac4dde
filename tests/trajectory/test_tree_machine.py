"""State-machine test of the trajectory tree and admission against a model.

Random harness histories (tests/trajectory/harness_model.py): a main agent and
sub-agents with separate roots, steps, retries, compactions, tool calls the
harness reformats (restored by the proxy's cache), evaluator critiques and
harness-injected assistant text, all interleaved. Then the tree is closed and
admission draws one trajectory per rule.

Model kept beside the machine: every request's exact token sequence and
incoming provenance, and a copy of every frozen target set.

Invariants (docs/trajectories.md):
- the tree reproduces every request's exact input (and output) ids;
- with tool calls restored, an agent's kept output lies on the path of its
  next request (no false branch); main agent and sub-agents never share a root;
- a position's provenance is the max over the requests covering it, so
  external and evaluator tokens are never trainable;
- the cost of each add stays within the end node's depth;
- no trainable token is a target twice; targets are SAMPLED tokens on their
  own path; frozen targets never change;
- each draw takes the highest-priority class with unmasked trainable tokens,
  and its targets are exactly the unmasked trainable tokens of its path;
- admission ends only at J_max or when nothing admissible is left.
"""

from __future__ import annotations

import random

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, precondition, rule
from hypothesis_budget import examples

from gyre.trajectory.admission import Admission
from gyre.trajectory.records import Provenance
from gyre.trajectory.harness_roles import ClaudeCodeRoles
from gyre.trajectory.tree import TrajectoryTree

from .harness_model import COMPACT, ToyHarness

SAMPLED = int(Provenance.SAMPLED)
seeds = st.integers(0, 2**32 - 1)


class TreeAndAdmission(RuleBasedStateMachine):
    agents = Bundle("agents")

    def __init__(self) -> None:
        super().__init__()
        self.harness = ToyHarness()
        self.tree = TrajectoryTree("exec-1")
        self.calls = []
        self.admission: Admission | None = None
        self.frozen: list[np.ndarray] = []
        self.agent_of: list[int] = []
        self.last_kept: dict[int, int] = {}

    # -- harness phase -----------------------------------------------------

    @initialize(target=agents, seed=seeds)
    def start_main(self, seed):
        return self.harness.start_agent("main", random.Random(seed))

    def _record(self, call, agent: int, *, keeps_output: bool) -> None:
        placement = self.tree.add(call)
        assert placement.visited_nodes <= len(self.tree.path(placement.end_node))
        assert placement.matched_tokens + placement.new_tokens == len(call.sequence)
        self.calls.append(call)
        self.agent_of.append(agent)
        previous = self.last_kept.pop(agent, None)
        if previous is not None:  # restored tool calls: the earlier output is reused, not re-branched
            assert self.tree.request_end(previous) in self.tree.path(placement.end_node)
        if keeps_output:
            self.last_kept[agent] = placement.request
        elif previous is not None and call.role_hints.get("last_user") != COMPACT:
            self.last_kept[agent] = previous

    @precondition(lambda self: self.admission is None and len(self.harness.agents) < 4)
    @rule(target=agents, seed=seeds)
    def spawn_subagent(self, seed):
        return self.harness.start_agent("sub-agent", random.Random(seed))

    @precondition(lambda self: self.admission is None)
    @rule(agent=agents, seed=seeds, turns=st.integers(1, 4))
    def step(self, agent, seed, turns):
        rng = random.Random(seed)
        for _ in range(turns):
            self._record(self.harness.step(agent, rng), agent, keeps_output=True)

    @precondition(lambda self: self.admission is None)
    @rule(agent=agents, seed=seeds)
    def retry(self, agent, seed):
        self._record(self.harness.retry(agent, random.Random(seed)), agent, keeps_output=False)

    @precondition(lambda self: self.admission is None)
    @rule(agent=agents, seed=seeds)
    def compact(self, agent, seed):
        self._record(self.harness.compact(agent, random.Random(seed)), agent, keeps_output=False)

    @precondition(lambda self: self.admission is None)
    @rule(agent=agents, seed=seeds, injected=st.booleans())
    def harness_text(self, agent, seed, injected):
        if injected:
            self.harness.inject_assistant_text(agent, random.Random(seed))
        else:
            self.harness.critique(agent, random.Random(seed))

    # -- admission phase -----------------------------------------------------

    @precondition(lambda self: len(self.calls) >= 6)
    @rule(seed=seeds, j_max=st.integers(1, 5))
    def admit_one(self, seed, j_max):
        if self.admission is None:  # the execution closes: records are frozen
            self.tree.close()
            self.admission = Admission(self.tree, ClaudeCodeRoles(), np.random.default_rng(seed), j_max)
        adm = self.admission
        unmasked = self.tree.trainable & ~adm.masked_positions()
        counts = {leaf: int(unmasked[self.tree.path_positions(leaf)].sum()) for leaf in self.tree.leaves()}
        expected_class = next((r for r in adm.priority
                               if any(c > 0 and adm.roles[leaf] == r for leaf, c in counts.items())), None)
        drawn = adm.draw()
        if drawn is None:
            assert expected_class is None or len(adm.admitted) == adm.j_max
            return
        assert drawn.role == expected_class and counts[drawn.leaf] > 0
        path = self.tree.path_positions(drawn.leaf)
        assert np.array_equal(drawn.targets, path[unmasked[path]])
        assert adm.masked_positions()[path].all()
        self.frozen.append(drawn.targets.copy())

    # -- invariants ------------------------------------------------------------

    @invariant()
    def reproduces_every_request(self):
        for i, call in enumerate(self.calls):
            assert np.array_equal(self.tree.request_input_ids(i), call.input_ids)
            assert np.array_equal(self.tree.request_sequence(i), call.sequence)

    @invariant()
    def main_and_sub_agents_have_separate_roots(self):
        roots = {"main": set(), "sub-agent": set()}
        for i, agent in enumerate(self.agent_of):
            roots[self.harness.agents[agent].kind].add(self.tree.path(self.tree.request_end(i))[0])
        assert not roots["main"] & roots["sub-agent"]

    @invariant()
    def provenance_is_max_over_requests(self):
        expected = np.zeros(self.tree.num_tokens, dtype=np.uint8)
        for i, call in enumerate(self.calls):
            positions = self.tree.path_positions(self.tree.request_end(i))
            np.maximum.at(expected, positions, call.provenance)
        assert np.array_equal(expected, self.tree.provenance)

    @invariant()
    def targets_disjoint_trainable_and_frozen(self):
        if self.admission is None:
            return
        admitted = self.admission.admitted
        assert len(admitted) <= self.admission.j_max
        seen = np.zeros(self.tree.num_tokens, dtype=bool)
        for trajectory, snapshot in zip(admitted, self.frozen):
            assert np.array_equal(trajectory.targets, snapshot)
            assert not trajectory.targets.flags.writeable
            assert not seen[trajectory.targets].any()
            seen[trajectory.targets] = True
            assert (self.tree.provenance[trajectory.targets] == SAMPLED).all()
            assert np.isin(trajectory.targets, self.tree.path_positions(trajectory.leaf)).all()

    def teardown(self):
        if self.admission is not None:
            while self.admission.draw() is not None:
                pass
            done_by_cap = len(self.admission.admitted) == self.admission.j_max
            assert done_by_cap or self.admission.next_class() is None


TreeAndAdmission.TestCase.settings = settings(
    max_examples=examples(80), stateful_step_count=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_tree_and_admission = TreeAndAdmission.TestCase
