"""Publication for real: Megatron-layout weights exported and loaded by a live SGLang CPU engine.

The engine starts on a checkpoint written by ``save_hf_checkpoint`` from
tensors under Megatron's names and shapes (``train.model`` tests check that
this export reproduces Megatron's logits), then ``publish_from_disk`` moves it
to a second version. After the update the engine's log-probabilities must
equal a transformers forward pass of the new checkpoint and differ from the
old ones: the CPU engine really serves the published weights.
"""

from __future__ import annotations

import pytest
import torch

try:
    from proxy_fixtures import free_port
    from test_train_publish import megatron_named
except ImportError:
    from .proxy_fixtures import free_port
    from .test_train_publish import megatron_named

from gyre.real.engines.manager import EngineManager, EngineSpec, sglang_python
from gyre.real.train.model import ModelConfig
from gyre.real.train.publish import PublishError, publish_from_disk, save_hf_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.skipif(not sglang_python().exists(), reason="SGLang CPU venv not built")]
CFG = ModelConfig()
PROMPT = [3, 17, 42, 99, 7, 200, 12, 5]
FLAGS = ("--skip-tokenizer-init", "--mem-fraction-static", "0.05", "--max-total-tokens", "4096",
         "--skip-server-warmup")


def engine_logprobs(manager: EngineManager, engine: str) -> list[float]:
    body = {"input_ids": PROMPT, "return_logprob": True, "logprob_start_len": 0,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
    pairs = manager.generate(engine, body)["meta_info"]["input_token_logprobs"]
    return [p[0] for p in pairs if p[0] is not None]


def reference_logprobs(checkpoint) -> list[float]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, torch_dtype=torch.float32).eval()
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, :-1], dim=-1)
    return logp.gather(1, ids[0, 1:, None])[:, 0].tolist()


def test_published_checkpoint_is_what_the_engine_serves(tmp_path):
    v0 = save_hf_checkpoint(tmp_path / "ckpt", megatron_named(CFG, seed=0), CFG, 0)
    v1 = save_hf_checkpoint(tmp_path / "ckpt", megatron_named(CFG, seed=1), CFG, 1)
    manager = EngineManager(tmp_path / "logs")
    spec = EngineSpec(engine_id="rollout-0", model_path=str(v0), port=free_port(), extra_args=FLAGS)
    engine = manager.launch(spec)
    try:
        manager.wait_healthy("rollout-0", timeout=180)
        before = engine_logprobs(manager, "rollout-0")
        assert before == pytest.approx(reference_logprobs(v0), abs=2e-4)
        answers = publish_from_disk([engine.url], v1, version=1)
        assert answers[0]["success"] is True
        after = engine_logprobs(manager, "rollout-0")
        assert after == pytest.approx(reference_logprobs(v1), abs=2e-4)
        assert max(abs(a - b) for a, b in zip(after, before)) > 1e-2
        with pytest.raises(PublishError):
            publish_from_disk([engine.url], tmp_path / "ckpt" / "missing", version=2)
    finally:
        manager.shutdown_all()
