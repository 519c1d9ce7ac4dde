"""The memory plan of a GPU cell (``train.memory_plan``, ``runtime.layout``) and the memory saver, on CPU.

Checked: the plan's parameter count is the Megatron model's (built here, TP 1,
Qwen2 and Qwen3 variants) and Qwen2.5-7B's published 7.62 B from its real
config; each per-rank term shrinks with TP as stated, a float32 model has no
masters, an engine without the memory saver keeps its share while its cell
trains; the shipped 8-GPU job's plan fits its GPUs while 4 cells x TP 2 is
refused by ``gyre run`` in one line naming every term, before anything starts
(``gyre run --dry-run`` prints the placement and the plan and starts nothing);
an engine share too small for its weights is named; GPU engines start with
``--enable-memory-saver``.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gyre.real.runtime.job import load_job_config
from gyre.real.runtime.layout import GpuLayout
from gyre.real.train.bridge import model_config_from_hf
from gyre.real.train.memory_plan import count_parameters, plan_memory
from gyre.real.train.model import ModelConfig

ROOT = Path(__file__).resolve().parents[3]
GPU_JOB = ROOT / "configs" / "gpu_node_qwen.toml"
# Qwen2.5-7B-Instruct's config.json (the fields the bridge reads); nothing is downloaded.
QWEN25_7B = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
             "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "hidden_act": "silu",
             "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
             "tie_word_embeddings": False, "use_sliding_window": False, "torch_dtype": "bfloat16"}
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen25-7b")
    (folder / "config.json").write_text(json.dumps(QWEN25_7B))
    return folder


@pytest.mark.parametrize("cfg", [ModelConfig(), ModelConfig(family="qwen3", qkv_bias=False, qk_layernorm=True,
                                                            tie_embeddings=True, kv_channels=32)])
def test_the_parameter_count_is_the_megatron_models(megatron, cfg):
    from gyre.real.train.cpu_compat import seed_model_rng
    from gyre.real.train.model import FlatParameters, build_gpt

    seed_model_rng(cfg.init_seed, megatron)
    assert count_parameters(cfg).total == FlatParameters(build_gpt(cfg, megatron.device)).numel


def test_qwen25_7b_has_its_published_size_and_its_terms_scale_with_tp(checkpoint):
    model = model_config_from_hf(checkpoint, dtype="bfloat16")
    assert round(count_parameters(model).total / 1e9, 2) == 7.62  # the model card's 7.62 B
    plans = {tp: plan_memory(model, tp=tp, engine_tp=tp, engine_fraction=0.35, gpu_gib=80, tokens=4096)
             for tp in (2, 4)}
    for term in ("weights", "grads", "accumulator", "masters", "main grads", "adam"):
        assert plans[2].training[term] == pytest.approx(2 * plans[4].training[term], rel=1e-4)
    two = plans[2].training
    assert two["accumulator"] == pytest.approx(4 * two["weights"]) and two["adam"] == two["accumulator"]
    assert two["masters"] == pytest.approx(2 * two["weights"]) and two["engine"] == 2.0
    fp32 = plan_memory(dataclasses.replace(model, dtype="float32"), tp=2, engine_tp=2, engine_fraction=0.35,
                       gpu_gib=80, tokens=4096)
    assert "masters" not in fp32.training and fp32.training["weights"] == pytest.approx(2 * two["weights"])
    kept = plan_memory(model, tp=2, engine_tp=2, engine_fraction=0.35, gpu_gib=80, tokens=4096, memory_saver=False)
    assert kept.training["engine"] == pytest.approx(0.35 * 80)


def test_the_shipped_job_fits_and_four_cells_of_tp2_are_refused(checkpoint):
    job = load_job_config(GPU_JOB, model={"checkpoint": str(checkpoint), "dtype": "bfloat16"})
    plan = job.gpu_layout().memory_plan(job.model.hf_config(job.seed), job.training.token_budget)
    assert plan.problem() is None and plan.training_gib < 80 and plan.rollout_gib < 80, plan.lines()
    wide = load_job_config(GPU_JOB, model={"checkpoint": str(checkpoint), "dtype": "bfloat16"}, nodes=4,
                           layout={"tensor_parallel": 2, "engine_tensor_parallel": 2, "gpu_memory_gib": 80,
                                   "engine_mem_fraction": 0.35})
    problem = wide.gpu_layout().memory_plan(wide.model.hf_config(wide.seed), wide.training.token_budget).problem()
    assert problem.startswith("training needs 143.2 GiB per GPU, the GPU has 80.0 (weights 7.1 + grads 7.1 + "
                              "accumulator 28.4 + masters 14.2 + main grads 14.2 + adam 28.4 + activations")


def test_an_engine_share_too_small_for_its_weights_is_named(checkpoint):
    model = model_config_from_hf(checkpoint, dtype="bfloat16")
    plan = plan_memory(model, tp=1, engine_tp=1, engine_fraction=0.03, gpu_gib=400, tokens=1024)  # 12 GiB < 14.2
    assert plan.kv_tokens == 0 and "KV cache for 0 tokens" in plan.problem()


def test_gpu_engines_start_with_the_memory_saver():
    assert "--enable-memory-saver" in GpuLayout().engine_args(0)
    assert "--enable-memory-saver" not in GpuLayout(memory_saver=False).engine_args(0)


def test_gyre_run_refuses_a_layout_that_cannot_fit_in_one_line(checkpoint, tmp_path):
    work = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "gyre.cli", "run", "--config", str(GPU_JOB), "--set", "nodes=4",
         "--set", f'model={{checkpoint="{checkpoint}", dtype="bfloat16"}}', "--set", f'workdir="{work}"',
         "--set", 'layout={tensor_parallel=2, engine_tensor_parallel=2}'],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    lines = [line for line in done.stderr.splitlines() if line.startswith("gyre run")]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("gyre run: error: job layout: training needs 143.2 GiB per GPU, the GPU has 80.0")
    assert not work.exists()


def test_gyre_run_dry_run_prints_the_placement_and_the_plan_and_starts_nothing(checkpoint, tmp_path):
    work = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "gyre.cli", "run", "--config", str(GPU_JOB), "--dry-run",
         "--set", f'model={{checkpoint="{checkpoint}", dtype="bfloat16"}}', "--set", f'workdir="{work}"'],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr  # on a machine without CUDA: the plan, not the device, is checked
    lines = done.stdout.splitlines()
    assert lines[:2] == ["cell 0: GPUs [0, 1, 2, 3] (TP 4 x PP 1), engine e0 TP 4",
                         "cell 1: GPUs [4, 5, 6, 7] (TP 4 x PP 1), engine e1 TP 4"]
    assert lines[3].startswith("cell 1: ranks on cuda:4, cuda:5, cuda:6, cuda:7 (nccl; gloo on a node without CUDA); engine e1: sglang --tp-size 4 "
                               "--base-gpu-id 4") and lines[3].endswith("--enable-memory-saver")
    assert lines[4].startswith("memory per GPU (80 GiB): training 74.5 GiB = weights 3.5 + grads 3.5")
    assert not work.exists()
