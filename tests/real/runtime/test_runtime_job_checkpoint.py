"""A job trains a Hugging Face checkpoint: the [model] table (issue 15), parsed, refused, and run.

The checkpoint is a tiny random Qwen3 (qk-norm, head_dim 32) built offline
from a config, with the locally trained tokenizer beside it. The run check
starts real SGLang CPU engines and Megatron cells on it for one burst.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gyre.real.engines.manager import sglang_python
from gyre.real.runtime.job import load_job_config
from gyre.real.toy.tiny_model import build_tiny_qwen3

try:
    from jobs import small_job
    from jobs import write_job as write_job_file
except ImportError:
    from ..jobs import small_job
    from ..jobs import write_job as write_job_file



@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return build_tiny_qwen3(tmp_path_factory.mktemp("qwen3"), seed=3)


def write_job(tmp_path: Path, checkpoint: Path, extra: str = "") -> Path:
    model = f"[model]\ncheckpoint = {json.dumps(str(checkpoint))}\n{extra}"
    return write_job_file(tmp_path, small_job(tmp_path / "run", tables=model))


def test_the_model_table_names_a_checkpoint_the_cells_load(qwen3, tmp_path):
    job = load_job_config(write_job(tmp_path, qwen3))
    cfg = job.model.hf_config(job.seed)
    assert (cfg.family, cfg.qk_layernorm, cfg.kv_channels, cfg.checkpoint) == ("qwen3", True, 32, str(qwen3))


@pytest.mark.parametrize("mutate, message", [
    (lambda folder: folder / "missing", "no config.json"),
    (lambda folder: folder, "dtype must be float32 or bfloat16"),
    (lambda folder: folder, "unknown key(s) ['revision']"),
    (lambda folder: folder, "is not supported"),
])
def test_a_checkpoint_that_cannot_load_fails_before_anything_starts(qwen3, tmp_path, mutate, message):
    extra = {"dtype must": 'dtype = "float16"\n', "unknown key": 'revision = "main"\n'}
    folder = mutate(qwen3)
    if message == "is not supported":
        folder = tmp_path / "llama"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    path = write_job(tmp_path, folder, next((v for k, v in extra.items() if k in message), ""))
    with pytest.raises(ValueError) as info:
        load_job_config(path)
    assert message in str(info.value) and "[model]" in str(info.value)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(not sglang_python().exists(), reason="SGLang CPU venv not built")
def test_gyre_run_trains_and_publishes_a_qwen3_checkpoint(qwen3, tmp_path):
    job = write_job(tmp_path, qwen3)
    done = subprocess.run([sys.executable, "-m", "gyre.cli", "run", "--config", str(job)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=560)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "model: qwen3 checkpoint" in done.stderr
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["steps"] == 2 and s["published"] == 2 and s["replay_identical"] and s["backend_errors"] == []
    published = json.loads(Path(s["publishes"][-1]["path"]).joinpath("config.json").read_text()) \
        if "path" in s["publishes"][-1] else None
    assert published is None or published["model_type"] == "qwen3"
