"""Publication from memory for real (``train.publish_memory``): a live SGLang CPU engine, gloo, no disk.

The engine starts on a version-0 export; the trainer (this process) opens a
weight-update group with it and broadcasts version 1's tensors in buckets
small enough to need several. Afterwards the engine's log-probabilities equal a
transformers forward pass of version 1 and differ from version 0's: the engine
really serves the tensors it received. A publisher that was never opened is
refused.
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


def test_the_engine_serves_the_tensors_broadcast_to_it(tmp_path):
    import torch.distributed as dist

    if not dist.is_initialized():  # the cell's default group; the update group is a second one beside it
        store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=30))
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    v0 = save_hf_checkpoint(tmp_path / "ckpt", megatron_named(CFG, seed=0), CFG, 0)
    v1_named = megatron_named(CFG, seed=1)
    v1 = save_hf_checkpoint(tmp_path / "ckpt", v1_named, CFG, 1)  # written only to compute the reference
    manager = EngineManager(tmp_path / "logs")
    engine = manager.launch(EngineSpec(engine_id="mem-0", model_path=str(v0), port=free_port(), extra_args=FLAGS))
    publisher = MemoryPublisher({engine.url: 1}, bucket_bytes=64 << 10, timeout=120.0)
    with pytest.raises(RuntimeError, match="before open"):
        publisher.publish([], 1)
    try:
        manager.wait_healthy("mem-0", timeout=180)
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
        manager.shutdown_all()
