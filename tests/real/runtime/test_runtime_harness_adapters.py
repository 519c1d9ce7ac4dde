"""The Claude Code, Codex and mini-swe-agent adapters, run through ``HarnessRunner``.

One scripted engine (Qwen-style tool calls, in a thread) and one real proxy
process (``gyre proxy``) on 127.0.0.1 serve the whole module; each adapter has
its own API key and execution id in the proxy's configuration. The engine
tells the harness to run ``echo gyre-adapter-ok > proof.txt`` with its shell
tool, in the form that harness expects (its task prompt names the adapter).
Checked per adapter: the runner's outcome is ``completed`` with exit code 0,
``proof.txt`` holds the proof in the execution's workspace (so the tool really
ran there), the proxy recorded the execution's calls as one tool-loop path
(each call continues the previous call's sequence), and ``harness.log``
exists. The tests hold whether or not the runner isolates each execution in
its own network namespace. Skipped, with the reason, when a harness is not
installed (``.harness/`` for the npm ones, ``mini`` in the virtualenv).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

try:
    from proxy_fixtures import (build_tiny_tokenizer, check_records, scripted_proxy_process, shared_tiny_dir,
                                tool_loop_script)
except ImportError:  # tests/real imported as a package
    from .proxy_fixtures import (build_tiny_tokenizer, check_records, scripted_proxy_process, shared_tiny_dir,
                                 tool_loop_script)

from gyre.real.harness.runner import Budgets, ClaudeCode, Codex, HarnessRunner, MiniSweAgent, Task
from gyre.trajectory.tree import TrajectoryTree
from gyre.trajectory.tree_stats import tree_stats

ROOT = Path(__file__).resolve().parents[3]
NPM_BIN = Path(os.environ.get("GYRE_HARNESS_BIN", ROOT / ".harness" / "node_modules" / ".bin"))
CLAUDE, CODEX = NPM_BIN / "claude", NPM_BIN / "codex"
MINI = Path(sys.executable).parent / "mini"
PROOF = "gyre-adapter-ok"
WRITE_PROOF = f"echo {PROOF} > proof.txt"

pytestmark = [pytest.mark.slow]

# adapter name -> the tool_loop script that makes that harness write the proof
TOOL_LOOPS = {
    "claude-code": dict(tool="Bash", commands=[WRITE_PROOF]),
    "codex": dict(tool="exec_command", commands=[{"cmd": WRITE_PROOF}]),
    "mini-swe-agent": dict(tool="bash", commands=[WRITE_PROOF, "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"]),
}


def task_for(name: str) -> Task:
    return Task(task_id=f"adapter-{name}", prompt=f"[adapter {name}] Write the proof file, then report.")


def per_adapter_script() -> Callable[[str], str]:
    """One engine for all three harnesses: pick the tool loop by the adapter named in the task."""
    scripts = {name: tool_loop_script(final="All done.", **options) for name, options in TOOL_LOOPS.items()}

    def script(prompt: str) -> str:
        for name, chosen in scripts.items():
            if f"[adapter {name}]" in prompt:
                return chosen(prompt)
        return "No task I know."

    return script


@pytest.fixture(scope="module")
def proxy(model, tmp_path_factory):
    """(proxy url, records dir) of one proxy process in front of one scripted engine."""
    keys = {f"key-{name}": f"adapter-{name}" for name in TOOL_LOOPS}
    with scripted_proxy_process(model, per_adapter_script(), tmp_path_factory.mktemp("adapter-proxy"), keys) as up:
        yield up


async def run_once(runner: HarnessRunner, name: str):
    try:
        return await runner.run(1, task_for(name), f"key-{name}")
    finally:
        await runner.close()  # stops the sandbox bridge of an isolating runner


def run_adapter(adapter, proxy, tmp_path):
    url, _ = proxy
    runner = HarnessRunner(tmp_path / "runs", url, adapter, Budgets(harness_timeout_s=150.0))
    result = asyncio.run(run_once(runner, adapter.name))
    log = result.workspace.parent / "harness.log"
    tail = log.read_text(errors="replace")[-4000:] if log.exists() else "(no harness.log)"
    assert (result.outcome, result.returncode) == ("completed", 0), tail
    assert log.exists()
    proof = result.workspace / "proof.txt"
    assert proof.exists() and proof.read_text().strip() == PROOF, tail
    return result


def check_one_tool_loop_path(proxy, model, name: str) -> list:
    """The proxy recorded the execution's calls, each continuing the previous call's sequence."""
    _, records_dir = proxy
    records = check_records(records_dir, f"adapter-{name}", model)
    assert len(records) >= 2, f"{name}: expected the tool call and the answer, got {len(records)} calls"
    for earlier, later in zip(records, records[1:]):
        assert later.input_ids[: len(earlier.sequence)].tolist() == earlier.sequence.tolist()
    assert tree_stats(TrajectoryTree.from_records(records)).as_dict()["leaves"] == 1
    return records


def installed(binary: Path, how: str):
    """Skip (before the module's engine and proxy start) when ``binary`` is missing."""
    return pytest.mark.skipif(not binary.exists(), reason=f"{binary} not installed ({how})")


@pytest.mark.timeout(300)
@installed(CLAUDE, "npm i @anthropic-ai/claude-code in .harness/")
def test_claude_code_adapter_runs_a_bash_tool_loop(proxy, model, tmp_path):
    result = run_adapter(ClaudeCode(binary=str(CLAUDE)), proxy, tmp_path)
    answer = json.loads((result.workspace.parent / "harness.log").read_text().strip().splitlines()[-1])
    assert answer["is_error"] is False and answer["result"].startswith("All done."), answer
    check_one_tool_loop_path(proxy, model, "claude-code")


@pytest.mark.timeout(300)
@installed(CODEX, "npm i @openai/codex in .harness/")
def test_codex_adapter_runs_an_exec_command_loop(proxy, model, tmp_path):
    result = run_adapter(Codex(binary=str(CODEX)), proxy, tmp_path)
    assert "All done." in (result.workspace.parent / "harness.log").read_text()
    assert len(check_one_tool_loop_path(proxy, model, "codex")) == 2


@pytest.mark.timeout(300)
@installed(MINI, "pip install mini-swe-agent")
def test_mini_swe_agent_adapter_runs_bash_until_it_submits(proxy, model, tmp_path):
    result = run_adapter(MiniSweAgent(binary=str(MINI)), proxy, tmp_path)
    trajectory = json.loads((result.workspace.parent / "home" / "trajectory.json").read_text())
    assert trajectory["info"]["exit_status"] == "Submitted", trajectory["info"]
    assert len(check_one_tool_loop_path(proxy, model, "mini-swe-agent")) == 2
