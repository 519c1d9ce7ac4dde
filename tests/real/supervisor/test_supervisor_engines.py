"""SGLang engines launched through the run's supervisor (``supervisor.engines``): they outlive the driver.

With a real SGLang CPU engine on the tiny Qwen2 (one start): a stand-in driver
subprocess launches it through ``SupervisedEngines`` and is killed with SIGKILL;
the engine keeps answering ``/health_generate``; a new manager adopts it (same
pid and port) and loads weights into it through ``update_weights_from_disk``;
an engine adopted with its memory released gets it back; once the lease has
been expired for its grace, the supervisor stops the engine's whole group.

With stand-in servers (the manager's ``python``, no SGLang): a killed engine
is found by ``exited()`` and restarted through the supervisor on the same
port (its key started twice in the ledger); ``gyre stop RUN_DIR`` stops an
engine with the supervisor; an engine whose record says a release was cut, or
names another pid, is not adopted but stopped; a launch while the supervisor
runs the key stops the old process first. Whatever bytes an engine's record
holds, it is adopted only when every field matches (Hypothesis).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

try:
    from processes import group_members, wait_until
    from proxy_fixtures import build_tiny_qwen2, free_port, shared_tiny_dir
except ImportError:
    from ..processes import group_members, wait_until
    from ..proxy_fixtures import build_tiny_qwen2, free_port, shared_tiny_dir

from gyre.cli import main
from gyre.real.engines.manager import EngineManager, EngineSpec, sglang_python
from gyre.real.engines.record import read_record, unadoptable, write_record
from gyre.real.supervisor.client import LeaseRenewer, start_or_reuse
from gyre.real.supervisor.engines import SupervisedEngines
from gyre.real.supervisor.ledger import read_ledger

pytestmark = pytest.mark.timeout(240)
SMALL = ("--mem-fraction-static", "0.05", "--max-total-tokens", "16384", "--skip-server-warmup")

STAND_IN = """#!{python}
# a stand-in SGLang server: answers every route with success, on the --port it is given
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port = int(sys.argv[sys.argv.index("--port") + 1])


class Handler(BaseHTTPRequestHandler):
    def _answer(self):
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps({{"success": True, "weight_version": "stand-in"}}).encode())

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""

DRIVER = """
import sys, time
from pathlib import Path
from gyre.real.engines.manager import EngineManager, EngineSpec
from gyre.real.supervisor.client import SupervisorClient
from gyre.real.supervisor.engines import SupervisedEngines

folder, logs, model, port = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
manager = EngineManager(logs, launcher=SupervisedEngines(SupervisorClient.find(folder)))
engine = manager.launch(EngineSpec(engine_id="e0", model_path=model, port=port, extra_args={small!r}))
manager.wait_healthy(engine, timeout=180)
print(engine.process.pid, flush=True)
time.sleep(600)
"""


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health_generate", timeout=30) as response:
            return response.status == 200
    except OSError:
        return False


def _stand_in(tmp_path: Path) -> Path:
    path = tmp_path / "python"
    path.write_text(STAND_IN.format(python=sys.executable))
    path.chmod(0o755)
    return path


def _manager(logs: Path, client, python: Path | None = None) -> EngineManager:
    return EngineManager(logs, python=python, launcher=SupervisedEngines(client))


@pytest.mark.slow
@pytest.mark.skipif(not sglang_python().exists(), reason=f"SGLang CPU venv not found at {sglang_python()}")
def test_a_supervised_sglang_engine_outlives_its_driver_is_adopted_and_ends_with_the_lease(tmp_path_factory,
                                                                                            tmp_path):
    model = build_tiny_qwen2(shared_tiny_dir(tmp_path_factory, "tiny-qwen2"))
    client, _ = start_or_reuse(tmp_path / "supervisor", grace_s=1.0, lease_s=2.0)
    lease = LeaseRenewer(client, every_s=0.5).start()  # renewed here while the stand-in driver lives and dies
    logs, port = tmp_path / "engine-logs", free_port()
    driver = subprocess.Popen([sys.executable, "-c", DRIVER.format(small=SMALL), str(client.folder), str(logs),
                               str(model), str(port)], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(driver.stdout.readline())
        driver.send_signal(signal.SIGKILL)
        driver.wait(10)
        assert _healthy(f"http://127.0.0.1:{port}") and group_members(pid)  # it outlived the driver

        manager = _manager(logs, client)
        engine, why = manager.adopt(EngineSpec(engine_id="e0", model_path=str(model), port=0, extra_args=SMALL))
        assert engine is not None, why
        assert (engine.process.pid, engine.spec.port, engine.adopted) == (pid, port, True)
        manager.update_weights_from_disk("e0", model, weight_version="3")  # the resume's publish path
        assert manager.weight_version("e0") == "3"
        manager.release_memory("e0")  # a cell in training when its driver died: adopted with its memory back
        again, why = _manager(logs, client).adopt(engine.spec)
        assert again is not None and again.process.pid == pid, why
        assert json.loads((logs / "e0.state.json").read_text())["memory"] == "resident"
        assert _healthy(engine.url)

        lease.stop()  # no driver renews it: lease (2 s) + grace (1 s) later the supervisor stops the engine's group
        assert wait_until(lambda: not group_members(pid), 60.0)
        entry = read_ledger(client.folder / "ledger.jsonl")["engine-e0"]
        assert (entry.state, entry.killed, entry.starts) == ("ended", True, 1)
    finally:
        lease.stop()
        driver.kill()
        client.stop()


def test_a_dead_supervised_engine_is_restarted_through_the_supervisor_and_gyre_stop_ends_it(tmp_path):
    client, _ = start_or_reuse(tmp_path / "run" / "supervisor", grace_s=60.0)
    manager = _manager(tmp_path / "run" / "engine-logs", client, python=_stand_in(tmp_path))
    try:
        first = manager.launch(EngineSpec(engine_id="e0", model_path="/m", port=free_port()))
        manager.wait_healthy("e0", timeout=30)
        os.killpg(first.process.pid, signal.SIGKILL)
        assert wait_until(lambda: "e0" in manager.exited(), 10.0)
        assert manager.exited()["e0"] == -signal.SIGKILL
        second = manager.restart("e0", timeout=30)
        assert second.process.pid != first.process.pid and second.url == first.url and _healthy(second.url)
        assert read_ledger(client.folder / "ledger.jsonl")["engine-e0"].starts == 2

        assert main(["stop", str(tmp_path / "run")]) == 0  # gyre stop: the supervisor ends it with itself
        assert wait_until(lambda: not group_members(second.process.pid), 30.0)
        assert "e0" in manager.exited() and read_ledger(client.folder / "ledger.jsonl")["engine-e0"].killed
    finally:
        client.stop()


@pytest.mark.parametrize("damage", ["memory", "pid"])
def test_an_engine_whose_record_cannot_be_trusted_is_stopped_not_adopted(tmp_path, damage):
    client, _ = start_or_reuse(tmp_path / "supervisor", grace_s=60.0)
    logs, python = tmp_path / "engine-logs", _stand_in(tmp_path)
    try:
        engine = _manager(logs, client, python).launch(EngineSpec(engine_id="e0", model_path="/m", port=free_port()))
        assert wait_until(lambda: _healthy(engine.url), 30.0)
        record = json.loads((logs / "e0.state.json").read_text())
        record.update(memory="releasing") if damage == "memory" else record.update(pid=record["pid"] + 1)
        (logs / "e0.state.json").write_text(json.dumps(record))
        adopted, why = _manager(logs, client, python).adopt(engine.spec)
        assert adopted is None and ("unknown" if damage == "memory" else "record names pid") in why, why
        assert not group_members(engine.process.pid)
        assert read_ledger(client.folder / "ledger.jsonl")["engine-e0"].killed  # a driver's stop, not its own end
        relaunched = _manager(logs, client, python).launch(engine.spec)  # what the resumed job does next
        assert wait_until(lambda: _healthy(relaunched.url), 30.0)
    finally:
        client.stop()


def test_a_launch_never_attaches_to_the_engine_the_supervisor_runs(tmp_path):
    client, _ = start_or_reuse(tmp_path / "supervisor", grace_s=60.0)
    logs, python = tmp_path / "engine-logs", _stand_in(tmp_path)
    spec = EngineSpec(engine_id="e0", model_path="/m", port=free_port())
    try:
        old = _manager(logs, client, python).launch(spec)
        assert wait_until(lambda: _healthy(spec.url), 30.0)
        new = _manager(logs, client, python).launch(spec)
        assert new.process.pid != old.process.pid and not group_members(old.process.pid)
        assert wait_until(lambda: _healthy(spec.url), 30.0)
        assert read_ledger(client.folder / "ledger.jsonl")["engine-e0"].starts == 2
    finally:
        client.stop()


GOOD = {"pid": 1, "port": 5, "host": "127.0.0.1", "model_path": "/m", "cpu": True, "extra_args": [],
        "memory": "resident"}
VALUES = st.one_of(st.none(), st.integers(0, 2), st.text(max_size=5), st.booleans(), st.lists(st.text(max_size=3)),
                   st.sampled_from(["/m", "127.0.0.1", True, 1.0, 1, ()]))
MEMORY = st.sampled_from(["resident", "released", "releasing", "resuming", "", 0])
DAMAGED = st.builds(lambda changes, dropped, memory: json.dumps({k: v for k, v in {**GOOD, "memory": memory,
                                                                                   **changes}.items()
                                                                 if k not in dropped}).encode(),
                    st.dictionaries(st.sampled_from(sorted(GOOD)), VALUES, max_size=2),
                    st.sets(st.sampled_from(sorted(GOOD)), max_size=1), MEMORY)


@settings(max_examples=300, deadline=None)
@given(raw=st.one_of(st.binary(max_size=200), DAMAGED))
@example(raw=json.dumps({**GOOD, "pid": True}).encode())  # equal to 1 in Python, not in JSON
@example(raw=json.dumps({**GOOD, "cpu": 1}).encode())
@example(raw=json.dumps({**GOOD, "memory": "releasing"}).encode())
def test_a_damaged_record_is_never_adopted_by_accident(tmp_path_factory, raw):
    """Whatever ``ID.state.json`` holds (any bytes, a good record with fields changed or dropped), it reads as a
    dict, and a running engine is adoptable only if every field matches but the port and its memory is settled."""
    logs = tmp_path_factory.mktemp("record")
    (logs / "e0.state.json").write_bytes(raw)
    record = read_record(logs, "e0")
    spec = EngineSpec(engine_id="e0", model_path="/m", port=9)
    matches = record.get("memory") in ("resident", "released") and all(
        record.get(k) == GOOD[k] and type(record.get(k)) is type(GOOD[k])
        for k in ("pid", "host", "model_path", "cpu", "extra_args"))
    assert isinstance(record, dict) and (unadoptable(record, 1, spec) is None) == matches, record
    write_record(logs, "e0", 1, spec, "released")
    assert unadoptable(read_record(logs, "e0"), 1, spec) is None
