"""SGLang engine manager for the real runtime: launch, probe, steer and stop engines.

Each engine is one ``python -m sglang.launch_server`` process started from the
SGLang virtualenv (``.venv-sglang``, or ``GYRE_SGLANG_PYTHON``) in its own
process group, bound to 127.0.0.1 only, with stdout and stderr in a log file.
With ``cpu=True`` it gets the CPU engine flags of docs/cpu-stack.md,
``SGLANG_USE_CPU_ENGINE=1`` and the import shims of ``tools/shims`` on
PYTHONPATH.

Endpoints and bodies follow SGLang 0.5.23 ``srt/entrypoints/http_server.py``
and ``srt/managers/io_struct.py``:

* ``GET /health_generate`` (``/health`` shares the handler): 200 once a one-token
  generation ran, 503 while starting;
* ``POST /release_memory_occupation`` / ``/resume_memory_occupation`` with
  ``{"tags": [...]}`` (None = all; SGLang knows ``weights`` and ``kv_cache``);
* ``POST /update_weights_from_disk`` with ``model_path``, ``weight_version``,
  ``abort_all_requests``; answers ``{"success", "message", ...}``, 400 on failure;
* ``POST /abort_request`` with ``{"rid": ...}`` or ``{"abort_all": true}``;
* ``POST /pause_generation`` ``{"mode": "abort"|"retract"|"in_place"}``,
  ``POST /continue_generation``;
* ``POST /flush_cache?timeout=T``: waits up to T s for the scheduler to be
  fully idle, then flushes the radix cache (200), else 400 (see ``quiesce``);
* the weight version is ``weight_version`` of ``GET /model_info`` (0.5.23 has
  no ``/get_weight_version`` route).

An engine that dies on its own (crash, OOM kill, signal) is found by
``exited()`` and brought back by ``restart``: what is left of its process
group is killed, the same spec is launched again (same port, so the proxy's
engine entry stays valid), and once healthy it loads the weights it should
serve (the newest published checkpoint). While it is down the proxy moves
its calls to a live engine (``proxy.generation``: an engine failure reroutes
the execution).

Invariants: every error names the engine; a call to an engine whose process
has exited raises ``EngineError`` with its exit code and log tail instead of a
bare connection error; ``shutdown`` kills the whole process group (SIGTERM,
then SIGKILL) and is idempotent; ``exited`` lists exactly the engines whose
process ended without ``shutdown``; ``restart`` refuses an engine that is
still running or was shut down, and keeps the dead process's log beside the
new one (``ID.log.N``); no address other than 127.0.0.1 is used (on a cluster: the
node's own); an engine's
process group ends with the process that launched it (the job, its node agent,
or the run's supervisor), even one killed by SIGKILL (``engines.reaper`` leads
the group, armed with ``runtime.lifetime.die_with_parent``).

On a Ray cluster (``cluster.placement``, given as ``launcher``) an engine is
started by the node agent of its cell's placement group, with this module's
command line and environment, and binds its node's address (``EngineSpec.host``);
the manager drives it through a handle with the ``subprocess.Popen`` calls used
here, and signals its process group through the agent. Without a launcher
everything stays on 127.0.0.1. Alone, a run's engines are launched by its
supervisor (``supervisor.engines.SupervisedEngines`` as ``launcher``: the same
reaper command line, environment and log), so they outlive the job, and a
resumed job's manager ``adopt``s each one the supervisor still runs.

Adoption: ``ID.state.json`` beside each log (``engines.record``) holds the
engine's pid, spec and memory state, written before and after each release
and resume. ``adopt(spec)`` takes the engine only if that record names the
running process, the spec matches but for the port (the record's is used)
and its memory is known; its memory is resumed if released,
and it must answer ``/health_generate``. Anything else stops it, and it is
launched afresh. Its weights are never assumed: the caller loads the version
it needs. ``detach_all`` stops watching the engines the launcher keeps past the
job (it has ``running_engine``) and leaves them running (a failed job: the next
attempt adopts them).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gyre.real.engines.record import read_record, unadoptable, write_record
from gyre.real.runtime.lifetime import die_with_parent

ROOT = Path(__file__).resolve().parents[2]  # the repository: real/engines/manager.py -> ../../
HOST = "127.0.0.1"


CPU_ARGS = ("--device", "cpu", "--attention-backend", "torch_native", "--sampling-backend", "pytorch",
            "--grammar-backend", "none", "--disable-cuda-graph", "--dtype", "float32")
LOG_TAIL_CHARS = 3000


class EngineError(RuntimeError):
    """An engine failed to start, answered with an error, or is dead; the message names it."""


def sglang_python() -> Path:
    """The interpreter of the SGLang virtualenv (``GYRE_SGLANG_PYTHON`` overrides)."""
    return Path(os.environ.get("GYRE_SGLANG_PYTHON", ROOT / ".venv-sglang" / "bin" / "python"))


@dataclass(frozen=True, kw_only=True)
class EngineSpec:
    """What to launch: one SGLang server on ``host``:``port`` (127.0.0.1 unless placed on a cluster)."""

    engine_id: str
    model_path: str
    port: int
    cpu: bool = True
    extra_args: tuple[str, ...] = ()
    host: str = HOST  # on a Ray cluster: its node's address (``cluster.placement``), never 0.0.0.0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass
class Engine:
    """A launched engine: its spec, process (leader of its own group) and log file."""

    spec: EngineSpec
    process: subprocess.Popen
    log_path: Path
    stopped: bool = field(default=False)
    restarts: int = 0
    adopted: bool = False  # a resumed job took it running from the supervisor (``EngineManager.adopt``)

    @property
    def engine_id(self) -> str:
        return self.spec.engine_id

    @property
    def url(self) -> str:
        return self.spec.url

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError as exc:
            return f"<log {self.log_path} unreadable: {exc}>"


def launch_command(spec: EngineSpec, python: Path) -> list[str]:
    """The argv that starts ``spec`` (pure; tests and logs can show it)."""
    args = [str(python), "-m", "sglang.launch_server", "--model-path", str(spec.model_path),
            "--host", spec.host, "--port", str(spec.port),
            "--incremental-streaming-output"]  # chunks hold only new tokens: the proxy's work stays linear
    if spec.cpu:
        args += list(CPU_ARGS)
    return args + list(spec.extra_args)


def reaped_command(spec: EngineSpec, python: Path) -> list[str]:
    """``launch_command`` under the reaper, which leads its process group and ends all of it (``engines.reaper``)."""
    return [sys.executable, "-m", "gyre.real.engines.reaper", "--"] + launch_command(spec, python)


def launch_env(spec: EngineSpec) -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    if spec.cpu:
        shims = str(ROOT / "tools" / "shims")
        env["SGLANG_USE_CPU_ENGINE"] = "1"
        # a CPU engine has no GPU work to let settle nor CUDA core to dump: without these SGLang sleeps 5 s
        # before exiting whenever a child ends first, as on every stop (SIGTERM reaches the whole group)
        env.setdefault("SGLANG_PYSPY_DUMP_BEFORE_CRASH", "0")
        env.setdefault("SGLANG_CUDA_COREDUMP_BEFORE_CRASH", "0")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (shims, os.environ.get("PYTHONPATH", "")) if p)
    return env


class EngineManager:
    """Owns the engines it launched; every method takes an ``Engine`` or its id."""

    def __init__(self, log_dir: str | os.PathLike, *, python: str | os.PathLike | None = None,
                 request_timeout: float = 120.0, launcher=None) -> None:
        self.log_dir = Path(log_dir)
        self.launcher = launcher  # None: engines start here; else ``cluster.placement.Placement`` (start_engine)
        self.python = Path(python) if python else sglang_python()
        self.request_timeout = request_timeout
        self.engines: dict[str, Engine] = {}

    # ---- lifecycle -------------------------------------------------------------------
    def launch(self, spec: EngineSpec) -> Engine:
        """Start the server process (does not wait; see ``wait_healthy``)."""
        if spec.engine_id in self.engines and not self.engines[spec.engine_id].stopped:
            raise EngineError(f"engine {spec.engine_id!r} is already running")
        if not self.python.exists():
            raise EngineError(f"engine {spec.engine_id!r}: SGLang interpreter {self.python} not found "
                              "(run tools/setup_sglang_cpu.sh)")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{spec.engine_id}.log"
        if self.launcher is not None:  # its node's agent, or the run's supervisor, with this module's command line
            process = self.launcher.start_engine(spec, self.python, log_path)
        else:
            with open(log_path, "w") as sink:  # the reaper ends the engine's whole group with the job
                process = subprocess.Popen(reaped_command(spec, self.python), stdout=sink, stderr=subprocess.STDOUT,
                                           env=launch_env(spec), start_new_session=True, preexec_fn=die_with_parent)
        engine = self.engines[spec.engine_id] = Engine(spec, process, log_path)
        self._record(engine, "resident")
        return engine

    def adopt(self, spec: EngineSpec, timeout: float = 60.0) -> tuple[Engine | None, str]:
        """The engine the launcher still runs under ``spec.engine_id``, healthy, on its recorded port (module
        docstring); else None, with why (one it runs but cannot be adopted is stopped first)."""
        running = getattr(self.launcher, "running_engine", None)
        handle = running(spec.engine_id) if running is not None else None
        if handle is None:
            return None, "not running"
        record = read_record(self.log_dir, spec.engine_id)
        engine = Engine(replace(spec, port=int(record.get("port", spec.port))), handle,
                        self.log_dir / f"{spec.engine_id}.log", adopted=True)
        why = unadoptable(record, handle.pid, spec)
        if why is None:
            try:
                if record["memory"] == "released":
                    self.resume_memory(engine)
                self.wait_healthy(engine, timeout)
                self.engines[spec.engine_id] = engine
                self._record(engine, "resident")
                return engine, f"adopted (pid {handle.pid}, {engine.url})"
            except EngineError as exc:
                why = f"not healthy: {exc}"
        self._stop([engine], grace_s=10.0)
        return None, f"pid {handle.pid} stopped: {why}"

    def detach_all(self) -> list[str]:
        """Stop watching every engine the launcher can hand to a later job (``adopt``), leaving it running."""
        if not hasattr(self.launcher, "running_engine"):
            return []
        kept = [name for name, engine in self.engines.items() if not engine.stopped and engine.process.poll() is None]
        for name in kept:
            self.engines[name].stopped = True
        return kept

    def wait_healthy(self, engine: Engine | str, timeout: float = 180.0) -> None:
        """Poll ``/health_generate`` until 200; raise naming the engine, with the log tail."""
        engine = self._get(engine)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive(engine)
            try:
                with urllib.request.urlopen(engine.url + "/health_generate", timeout=10) as response:
                    if response.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.5)
        raise EngineError(f"engine {engine.engine_id!r} not healthy after {timeout:.0f} s at {engine.url}; "
                          f"log tail ({engine.log_path}):\n{engine.log_tail()}")

    def shutdown(self, engine: Engine | str, grace_s: float = 20.0) -> None:
        """Kill the engine's process group (SIGTERM, SIGKILL after ``grace_s``); idempotent."""
        self._stop([self._get(engine)], grace_s)

    def _stop(self, engines: list[Engine], grace_s: float) -> None:
        """SIGTERM every group at once, then wait for each (SIGKILL a group still running after ``grace_s``)."""
        engines = [e for e in engines if not e.stopped]
        for engine in engines:
            engine.stopped = True
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            signalled = []
            for engine in engines:
                try:
                    _signal_group(engine.process, sig)
                    signalled.append(engine)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            engines = []
            for engine in signalled:
                try:
                    engine.process.wait(max(0.0, deadline - time.monotonic()))
                    _reap_group(engine.process, sig)
                except subprocess.TimeoutExpired:
                    engines.append(engine)
            if not engines:
                return

    def exited(self) -> dict[str, int]:
        """Engines whose process ended without ``shutdown``: id -> exit code (negative: the signal)."""
        return {name: code for name, engine in self.engines.items()
                if not engine.stopped and (code := engine.process.poll()) is not None}

    def restart(self, engine: Engine | str, *, timeout: float = 180.0,
                weights: tuple[str | os.PathLike, str] | None = None) -> Engine:
        """Relaunch a dead engine with its spec, wait until healthy, then load ``weights`` = (path, version)."""
        old = self._get(engine)
        if old.stopped:
            raise EngineError(f"engine {old.engine_id!r} was shut down; launch it instead of restarting it")
        code = old.process.poll()
        if code is None:
            raise EngineError(f"engine {old.engine_id!r} is still running (pid {old.process.pid}); "
                              "only a dead engine is restarted")
        _reap_group(old.process, signal.SIGKILL)  # its scheduler/detokenizer may outlive the leader
        kept = old.log_path.with_name(f"{old.log_path.name}.{old.restarts + 1}")
        old.log_path.replace(kept)
        old.stopped = True
        new = self.launch(old.spec)
        new.restarts = old.restarts + 1
        try:
            self.wait_healthy(new, timeout)
        except EngineError as exc:
            raise EngineError(f"engine {old.engine_id!r} (exit code {code}, log {kept}) did not come back: "
                              f"{exc}") from None
        if weights is not None:
            self.update_weights_from_disk(new, weights[0], weight_version=weights[1])
        return new

    def shutdown_all(self, grace_s: float = 20.0) -> None:
        """``shutdown`` of every engine, in parallel: one grace period in all, not one per engine."""
        self._stop(list(self.engines.values()), grace_s)

    # ---- control endpoints -------------------------------------------------------------
    def release_memory(self, engine: Engine | str, tags: list[str] | None = None) -> Any:
        self._record(self._get(engine), "releasing")
        answer = self._post(engine, "/release_memory_occupation", {"tags": tags})
        self._record(self._get(engine), "released")
        return answer

    def resume_memory(self, engine: Engine | str, tags: list[str] | None = None) -> Any:
        self._record(self._get(engine), "resuming")
        answer = self._post(engine, "/resume_memory_occupation", {"tags": tags})
        self._record(self._get(engine), "resident")
        return answer

    def update_weights_from_disk(self, engine: Engine | str, path: str | os.PathLike, *,
                                 weight_version: str | None = None, abort_all_requests: bool = False) -> Any:
        """Load new weights in place; ``success: false`` from SGLang raises ``EngineError``."""
        body = {"model_path": str(path), "weight_version": weight_version, "abort_all_requests": abort_all_requests}
        result = self._post(engine, "/update_weights_from_disk", body)
        if not (isinstance(result, dict) and result.get("success")):
            raise EngineError(f"engine {self._get(engine).engine_id!r}: update_weights_from_disk({path}) "
                              f"failed: {result}")
        return result

    def abort(self, engine: Engine | str, rid: str | None = None) -> None:
        """Abort one request by ``rid``, or every request when ``rid`` is None."""
        self._post(engine, "/abort_request", {"abort_all": True} if rid is None else {"rid": rid})

    def pause(self, engine: Engine | str, mode: str = "abort") -> Any:
        if mode not in ("abort", "retract", "in_place"):
            raise ValueError(f"pause mode must be abort, retract or in_place, got {mode!r}")
        return self._post(engine, "/pause_generation", {"mode": mode})

    def quiesce(self, engine: Engine | str, timeout: float = 60.0) -> None:
        """Abort whatever still runs on the engine and return once it is fully idle.

        SGLang asserts full idleness in ``release_memory_occupation`` (no
        running or waiting request *and* the last batch cleared, which happens
        only on the scheduler's next idle pass), so a release right after the
        last request can kill the engine. ``abort_all`` ends every request
        still there (for instance one whose client moved to another engine);
        ``/flush_cache?timeout=`` is SGLang's own idleness wait: the scheduler
        answers once it sees itself fully idle, and the flush clears the last
        batch. Both go through the scheduler's one ordered input, so a release
        sent afterwards finds it idle (the caller keeps new work away, e.g. by
        draining the engine in the proxy). Raises ``EngineError`` naming the
        engine when it is not idle within ``timeout`` seconds.
        """
        self.abort(engine)
        try:
            self._request(engine, "POST", f"/flush_cache?timeout={timeout:g}", None)
        except EngineError as exc:
            raise EngineError(f"engine {self._get(engine).engine_id!r} not idle within {timeout:g} s "
                              f"after abort_all: {exc}") from None

    def resume_generation(self, engine: Engine | str) -> Any:
        return self._post(engine, "/continue_generation", {"torch_empty_cache": not self._get(engine).spec.cpu})

    def weight_version(self, engine: Engine | str) -> str | None:
        return self._request(engine, "GET", "/model_info", None).get("weight_version")

    def generate(self, engine: Engine | str, body: dict) -> Any:
        """``POST /generate`` (non-streaming); for probes and tests, not the rollout path."""
        return self._post(engine, "/generate", body)

    # ---- plumbing ----------------------------------------------------------------------
    def _record(self, engine: Engine, memory: str) -> None:
        write_record(self.log_dir, engine.engine_id, engine.process.pid, engine.spec, memory)

    def _get(self, engine: Engine | str) -> Engine:
        if isinstance(engine, Engine):
            return engine
        try:
            return self.engines[engine]
        except KeyError:
            raise EngineError(f"unknown engine {engine!r} (known: {sorted(self.engines)})") from None

    def _check_alive(self, engine: Engine) -> None:
        if engine.stopped:
            raise EngineError(f"engine {engine.engine_id!r} was shut down")
        code = engine.process.poll()
        if code is not None:
            raise EngineError(f"engine {engine.engine_id!r} exited with code {code}; "
                              f"log tail ({engine.log_path}):\n{engine.log_tail()}")

    def _post(self, engine: Engine | str, path: str, body: dict) -> Any:
        return self._request(engine, "POST", path, body)

    def _request(self, engine: Engine | str, method: str, path: str, body: dict | None) -> Any:
        engine = self._get(engine)
        self._check_alive(engine)
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(engine.url + path, data=data, method=method,
                                         headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.request_timeout) as response:
                return _decode(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:500].decode(errors="replace")
            raise EngineError(f"engine {engine.engine_id!r}: {method} {path} -> HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            self._check_alive(engine)
            raise EngineError(f"engine {engine.engine_id!r}: {method} {path} failed: {exc}") from exc


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return raw.decode(errors="replace")


def _signal_group(process: Any, sig: int) -> None:
    """Signal an engine's process group: here, or through its node agent (``cluster.placement.RemoteProcess``)."""
    if hasattr(process, "signal_group"):
        process.signal_group(sig)
    else:
        os.killpg(process.pid, sig)


def _reap_group(process: Any, sig: int) -> None:
    """After the leader exits, kill any children left in its group (scheduler, detokenizer)."""
    try:
        _signal_group(process, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
