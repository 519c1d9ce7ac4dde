"""Harness runner: one OS process per execution, in its own sandbox, with budgets.

Each execution gets ``ROOT/exec-<id>/`` holding ``workspace/`` (its working
directory and artifact state), ``home/`` (HOME and harness config dirs) and
``harness.log`` (stdout + stderr), with stdin closed (/dev/null). The harness
reaches the model only through the proxy's base URL with its own per-execution
key; with ``isolate`` ("auto" by default) it runs in its own loopback-only
network namespace where only the proxy is reachable, through a bridge
(``harness.sandbox``). Paths named in ``hide`` (the job passes the proxy's
record store and its ``keys.json``), with any in ``$GYRE_SANDBOX_HIDE``, are
covered in each sandboxed harness's private mount namespace; where the
harness is not sandboxed or no mount namespace can be made they stay visible,
``hiding`` is False and a warning names the reason once per runner. Adapters turn a task into
argv + environment for a harness: the built-in scripted harness,
mini-swe-agent, Claude Code and Codex (command lines from
docs/harnesses.md).

Outcomes (the trace vocabulary): ``completed`` (exit 0), ``failed`` (non-zero
exit or a start failure), ``harness_timeout`` (killed at its harness timeout:
the workspace is kept and still scored), ``cancelled`` (``cancel``).

Invariants: a run ends exactly once with one outcome; the whole process group
is killed on timeout or cancellation (TERM, then KILL after a grace period),
so no harness outlives its execution; the workspace is never deleted. Runs
start one at a time (a lock per event loop around workspace and spawn): a
spawn forks the caller and holds its event loop for ~20-60 ms, so a burst of
starts taken in one go held the job's loop for seconds while the training
step behind it waited for its groups; now whatever else is due on the loop
runs between two starts. A run's workspace and command line (the folders,
``TASK.md`` and the task's files, whatever the adapter writes) are made on a
worker thread: a slow disk or a slow adapter holds that start, never the loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gyre.ids import execution_id
from gyre.real.harness.sandbox import (
    HOST_NAMESPACES,
    HostBridge,
    Namespaces,
    choose_isolation,
    hidden_paths,
    require_executable,
    sandbox_argv,
)
from gyre.real.runtime.lifetime import die_with_parent

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Task:
    task_id: str
    prompt: str
    files: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Budgets:
    """Per execution: the harness is killed at ``harness_timeout_s`` (its work is still scored);
    ``overall_timeout_s`` bounds the harness plus evaluation retries (then: excluded)."""

    harness_timeout_s: float = 4 * 3600.0
    overall_timeout_s: float = 5 * 3600.0
    grace_s: float = 5.0

    def __post_init__(self) -> None:
        if not 0 < self.harness_timeout_s <= self.overall_timeout_s:
            raise ValueError(f"budgets need 0 < harness_timeout_s <= overall_timeout_s, got "
                             f"{self.harness_timeout_s} and {self.overall_timeout_s}")


@dataclass(frozen=True)
class ExecutionResult:
    execution: int
    outcome: str
    returncode: int | None
    workspace: Path
    started_at: float
    ended_at: float
    isolated: bool = False


class HarnessAdapter(Protocol):
    name: str

    def command(self, task: Task, base_url: str, key: str, home: Path) -> tuple[list[str], dict[str, str]]:
        """argv and extra environment to start the harness on ``task``."""


@dataclass(frozen=True)
class ScriptedHarness:
    """The built-in scripted multi-call harness (``harness.scripted``)."""

    calls: int = 6
    compact_every: int = 3
    subagent_at: tuple[int, ...] = (2,)
    sleep_s: float = 0.0
    retries: int = 5  # per call, on 429/5xx/connection errors (backoff doubling to 1 s: ~1.5 s for 5)
    name: str = "scripted"

    def __post_init__(self) -> None:
        # refused here, at the job's load, not by every harness process it starts (each would fail its execution)
        if not 0.0 <= self.sleep_s < math.inf:
            raise ValueError(f"sleep_s must be a finite number of seconds >= 0, got {self.sleep_s!r}")
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries!r}")

    def command(self, task: Task, base_url: str, key: str, home: Path) -> tuple[list[str], dict[str, str]]:
        argv = [sys.executable, "-m", "gyre.real.harness.scripted", "--base-url", base_url,
                "--calls", str(self.calls), "--compact-every", str(self.compact_every),
                "--sleep", str(self.sleep_s), "--retries", str(self.retries), "--task-file", "TASK.md"]
        if self.subagent_at:
            argv += ["--subagent-at", *map(str, self.subagent_at)]
        return argv, {"OPENAI_API_KEY": key}


@dataclass(frozen=True)
class ClaudeCode:
    """``claude -p`` against the proxy's Anthropic endpoint (no outside lookups).

    ``model`` is pinned: left out, Claude Code picks its own default, which
    changes with its version and sets the context window (when it compacts).
    """

    binary: str = "claude"
    model: str = "claude-sonnet-4-5"
    name: str = "claude-code"

    def command(self, task: Task, base_url: str, key: str, home: Path) -> tuple[list[str], dict[str, str]]:
        env = {"ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": key, "CLAUDE_CONFIG_DIR": str(home / ".claude"),
               "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1",
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "CLAUDE_CODE_ATTRIBUTION_HEADER": "0"}
        argv = [self.binary, "-p", task.prompt, "--output-format", "json", "--model", self.model,
                "--allowedTools", "Bash"]
        return argv, env


@dataclass(frozen=True)
class Codex:
    """``codex exec`` with a local model provider written into CODEX_HOME (``home/.codex``).

    The features that talk to OpenAI's services (plugins, apps, remote plugins,
    tool suggestions), analytics and the update check are off.
    """

    binary: str = "codex"
    name: str = "codex"

    def command(self, task: Task, base_url: str, key: str, home: Path) -> tuple[list[str], dict[str, str]]:
        config = (f'model = "gyre"\nmodel_provider = "local"\napproval_policy = "never"\n'
                  f'sandbox_mode = "danger-full-access"\n[model_providers.local]\nname = "local"\n'
                  f'base_url = "{base_url.rstrip("/")}/v1"\nenv_key = "GYRE_KEY"\nwire_api = "responses"\n')
        codex_home = home / ".codex"
        codex_home.mkdir(parents=True, exist_ok=True)
        (codex_home / "config.toml").write_text(config)
        disabled = [arg for feature in ("plugins", "apps", "remote_plugin", "tool_suggest")
                    for arg in ("--disable", feature)]
        argv = [self.binary, "exec", "--skip-git-repo-check", *disabled,
                "-c", "analytics.enabled=false", "-c", "check_for_update_on_startup=false", task.prompt]
        return argv, {"CODEX_HOME": str(codex_home), "GYRE_KEY": key}


@dataclass(frozen=True)
class MiniSweAgent:
    """mini-swe-agent on the proxy's OpenAI endpoint; its trajectory goes to ``home/trajectory.json``.

    ``config`` comes first: once any ``-c`` is given, mini loads no default config.
    """

    binary: str = "mini"
    config: str = "mini.yaml"
    name: str = "mini-swe-agent"

    def command(self, task: Task, base_url: str, key: str, home: Path) -> tuple[list[str], dict[str, str]]:
        argv = [self.binary, "-y", "--exit-immediately", "-m", "openai/gyre", "-c", self.config,
                "-c", f"model.model_kwargs.api_base={base_url.rstrip('/')}/v1",
                "-o", str(home / "trajectory.json"), "-t", task.prompt]
        return argv, {"OPENAI_API_KEY": key, "MSWEA_CONFIGURED": "true", "MSWEA_COST_TRACKING": "ignore_errors",
                      "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


class HarnessRunner:
    """Runs harness executions; ``isolate`` ("auto", "always", "never") puts each in a loopback-only
    network namespace bridged to the proxy (gyre.real.harness.sandbox), with ``hide`` (and
    ``$GYRE_SANDBOX_HIDE``) covered where a mount namespace can be made (``namespaces``: what the host can
    make, probed by default). Call ``close()`` after the last run."""

    def __init__(self, root: str | Path, base_url: str, adapter: HarnessAdapter, budgets: Budgets = Budgets(),
                 isolate: str = "auto", hide: list[str | os.PathLike] = (), supervisor: Any = None,
                 namespaces: Namespaces = HOST_NAMESPACES) -> None:
        self.root, self.base_url, self.adapter, self.budgets = Path(root), base_url, adapter, budgets
        self.supervisor = supervisor  # a supervisor.client.SupervisorClient: harnesses outlive this process
        self.attached: dict[int, int] = {}  # execution -> pid of the harness a resumed run attached to
        self._supervised: set[int] = set()
        self._supervised_bridge: Any = None  # supervisor.services.BridgeAddress
        self.namespaces = namespaces
        self.isolated = choose_isolation(isolate, base_url, namespaces)
        self.hide = list(dict.fromkeys([*hidden_paths(list(hide)), *hidden_paths(None)]))
        self.hiding = False  # whether the hidden paths are really covered in each harness's view
        if self.hide:
            problem = "the harnesses are not sandboxed (isolate)" if not self.isolated else namespaces.mount()[1]
            self.hiding = problem is None
            if problem is not None:
                log.warning("harness runner: %s stay visible to harnesses: %s",
                            ", ".join(map(str, self.hide)), problem)
        self._procs: dict[int, asyncio.subprocess.Process] = {}
        self._cancelled: set[int] = set()
        self._bridge: HostBridge | None = None
        self._bridge_start: asyncio.Future | None = None
        self._start_lock: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    def sandbox(self, execution: int, task: Task) -> tuple[Path, Path]:
        base = self.root / f"exec-{execution}"
        workspace, home = base / "workspace", base / "home"
        workspace.mkdir(parents=True, exist_ok=True)
        home.mkdir(parents=True, exist_ok=True)
        (workspace / "TASK.md").write_text(task.prompt)
        for name, text in task.files.items():
            (workspace / name).write_text(text)
        return workspace, home

    def _command(self, execution: int, task: Task, key: str, bridge: HostBridge | None,
                 ) -> tuple[Path, list[str], dict[str, str]]:
        """The execution's sandbox made, and its workspace, command line (sandboxed when ``bridge``) and
        environment; FileNotFoundError when a sandboxed harness's executable is missing."""
        workspace, home = self.sandbox(execution, task)
        argv, extra = self.adapter.command(task, self.base_url, key, home)
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "LANG": "C.UTF-8", **extra}
        env.update({k: v for k, v in os.environ.items() if k in ("PYTHONPATH", "VIRTUAL_ENV")})
        if bridge is not None:
            require_executable(argv[0], workspace, env["PATH"])
        command = argv if bridge is None else sandbox_argv(argv, bridge.path, bridge.port, self.hide, self.namespaces)
        return workspace, command, env

    async def run(self, execution: int, task: Task, key: str) -> ExecutionResult:
        if self.supervisor is not None:
            return await self._run_supervised(execution, task, key)
        bridge = await self._started_bridge() if self.isolated else None
        async with self._starting():  # one start at a time: the loop serves what else is due between two
            workspace = self.root / f"exec-{execution}" / "workspace"
            started = time.monotonic()
            log = None
            try:
                workspace, command, env = await asyncio.to_thread(self._command, execution, task, key, bridge)
                log = open(workspace.parent / "harness.log", "ab")
                # stdin closed: ``codex exec`` reads a piped stdin to its end before it starts
                proc = await asyncio.create_subprocess_exec(*command, cwd=workspace, env=env,
                                                            stdin=asyncio.subprocess.DEVNULL, stdout=log,
                                                            stderr=asyncio.subprocess.STDOUT, start_new_session=True,
                                                            preexec_fn=die_with_parent)
            except OSError as exc:
                return self._start_failed(execution, workspace, started, exc, log)
        self._procs[execution] = proc
        outcome = await self._wait(execution, proc)
        log.close()
        self._procs.pop(execution, None)
        return ExecutionResult(execution, outcome, proc.returncode, workspace, started, time.monotonic(),
                               self.isolated)

    def _start_failed(self, execution: int, workspace: Path, started: float, exc: OSError, log=None) -> ExecutionResult:
        """A harness that could not start: ``failed``, with the reason in its ``harness.log``."""
        workspace.parent.mkdir(parents=True, exist_ok=True)
        with open(workspace.parent / "harness.log", "ab") if log is None else log as out:
            out.write(f"could not start {getattr(exc, 'filename', None) or 'the harness'}: {exc}\n".encode())
        return ExecutionResult(execution, "failed", None, workspace, started, time.monotonic(), self.isolated)

    async def _run_supervised(self, execution: int, task: Task, key: str) -> ExecutionResult:
        """Run (or attach to) the execution's harness under the supervisor: a harness it already runs or
        ran under this id by itself is attached to, never started again (its sandbox is not touched either)."""
        name = execution_id(execution)
        workspace = self.root / f"exec-{execution}" / "workspace"
        entry = await self.supervisor.status(name)
        if entry is None or entry.state == "lost" or entry.killed:  # never ran, or its run was cut: start it
            bridge = await self._started_bridge() if self.isolated else None
            async with self._starting():
                started = time.monotonic()
                try:
                    workspace, command, env = await asyncio.to_thread(self._command, execution, task, key, bridge)
                except OSError as exc:
                    return self._start_failed(execution, workspace, started, exc)
                entry, _ = await self.supervisor.spawn(name, command, env, workspace,
                                                       workspace.parent / "harness.log")
        else:
            self.attached[execution] = entry.pid
        self._supervised.add(execution)
        outcome, entry = await self._wait_supervised(execution, entry)
        self._supervised.discard(execution)
        return ExecutionResult(execution, outcome, entry.exit_code, workspace, entry.started_mono_s,
                               entry.ended_mono_s if entry.ended_mono_s is not None else time.monotonic(),
                               self.isolated)

    async def _wait_supervised(self, execution: int, entry) -> tuple[str, Any]:
        """Its outcome and final entry; killed at the harness timeout counted from its true start."""
        name = execution_id(execution)
        left = self.budgets.harness_timeout_s - (time.monotonic() - entry.started_mono_s)
        try:
            entry = await asyncio.wait_for(self.supervisor.wait(name), max(left, 0.0))
        except TimeoutError:
            entry = await self.supervisor.kill(name, self.budgets.grace_s)
            return ("cancelled" if execution in self._cancelled else "harness_timeout"), entry
        if execution in self._cancelled or entry.state == "lost":
            return "cancelled" if execution in self._cancelled else "failed", entry
        return ("completed" if entry.exit_code == 0 else "failed"), entry

    def _starting(self) -> asyncio.Lock:
        """This event loop's start lock (a runner may serve one loop after another, as the bridge does)."""
        loop = asyncio.get_running_loop()
        if self._start_lock is None or self._start_lock[0] is not loop:
            self._start_lock = (loop, asyncio.Lock())
        return self._start_lock[1]

    async def _started_bridge(self) -> HostBridge:
        """The host side of the sandbox bridge, started once per event loop (under a supervisor: its
        bridge service, which outlives this process as the harnesses do)."""
        if self.supervisor is not None:
            from gyre.real.supervisor.services import bridge_service

            async with self._starting():
                if self._supervised_bridge is None:
                    self._supervised_bridge = await asyncio.to_thread(bridge_service, self.supervisor, self.base_url)
            return self._supervised_bridge
        if self._bridge_start is None or self._bridge_start.get_loop() is not asyncio.get_running_loop():
            self._bridge = HostBridge(self.base_url)
            self._bridge_start = asyncio.ensure_future(self._bridge.start())
        await asyncio.shield(self._bridge_start)
        return self._bridge

    async def close(self) -> None:
        """Stop the sandbox bridge and remove its socket; call after the last run."""
        if self._bridge is not None:
            bridge, self._bridge, self._bridge_start = self._bridge, None, None
            await bridge.close()

    async def _wait(self, execution: int, proc: asyncio.subprocess.Process) -> str:
        try:
            await asyncio.wait_for(proc.wait(), self.budgets.harness_timeout_s)
        except TimeoutError:
            await self._kill(proc)
            return "cancelled" if execution in self._cancelled else "harness_timeout"
        if execution in self._cancelled:
            return "cancelled"
        return "completed" if proc.returncode == 0 else "failed"

    async def cancel(self, execution: int) -> None:
        """Cancel a running execution (oversampling surplus); its run() ends 'cancelled'."""
        proc = self._procs.get(execution)
        if proc is not None:
            self._cancelled.add(execution)
            await self._kill(proc)
        elif execution in self._supervised:
            self._cancelled.add(execution)
            await self.supervisor.kill(execution_id(execution), self.budgets.grace_s)

    async def stop_supervised(self, execution: int) -> None:
        """Stop the execution's harness if its supervisor still runs it (a resumed run's cancelled one)."""
        entry = await self.supervisor.status(execution_id(execution))
        if entry is not None and entry.state == "running":
            await self.supervisor.kill(execution_id(execution), self.budgets.grace_s)

    async def _kill(self, proc: asyncio.subprocess.Process) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                await asyncio.wait_for(proc.wait(), self.budgets.grace_s)
                return
            except TimeoutError:
                continue
