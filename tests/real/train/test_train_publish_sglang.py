"""Publication for real: Megatron-layout weights exported and loaded by a live SGLang CPU engine.

The engine starts on a checkpoint written by ``save_hf_checkpoint`` from
tensors under Megatron's names and shapes (``train.model`` tests check that
this export reproduces Megatron's logits), then ``publish_from_disk`` moves it
to a second version. After the update the engine's log-probabilities must
equal a transformers forward pass of the new checkpoint and differ from the
old ones: the CPU engine really serves the published weights.

The bridge tests load a tiny Hugging Face checkpoint (Qwen2, and Qwen3 with
qk-norm) into Megatron through ``train.bridge``, start the engine on Gyre's own
export of it (tokenizer and chat template included: the engine answers a chat
request), take one optimizer step, publish, and check that the engine's
log-probabilities after the update are transformers' log-probabilities of the
exported weights (within ENGINE_TOL), so the change the engine shows is the
change transformers predicts; Megatron's own log-probabilities of the updated
weights agree with transformers' within MEGATRON_TOL.
"""

from __future__ import annotations

import shutil

import pytest
import torch

try:
    from proxy_fixtures import free_port, shared_tiny_dir
    from test_train_publish import megatron_named
except ImportError:
    from .proxy_fixtures import free_port, shared_tiny_dir
    from .test_train_publish import megatron_named

from gyre.real.engines.manager import EngineManager, EngineSpec, sglang_python
from gyre.real.toy.microsteps import toy_batch
from gyre.real.toy.tiny_model import build_tiny_qwen2, build_tiny_qwen3, build_tiny_tokenizer
from gyre.real.train.bridge import load_hf_weights, model_config_from_hf
from gyre.real.train.cpu_compat import seed_model_rng
from gyre.real.train.model import FlatParameters, LossConfig, ModelConfig, build_gpt, causal_mask
from gyre.real.train.publish import PublishError, publish_from_disk, save_hf_checkpoint
from gyre.real.train.state import OptimConfig, TrainingState

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.skipif(not sglang_python().exists(), reason="SGLang CPU venv not built")]
CFG = ModelConfig()
PROMPT = [3, 17, 42, 99, 7, 200, 12, 5]
FLAGS = ("--skip-tokenizer-init", "--mem-fraction-static", "0.05", "--max-total-tokens", "4096",
         "--skip-server-warmup")
ENGINE_TOL = 2e-5  # SGLang CPU engine vs transformers after a bridge publication, float32 (measured <= 5e-7)
MEGATRON_TOL = 1e-5  # Megatron vs transformers, float32 (measured ~1e-6)


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


@pytest.fixture(scope="module")
def tiny_checkpoints(tmp_path_factory):
    """The shared tiny Qwen2, and a tiny Qwen3 beside a copy of the same tokenizer (trained once)."""
    qwen2 = build_tiny_qwen2(shared_tiny_dir(tmp_path_factory, "tiny-qwen2"))
    tok = build_tiny_tokenizer(shared_tiny_dir(tmp_path_factory, "tiny-model"))
    qwen3_dir = shared_tiny_dir(tmp_path_factory, "tiny-qwen3")
    if not qwen3_dir.exists():
        shutil.copytree(tok, qwen3_dir)
    return {"qwen2": qwen2, "qwen3": build_tiny_qwen3(qwen3_dir)}


def megatron_logprobs(model, setup) -> list[float]:
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        logits = model(ids, torch.arange(len(PROMPT))[None], attention_mask=causal_mask(len(PROMPT), setup.device))
    logp = torch.log_softmax(logits[0, :-1].float(), dim=-1)
    return logp.gather(1, ids[0, 1:, None])[:, 0].tolist()


@pytest.mark.timeout(420)  # an engine start takes 20 s on an idle 2-core machine, minutes on a busy one
@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_one_optimizer_step_reaches_the_engine_as_transformers_predicts(megatron, tmp_path, tiny_checkpoints,
                                                                      family):
    source = tiny_checkpoints[family]
    cfg = model_config_from_hf(source)
    seed_model_rng(cfg.init_seed, megatron)
    model = build_gpt(cfg, megatron.device)
    load_hf_weights(model, source, cfg)
    state = TrainingState(model, FlatParameters(model), OptimConfig(lr=5e-2), LossConfig(), owns_optimizer=True)
    assert megatron_logprobs(model, megatron) == pytest.approx(reference_logprobs(source), abs=MEGATRON_TOL)

    # the engine serves Gyre's own export of the loaded weights, with its tokenizer and chat template
    v0 = save_hf_checkpoint(tmp_path / "ckpt", state.flat.named_tensors(), cfg, 0)
    manager = EngineManager(tmp_path / "logs")
    engine = manager.launch(EngineSpec(engine_id=f"rollout-{family}", model_path=str(v0), port=free_port(),
                                       extra_args=FLAGS[1:]))  # with the tokenizer
    try:
        for step in toy_batch(5, 0, 2, vocab=cfg.vocab_size):
            state.accumulate(step)
        state.apply_update()
        v1 = save_hf_checkpoint(tmp_path / "ckpt", state.flat.named_tensors(), cfg, 1)
        predicted_before, predicted_after = reference_logprobs(source), reference_logprobs(v1)
        assert megatron_logprobs(model, megatron) == pytest.approx(predicted_after, abs=MEGATRON_TOL)

        manager.wait_healthy(engine.spec.engine_id, timeout=180)
        chat = manager._post(engine.spec.engine_id, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "print the value"}], "max_tokens": 3, "temperature": 0.0})
        assert chat["choices"][0]["message"]["role"] == "assistant" and chat["usage"]["prompt_tokens"] > 5
        before = engine_logprobs(manager, engine.spec.engine_id)
        assert before == pytest.approx(predicted_before, abs=ENGINE_TOL)
        assert publish_from_disk([engine.url], v1, version=1)[0]["success"] is True
        after = engine_logprobs(manager, engine.spec.engine_id)
        assert after == pytest.approx(predicted_after, abs=ENGINE_TOL)
        change = [a - b for a, b in zip(after, before)]
        predicted = [a - b for a, b in zip(predicted_after, predicted_before)]
        assert change == pytest.approx(predicted, abs=2 * ENGINE_TOL)
        assert max(abs(c) for c in change) > 5e-3  # measured: 0.011 (Qwen2), 0.27 (Qwen3)
        print(f"{family}: engine-transformers {max(abs(a - b) for a, b in zip(after, predicted_after)):.2e}, "
              f"largest change {max(abs(c) for c in change):.3f}")  # shown with -s
    finally:
        manager.shutdown_all()
