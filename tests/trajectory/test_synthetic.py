"""The synthetic docs/trajectories.md#trajectory-trees execution (synthetic.py) and package hygiene."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import numpy as np

import gyre.trajectory
from gyre.trajectory.harness_roles import ClaudeCodeRoles, leaf_roles
from gyre.trajectory.synthetic import ExecutionShape, synthetic_execution
from gyre.trajectory.tree import TrajectoryTree
from gyre.trajectory.tree_stats import tree_stats


def test_default_shape_matches_the_spec_example():
    records = synthetic_execution(np.random.default_rng(0))
    assert len(records) == ExecutionShape().requests == 636
    tree = TrajectoryTree.from_records(records)
    stats = tree_stats(tree)
    assert stats.leaves == 10 and stats.roots == 2
    assert 0.8e6 < stats.unique_tokens < 1.2e6
    assert stats.expanded_tokens > 1.5 * stats.unique_tokens
    deepest = [p.depth_nodes for p in stats.shared_prefixes[:2]]
    assert deepest[0] > 150 and deepest[1] > 150  # the two compaction branch points
    roles = sorted(leaf_roles(tree, ClaudeCodeRoles()).values())
    assert roles.count("main-summary") == 1 and roles.count("sub-agent-summary") == 1
    for i in (0, 100, 635):
        assert np.array_equal(tree.request_input_ids(i), records[i].input_ids)


def test_same_seed_same_execution():
    shape = ExecutionShape(main_segments=(5, 3), subagent_segments=((4,),), spawn_turns=(1,), retry_turns=())
    a = synthetic_execution(np.random.default_rng(3), shape)
    b = synthetic_execution(np.random.default_rng(3), shape)
    assert a == b and len(a) == shape.requests


def test_trajectory_package_never_imports_torch():
    package = Path(gyre.trajectory.__file__).parent
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n.split(".")[0] == "torch" for n in names), f"{path.name} imports torch"
    modules = [f"gyre.trajectory.{m.name}" for m in pkgutil.iter_modules([str(package)])]
    code = f"import sys\nfor m in {modules!r}: __import__(m)\nassert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
