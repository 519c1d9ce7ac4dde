"""Publication from memory for real (``train.publish_memory``): a live SGLang CPU engine, gloo, no disk.

One engine for the module starts on a version-0 export. First the trainer (this
process) opens a weight-update group with it and broadcasts version 1's tensors
in buckets small enough to need several. Afterwards the engine's
log-probabilities equal a transformers forward pass of version 1 and differ
from version 0's: the engine really serves the tensors it received. A publisher
that was never opened is refused. Then a real core cell (``train.cell``, the
``publish`` command ``gyre run`` sends with ``publication = "memory"``) trains
and publishes two versions the same way, and the checkpoint it writes after
each swap is what the engine serves.
"""

from __future__ import annotations

import datetime

import pytest
import torch

try:
    from proxy_fixtures import free_port
    from test_train_publish import megatron_named
    from test_train_publish_sglang import FLAGS, engine_logprobs, reference_logprobs
except ImportError:
    from .proxy_fixtures import free_port
    from .test_train_publish import megatron_named
    from .test_train_publish_sglang import FLAGS, engine_logprobs, reference_logprobs

from gyre.real.engines.manager import EngineManager, EngineSpec, sglang_python
from gyre.real.train.model import ModelConfig
from gyre.real.train.publish import hf_state_dict, save_hf_checkpoint
from gyre.real.train.publish_memory import MemoryPublisher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420), pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.skipif(not sglang_python().exists(), reason="SGLang CPU venv not built")]
CFG = ModelConfig()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One SGLang CPU engine for the module (its start is most of the time), on a version-0 export."""
    tmp = tmp_path_factory.mktemp("memory-engine")
    v0 = save_hf_checkpoint(tmp / "ckpt", megatron_named(CFG, seed=0), CFG, 0)
    manager = EngineManager(tmp / "logs")
    engine = manager.launch(EngineSpec(engine_id="mem-0", model_path=str(v0), port=free_port(), extra_args=FLAGS))
    try:
        manager.wait_healthy("mem-0", timeout=180)
        yield manager, engine
    finally:
        manager.shutdown_all()


def test_the_engine_serves_the_tensors_broadcast_to_it(tmp_path, served):
    import torch.distributed as dist

    if not dist.is_initialized():  # the cell's default group; the update group is a second one beside it
        store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=30))
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    manager, engine = served
    v1_named = megatron_named(CFG, seed=1)
    v1 = save_hf_checkpoint(tmp_path / "ckpt", v1_named, CFG, 1)  # written only to compute the reference
    publisher = MemoryPublisher({engine.url: 1}, bucket_bytes=64 << 10, timeout=120.0)
    with pytest.raises(RuntimeError, match="before open"):
        publisher.publish([], 1)
    try:
        before = engine_logprobs(manager, "mem-0")
        publisher.open(torch.device("cpu"))
        tensors = list(hf_state_dict(v1_named, CFG).items())
        sent = publisher.publish(tensors, version=1)
        assert sent == sum(t.numel() * t.element_size() for _, t in tensors) > 4 * (64 << 10)
        after = engine_logprobs(manager, "mem-0")
        assert after == pytest.approx(reference_logprobs(v1), abs=2e-4)
        assert max(abs(a - b) for a, b in zip(after, before)) > 1e-2
        assert manager.weight_version("mem-0") == "1"
    finally:
        publisher.close()


def test_the_core_cell_publishes_from_memory_and_still_writes_the_checkpoint(tmp_path, served):
    """``publish`` with ``route = "memory"`` (what ``gyre run`` sends for ``publication = "memory"``): a real
    core cell process swaps two trained versions into the live engine over one group, nothing loaded from disk."""
    from gyre.real.toy.microsteps import feed, toy_batch
    from gyre.real.train.plane import PlaneConfig, TrainingPlane
    from gyre.real.train.state import OptimConfig

    manager, engine = served
    served_logprobs, answers = [engine_logprobs(manager, "mem-0")], []
    with TrainingPlane(PlaneConfig(cells=1, optim=OptimConfig(lr=5e-2)), tmp_path / "plane") as plane:
        plane.call(0, "enter_training")
        v0 = plane.call(0, "publish", version=10, endpoints=[], directory=str(tmp_path / "ckpt"), route="memory")
        for version in (11, 12):  # the second publication reuses the group the first opened
            feed(plane.queues, toy_batch(9, version - 11, 2))
            plane.call(0, "step", version=version - 11, final=True)
            answers.append(plane.call(0, "publish", version=version, endpoints=[engine.url],
                                      directory=str(tmp_path / "ckpt"), route="memory"))
            served_logprobs.append(engine_logprobs(manager, "mem-0"))
            assert manager.weight_version("mem-0") == str(version)
    assert [a["route"] for a in answers] == ["memory", "memory"] and all(a["answers"] == [] for a in answers)
    for i, answer in enumerate(answers, start=1):  # the checkpoint written after the swap holds what it serves
        assert answer["path"].endswith(f"v{10 + i:06d}") and answer["swap_s"] > 0 and answer["write_s"] > 0
        assert served_logprobs[i] == pytest.approx(reference_logprobs(answer["path"]), abs=2e-4)
        assert max(abs(a - b) for a, b in zip(served_logprobs[i], served_logprobs[i - 1])) > 1e-3
    assert v0["route"] == "disk"  # no engine to swap into: only the checkpoint
