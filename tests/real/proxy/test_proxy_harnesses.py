"""Real, unmodified harnesses through the proxy, in loopback-only network namespaces.

Each harness runs inside ``unshare -m -n`` (only ``lo`` up, so nothing can leave
the machine) together with a scripted engine (Qwen-style tool calls, so the
harness runs a real tool loop) and the proxy process; this file is also the
driver that runs inside the namespace (``--driver SPEC``). After the run the
test reads the records from disk and compares them with the request bodies the
proxy dumped (``dump_requests``): every record's decoded input contains the
system prompt and the last user/tool text that was sent, each call the harness
answered with a tool result continues the previous call's path token for token
(one leaf), and the harness finished cleanly. The command lines are those of
the runner's adapters (``gyre.real.harness.runner``), so what is tested here
is what a real run starts.

Skipped with the reason when not root, when ``unshare`` cannot make a network
namespace, or when a harness is not installed (``.harness/`` for the npm ones,
``mini`` in the virtualenv for mini-swe-agent).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1]  # tests/real: proxy_fixtures.py
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))  # the driver runs this file as a script
from proxy_fixtures import build_tiny_tokenizer, shared_tiny_dir, start_proxy_process  # noqa: E402

from gyre.real.harness.runner import ClaudeCode, Codex, MiniSweAgent, Task  # noqa: E402

NPM_BIN = Path(os.environ.get("GYRE_HARNESS_BIN", ROOT / ".harness" / "node_modules" / ".bin"))
KEY = "harness-key-0"
SECRET_OUTPUT = "gyre-harness-ok"


def _sandbox_problem() -> str | None:
    if os.geteuid() != 0:
        return "needs root for unshare -n"
    if not shutil.which("unshare") or not shutil.which("ip"):
        return "needs unshare and ip (util-linux, iproute2)"
    probe = subprocess.run(["unshare", "-m", "-n", "sh", "-c", "ip link set lo up"], capture_output=True)
    return None if probe.returncode == 0 else f"unshare -m -n failed: {probe.stderr.decode()[:200]}"


SANDBOX_PROBLEM = _sandbox_problem()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(SANDBOX_PROBLEM is not None, reason=str(SANDBOX_PROBLEM))]


# -- the driver (runs inside the namespace) --------------------------------------------


def _fill(value: str, url: str) -> str:
    return value.replace("{url}", url).replace("{key}", KEY)


def drive(spec: dict) -> dict:
    """Start engine and proxy, run the harness, stop them; returns rc and output."""
    engine = subprocess.Popen([sys.executable, str(HERE / "proxy_fixtures.py"), "--model", spec["model"],
                               "--script", "tool_loop", "--options", json.dumps(spec["script"])],
                              stdout=subprocess.PIPE, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    engine_url = json.loads(engine.stdout.readline())["url"]
    config = {"model_path": spec["model"], "records_dir": spec["records"], "admin_token": "harness-admin-token",
              "engines": [{"id": "e0", "url": engine_url}], "executions": {KEY: spec["execution"]},
              "dump_requests": True, "harness": spec["name"]}
    proxy, url = start_proxy_process(config, Path(spec["scratch"]) / "proxy.json")
    try:
        for path, content in spec.get("files", {}).items():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(_fill(content, url))
        env = {k: _fill(v, url) for k, v in spec["env"].items()}
        run = subprocess.run([_fill(a, url) for a in spec["argv"]], cwd=spec["scratch"], capture_output=True,
                             text=True, timeout=spec.get("timeout", 150), stdin=subprocess.DEVNULL,
                             env=dict(os.environ, **env))
        return {"rc": run.returncode, "stdout": run.stdout[-20000:], "stderr": run.stderr[-20000:]}
    except subprocess.TimeoutExpired as exc:
        return {"rc": "timeout", "stdout": str(exc.stdout)[-5000:], "stderr": str(exc.stderr)[-5000:]}
    finally:
        for process in (proxy, engine):
            process.send_signal(signal.SIGTERM)
            process.wait(20)


def run_sandboxed(spec: dict, tmp_path: Path) -> dict:
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    script = f"ip link set lo up && exec {sys.executable} {__file__} --driver {spec_path}"
    done = subprocess.run(["unshare", "-m", "-n", "sh", "-c", script], capture_output=True, text=True,
                          timeout=spec.get("timeout", 150) + 60)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((tmp_path / "result.json").read_text())


# -- checks ---------------------------------------------------------------------------------


def _sent_texts(body: dict) -> list[str]:
    """System prompt and the last user-side texts of a request body (any of the three APIs)."""
    texts = []
    system = body.get("system") or body.get("instructions")
    if isinstance(system, list):
        system = "\n".join(b.get("text", "") for b in system)
    if system:
        texts.append(system[:200])
    last = (body.get("messages") or body.get("input") or [])[-1:]
    for item in last:
        content = item.get("content", item.get("output", ""))
        if isinstance(content, list):
            content = " ".join(str(b.get("text") or b.get("content") or "") for b in content)
        if isinstance(content, str) and content.strip():
            texts.append(content.strip()[:60])
    return texts


def check_recorded_tree(records_dir: Path, execution: str, model: Path) -> list:
    from transformers import AutoTokenizer

    from gyre.real.store.tito_log import ExecutionStore
    from gyre.trajectory.tree import TrajectoryTree
    from gyre.trajectory.tree_stats import tree_stats

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    records = ExecutionStore(records_dir).read(execution)
    assert records, "the harness made no recorded call"
    for record in records:
        dumped = json.loads((records_dir / "requests" / execution / f"{record.request_id}.json").read_text())
        prompt = tokenizer.decode(record.input_ids.tolist())
        for text in _sent_texts(dumped["body"]):
            assert text.split("\n")[0] in prompt, (text[:80], prompt[-400:])
    tree = TrajectoryTree.from_records(records)
    for index, record in enumerate(records):
        assert tree.request_sequence(index).tolist() == record.sequence.tolist()
    return records, tree_stats(tree).as_dict()


def _tool_loop_continues(records) -> bool:
    """Some call's input starts with an earlier call's full sequence (the tool loop's one path)."""
    return any(later.input_ids[: len(earlier.sequence)].tolist() == earlier.sequence.tolist()
               for i, earlier in enumerate(records) for later in records[i + 1:])


def _spec(name: str, tmp_path: Path, model: Path, argv: list, env: dict, script: dict, **extra) -> dict:
    scratch = tmp_path / "work"
    scratch.mkdir()
    return {"name": name, "model": str(model), "records": str(tmp_path / "records"), "execution": f"{name}-1",
            "scratch": str(scratch), "argv": [str(a) for a in argv], "env": env, "script": script,
            "result": str(tmp_path / "result.json"), **extra}


def _command(adapter, prompt: str, home: Path) -> tuple[list[str], dict[str, str]]:
    """The runner adapter's own command line, with the proxy URL and key left as placeholders (filled
    inside the namespace by the driver) and HOME set as the runner sets it."""
    home.mkdir(parents=True, exist_ok=True)
    argv, env = adapter.command(Task(task_id="t", prompt=prompt), "{url}", "{key}", home)
    return argv, {**env, "HOME": str(home)}


@pytest.mark.timeout(300)
def test_claude_code_runs_a_bash_tool_loop(model, tmp_path):
    claude = NPM_BIN / "claude"
    if not claude.exists():
        pytest.skip(f"Claude Code not installed at {claude} (npm i @anthropic-ai/claude-code in .harness/)")
    argv, env = _command(ClaudeCode(binary=str(claude)), "Run the command and report.", tmp_path / "home")
    spec = _spec("claude-code", tmp_path, model, argv, env,
                 {"tool": "Bash", "commands": [f"echo {SECRET_OUTPUT}"], "final": "All done."})
    result = run_sandboxed(spec, tmp_path)
    assert result["rc"] == 0, result
    answer = json.loads(result["stdout"])
    assert answer["is_error"] is False and f"All done. Output: {SECRET_OUTPUT}" in answer["result"]
    records, stats = check_recorded_tree(tmp_path / "records", "claude-code-1", model)
    assert _tool_loop_continues(records) and stats["requests"] == len(records) and stats["leaves"] == 1


@pytest.mark.timeout(300)
def test_codex_exec_runs_an_exec_command_loop(model, tmp_path):
    codex = NPM_BIN / "codex"
    if not codex.exists():
        pytest.skip(f"Codex CLI not installed at {codex} (npm i @openai/codex in .harness/)")
    argv, env = _command(Codex(binary=str(codex)), "Run the command and report.", tmp_path / "home")
    config = Path(env["CODEX_HOME"]) / "config.toml"  # written by the adapter; its {url} is filled inside
    spec = _spec("codex", tmp_path, model, argv, env,
                 {"tool": "exec_command", "commands": [{"cmd": f"echo {SECRET_OUTPUT}"}], "final": "All done."},
                 files={str(config): config.read_text()})
    result = run_sandboxed(spec, tmp_path)
    assert result["rc"] == 0, result
    assert "All done. Output:" in result["stdout"] and SECRET_OUTPUT in result["stdout"] + result["stderr"]
    records, stats = check_recorded_tree(tmp_path / "records", "codex-1", model)
    assert len(records) == 2 and _tool_loop_continues(records) and stats["leaves"] == 1


@pytest.mark.timeout(300)
def test_mini_swe_agent_runs_bash_until_it_submits(model, tmp_path):
    mini = Path(sys.executable).parent / "mini"
    if not mini.exists():
        pytest.skip(f"mini-swe-agent not installed ({mini} missing; pip install mini-swe-agent)")
    home = tmp_path / "home"
    argv, env = _command(MiniSweAgent(binary=str(mini)), "Print the greeting, then submit.", home)
    spec = _spec("mini-swe-agent", tmp_path, model, argv, env,
                 {"tool": "bash", "commands": [f"echo {SECRET_OUTPUT}", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"],
                  "final": "unused"})
    result = run_sandboxed(spec, tmp_path)
    assert result["rc"] == 0, result
    trajectory = json.loads((home / "trajectory.json").read_text())
    assert trajectory["info"]["exit_status"] == "Submitted", trajectory["info"]
    assert SECRET_OUTPUT in json.dumps(trajectory["messages"])
    records, stats = check_recorded_tree(tmp_path / "records", "mini-swe-agent-1", model)
    assert len(records) == 2 and _tool_loop_continues(records) and stats["leaves"] == 1


if __name__ == "__main__" and "--driver" in sys.argv:
    spec = json.loads(Path(sys.argv[sys.argv.index("--driver") + 1]).read_text())
    Path(spec["result"]).write_text(json.dumps(drive(spec)))
