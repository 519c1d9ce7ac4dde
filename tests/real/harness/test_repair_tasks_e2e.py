"""Repair tasks end to end: harness process -> proxy -> engine, then the tests run in the preserved workspace.

One scripted engine (in a thread; the outer edge) and one real proxy process
serve the module. The engine plays a model that knows each shipped repair
task's reference fix (``meta.fix`` of ``configs/tasks/repair.jsonl``) and
answers in the form the harness acts on: edit blocks for the scripted
harness (its one tool), a ``bash`` tool call running a Python patch for
mini-swe-agent; for ``repair-spans`` it proposes no edit (mini-swe-agent
is told to submit at once). The
harnesses are real processes started by ``HarnessRunner`` through the task
set's wrapper (the workspace is built inside the execution's own process),
and each execution is closed and scored by ``close_and_evaluate`` with the
task set's evaluator, as the real backend does.

Checked: a repaired workspace scores 1.0, the untouched one its base share,
and every reward equals the share of passing tests the evaluator's own run
reports; the calls went through the proxy (its records); after a harness
timeout the half-repaired workspace is scored (docs/trajectories.md#evaluation-and-outcomes: partial scoring).
Skipped, with the reason, when mini-swe-agent is not installed.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest

try:
    from proxy_fixtures import check_records, scripted_proxy_process, tool_loop_script
except ImportError:  # tests/real imported as a package
    from .proxy_fixtures import check_records, scripted_proxy_process, tool_loop_script

from gyre.real.harness import repair
from gyre.real.harness.evaluation import close_and_evaluate
from gyre.real.harness.runner import Budgets, HarnessRunner, MiniSweAgent, ScriptedHarness, Task
from gyre.real.harness.scripted import MAIN_SYSTEM
from gyre.real.harness.taskset import load_taskset
from gyre.trajectory.evaluation import EvalState
from gyre.trajectory.groups import TrajectoryBuffer

ROOT = Path(__file__).resolve().parents[3]
MINI = Path(sys.executable).parent / "mini"
UNREPAIRED = "repair-spans"  # the engine proposes no edit for this one
KEYS = {f"key-{x}": f"x{x}" for x in range(30)}

pytestmark = [pytest.mark.slow]


def edit_blocks(spec) -> list[str]:
    """The reference fix as scripted-harness edit blocks (whole lines of the planted file)."""
    blocks = []
    for edit in spec.meta["fix"]:
        text, old = spec.files[edit["path"]], edit["old"].rstrip("\n")
        at = text.index(old)
        start, end = text.rfind("\n", 0, at) + 1, text.find("\n", at + len(old))
        lines = text[start:end]
        blocks.append(f"<<<EDIT {edit['path']}\n{lines}\n===\n{lines.replace(old, edit['new'].rstrip(chr(10)))}\n>>>")
    return blocks


def patch_command(spec) -> str:
    """The reference fix as one shell command (a Python patch), for a bash-tool harness."""
    lines = ["import pathlib"]
    for edit in spec.meta["fix"]:
        lines += [f"p = pathlib.Path({edit['path']!r})",
                  f"p.write_text(p.read_text().replace({edit['old']!r}, {edit['new']!r}, 1))"]
    return f"{sys.executable} - <<'EOF'\n" + "\n".join(lines) + "\nEOF"


def repair_model(taskset):
    """The engine's script: recognise the task by its package name and answer for the harness at hand."""
    specs = {f"package `{s.task_id.removeprefix('repair-')}`": s for s in taskset.specs}
    submit = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
    mini = {key: tool_loop_script(tool="bash", final="Submitted.",
                                  commands=[submit] if s.task_id == UNREPAIRED else [patch_command(s), submit])
            for key, s in specs.items()}

    def script(prompt: str) -> str:
        key = next((k for k in specs if k in prompt), None)
        if key is None:
            return "I do not know this task."
        if MAIN_SYSTEM not in prompt:
            return mini[key](prompt)
        if specs[key].task_id == UNREPAIRED:
            return "I could not find the bug."
        blocks, applied = edit_blocks(specs[key]), prompt.count(": applied")
        return f"Applying fix {applied + 1}.\n{blocks[applied]}" if applied < len(blocks) else "All fixed."

    return script


@pytest.fixture(scope="module")
def taskset():
    return load_taskset(ROOT / "configs" / "tasks" / "repair.jsonl", repair.EVALUATOR)


@pytest.fixture(scope="module")
def proxy(model, taskset, tmp_path_factory):
    with scripted_proxy_process(model, repair_model(taskset), tmp_path_factory.mktemp("repair-proxy"), KEYS) as up:
        yield up


def run_and_score(taskset, runner: HarnessRunner, jobs: dict[int, str]) -> dict[int, tuple]:
    """Run each (execution -> task id) concurrently, close and evaluate each; (result, state, reward)."""
    buffer = TrajectoryBuffer(1)

    async def one(x: int, task_id: str):
        buffer.open_group(f"g{x}", 0, [f"x{x}"], deadline=time.monotonic() + 600)
        spec = taskset.by_id[task_id]
        result = await runner.run(x, Task(task_id=spec.task_id, prompt=spec.prompt), f"key-{x}")
        state = await close_and_evaluate(buffer, taskset, f"x{x}", result.workspace, time.monotonic)
        return x, (result, state, buffer.evaluation(f"x{x}").reward)

    async def main():
        try:
            return dict(await asyncio.gather(*(one(x, t) for x, t in jobs.items())))
        finally:
            await runner.close()

    return asyncio.run(main())


def passing_share(taskset, task_id: str, workspace: Path) -> float:
    """The share of passing tests, from the evaluator's own test run (independent of its reward path)."""
    evaluator = taskset.evaluators[task_id]
    outcomes = evaluator.outcomes(workspace)
    return sum(outcomes.get(t) == "pass" for t in evaluator.expected) / len(evaluator.expected)


def base_share(taskset, task_id: str) -> float:
    broken = {t for b in taskset.by_id[task_id].meta["breaks"] for t in b}
    return 1 - len(broken) / len(taskset.evaluators[task_id].expected)


def log_tail(result) -> str:
    log = result.workspace.parent / "harness.log"
    return log.read_text(errors="replace")[-3000:] if log.exists() else "(no harness.log)"


def assert_scored(taskset, task_id: str, result, state, reward):
    """A completed run, validly scored by its tests: full marks when repaired, the planted share when not."""
    assert (result.outcome, state) == ("completed", EvalState.VALID), log_tail(result)
    assert reward == pytest.approx(passing_share(taskset, task_id, result.workspace))
    assert reward == (pytest.approx(base_share(taskset, task_id)) if task_id == UNREPAIRED else 1.0)
    return result


@pytest.mark.timeout(300)
def test_the_scripted_harness_repairs_through_the_proxy_and_the_tests_score_it(proxy, model, taskset, tmp_path):
    url, records = proxy
    runner = HarnessRunner(tmp_path, url, taskset.harness(ScriptedHarness(calls=3, compact_every=0, subagent_at=())),
                           Budgets(harness_timeout_s=150.0))
    jobs = {0: "repair-textkit", 1: "repair-statkit", 2: UNREPAIRED, 3: "repair-wordcount"}
    done = run_and_score(taskset, runner, jobs)
    for x, task_id in jobs.items():
        assert_scored(taskset, task_id, *done[x])
        assert len(check_records(records, f"x{x}", model)) == 3  # every call went through the proxy
    assert base_share(taskset, UNREPAIRED) < 1.0
    assert (done[3][0].workspace / "tests" / "test_count.py").exists()  # built inside the execution's process


@pytest.mark.timeout(300)
def test_a_harness_timeout_scores_the_half_repaired_workspace(proxy, taskset, tmp_path):
    url, _ = proxy
    slow = ScriptedHarness(calls=2, compact_every=0, subagent_at=(), sleep_s=300.0)  # killed while "working"
    runner = HarnessRunner(tmp_path, url, taskset.harness(slow), Budgets(harness_timeout_s=15.0, grace_s=1.0))
    result, state, reward = run_and_score(taskset, runner, {10: "repair-wordcount"})[10]
    assert (result.outcome, state) == ("harness_timeout", EvalState.VALID), log_tail(result)
    second_bug = taskset.by_id["repair-wordcount"].meta["breaks"][1]
    assert reward == pytest.approx(1 - len(second_bug) / 6) == pytest.approx(passing_share(
        taskset, "repair-wordcount", result.workspace))
    assert base_share(taskset, "repair-wordcount") < reward < 1.0


@pytest.mark.timeout(300)
@pytest.mark.skipif(not MINI.exists(), reason=f"{MINI} not installed (pip install mini-swe-agent)")
def test_mini_swe_agent_repairs_through_the_proxy_and_the_tests_score_it(proxy, model, taskset, tmp_path):
    url, records = proxy
    runner = HarnessRunner(tmp_path, url, taskset.harness(MiniSweAgent(binary=str(MINI))),
                           Budgets(harness_timeout_s=150.0))
    jobs = {20: "repair-textkit", 21: "repair-wordcount", 22: UNREPAIRED}
    done = run_and_score(taskset, runner, jobs)
    for x, task_id in jobs.items():
        result = assert_scored(taskset, task_id, *done[x])
        trajectory = json.loads((result.workspace.parent / "home" / "trajectory.json").read_text())
        assert trajectory["info"]["exit_status"] == "Submitted", trajectory["info"]
        assert len(check_records(records, f"x{x}", model)) == (1 if task_id == UNREPAIRED else 2)
