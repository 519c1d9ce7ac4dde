"""The SGLang engine manager against a real SGLang CPU engine on a tiny Qwen2.

One engine is launched on the tiny random Qwen2 of ``proxy_fixtures`` (built
locally, nothing downloaded) and driven through its whole control surface:
greedy ``/generate`` with ``input_ids`` and ``return_logprob``, memory release
and resume, pause and continue, a release racing a running generation
(``quiesce``: the generation ends aborted, the engine survives and answers as
before), an in-place weight update from a perturbed copy saved with
transformers (logprobs of the same tokens must change, and the weight version
must move), abort_all, shutdown (the process group is gone and
later calls name the dead engine). A launch on a missing model path must fail
naming the engine and showing the log tail. Skipped, with the reason, when
the SGLang virtualenv is absent. Without SGLang: ``shutdown_all`` stops
engines in parallel (three stand-in servers that take a second to stop all
get their SIGTERM before the first has exited), and a CPU engine's
environment turns off SGLang's 5 s crash-diagnostics sleep on exit.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest

try:
    from processes import wait_until
    from proxy_fixtures import build_tiny_qwen2, free_port, shared_tiny_dir
except ImportError:
    from ..processes import wait_until
    from .proxy_fixtures import build_tiny_qwen2, free_port, shared_tiny_dir

from gyre.real.engines.manager import EngineError, EngineManager, EngineSpec, launch_command, launch_env, sglang_python

SGLANG_PYTHON = sglang_python()
SMALL = ("--mem-fraction-static", "0.05", "--max-total-tokens", "32768", "--skip-server-warmup")
NO_VENV = f"SGLang CPU venv not found at {SGLANG_PYTHON} (run tools/setup_sglang_cpu.sh)"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.skipif(not SGLANG_PYTHON.exists(), reason=NO_VENV)]
PROMPT = [1, 5, 17, 42, 99, 7, 300, 12]


def _perturbed_copy(model: Path, out: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    shutil.copytree(model, out)
    weights = AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch.float32)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in weights.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    weights.save_pretrained(out, safe_serialization=True)
    return out


def _greedy(manager: EngineManager, engine: str) -> tuple[list[int], list[float]]:
    body = {"input_ids": PROMPT, "return_logprob": True,
            "sampling_params": {"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True}}
    meta = manager.generate(engine, body)["meta_info"]
    pairs = meta["output_token_logprobs"]
    return [p[1] for p in pairs], [p[0] for p in pairs]


def _scored(manager: EngineManager, engine: str, ids: list[int]) -> list[float]:
    """Teacher-forced logprobs of ``ids`` (positions 1..) under the engine's current weights."""
    body = {"input_ids": ids, "return_logprob": True, "logprob_start_len": 0,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
    pairs = manager.generate(engine, body)["meta_info"]["input_token_logprobs"]
    return [p[0] for p in pairs if p[0] is not None]


def _running_requests(manager: EngineManager, engine: str) -> int:
    return sum(load.get("num_running_reqs", 0) for load in manager._request(engine, "GET", "/v1/loads", None)["loads"])


def _release_under_a_running_generation(manager: EngineManager, engine: str) -> dict:
    """quiesce + release while a long generation is decoding (the race a fixed sleep used to hide)."""
    answers: list = []
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 3000, "temperature": 0.0, "ignore_eos": True}}
    worker = threading.Thread(target=lambda: answers.append(manager.generate(engine, body)))
    worker.start()
    deadline = time.monotonic() + 30
    while _running_requests(manager, engine) == 0:
        assert time.monotonic() < deadline, "the long generation never started running"
        time.sleep(0.02)
    manager.quiesce(engine)
    manager.release_memory(engine)  # SGLang asserts full idleness here; a crash kills the engine
    manager.resume_memory(engine)
    worker.join(60)
    assert answers, "the aborted generation never answered"
    return answers[0]["meta_info"]["finish_reason"]


def test_launch_command_binds_loopback_with_cpu_flags():
    spec = EngineSpec(engine_id="e0", model_path="/m", port=1234, extra_args=("--x",))
    argv = launch_command(spec, Path("/py"))
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and "--disable-cuda-graph" in argv and argv[-1] == "--x"
    assert "--device" not in launch_command(EngineSpec(engine_id="g", model_path="/m", port=1, cpu=False), Path("/py"))


def test_a_cpu_engine_exits_without_the_crash_diagnostics_sleep(monkeypatch):
    monkeypatch.delenv("SGLANG_PYSPY_DUMP_BEFORE_CRASH", raising=False)
    cpu = launch_env(EngineSpec(engine_id="e0", model_path="/m", port=1))
    assert cpu["SGLANG_PYSPY_DUMP_BEFORE_CRASH"] == cpu["SGLANG_CUDA_COREDUMP_BEFORE_CRASH"] == "0"
    assert "SGLANG_PYSPY_DUMP_BEFORE_CRASH" not in launch_env(EngineSpec(engine_id="g", model_path="/m", port=1,
                                                                         cpu=False))
    monkeypatch.setenv("SGLANG_PYSPY_DUMP_BEFORE_CRASH", "1")  # the user's own setting wins
    assert launch_env(EngineSpec(engine_id="e0", model_path="/m", port=1))["SGLANG_PYSPY_DUMP_BEFORE_CRASH"] == "1"


def test_shutdown_all_stops_the_engines_in_parallel(tmp_path):
    """Stand-in servers (the manager's ``python``) that take 1 s to stop once signalled (and ignore the
    reaper's second SIGTERM to the group): with one grace period for all, every one has its SIGTERM
    before the first has exited."""
    journal = tmp_path / "journal"
    stand_in = tmp_path / "python"
    stand_in.write_text(f"""#!/bin/bash
trap 'trap "" TERM; echo "term $$" >> {journal}; sleep 1; echo "exit $$" >> {journal}; exit 0' TERM
echo "up $$" >> {journal}
while true; do sleep 0.1; done
""")
    stand_in.chmod(0o755)
    manager = EngineManager(tmp_path / "logs", python=stand_in)
    engines = [manager.launch(EngineSpec(engine_id=f"e{i}", model_path="/m", port=free_port())) for i in range(3)]
    try:
        assert wait_until(lambda: journal.exists() and journal.read_text().count("up ") == 3, 30.0)
    finally:
        manager.shutdown_all()
    events = [line.split()[0] for line in journal.read_text().splitlines()]
    assert events.count("term") == events.count("exit") == 3, events
    assert events.index("exit") > max(i for i, e in enumerate(events) if e == "term"), events
    assert all(e.process.poll() is not None and e.stopped for e in engines)
    manager.shutdown_all()  # idempotent


def test_engine_lifecycle_on_real_sglang(tmp_path_factory):
    model = build_tiny_qwen2(shared_tiny_dir(tmp_path_factory, "tiny-qwen2"))
    perturbed = _perturbed_copy(model, tmp_path_factory.mktemp("perturbed") / "model")
    manager = EngineManager(tmp_path_factory.mktemp("engine-logs"))
    spec = EngineSpec(engine_id="rollout-0", model_path=str(model), port=free_port(), extra_args=SMALL)
    engine = manager.launch(spec)
    try:
        manager.wait_healthy("rollout-0", timeout=180)
        tokens, before = _greedy(manager, "rollout-0")
        assert len(tokens) == 4 and all(lp <= 0 for lp in before)

        manager.release_memory("rollout-0")
        manager.resume_memory("rollout-0")
        manager.pause("rollout-0")
        manager.resume_generation("rollout-0")
        assert _greedy(manager, "rollout-0") == (tokens, before)

        finish = _release_under_a_running_generation(manager, "rollout-0")
        assert finish["type"] == "abort", finish
        assert _greedy(manager, "rollout-0") == (tokens, before)
        scored = _scored(manager, "rollout-0", PROMPT + tokens)
        assert scored[-4:] == pytest.approx(before, abs=1e-4)

        result = manager.update_weights_from_disk("rollout-0", perturbed, weight_version="v1")
        assert result["success"] and manager.weight_version("rollout-0") == "v1"
        after = _scored(manager, "rollout-0", PROMPT + tokens)
        assert len(after) == len(scored)
        assert max(abs(a - b) for a, b in zip(after, scored)) > 1e-3, "logprobs unchanged by the update"

        manager.abort("rollout-0")
        manager.abort("rollout-0", rid="no-such-request")
    finally:
        manager.shutdown_all()
    assert engine.process.poll() is not None
    with pytest.raises(EngineError, match="rollout-0"):
        manager.weight_version("rollout-0")


def test_launch_on_missing_model_names_engine_and_log(tmp_path):
    manager = EngineManager(tmp_path / "logs")
    spec = EngineSpec(engine_id="broken-7", model_path=str(tmp_path / "nope"), port=free_port(), extra_args=SMALL)
    manager.launch(spec)
    try:
        with pytest.raises(EngineError) as info:
            manager.wait_healthy("broken-7", timeout=120)
    finally:
        manager.shutdown_all()
    message = str(info.value)
    assert "broken-7" in message and "exited with code" in message and "log tail" in message
    assert "nope" in message, message[-800:]
