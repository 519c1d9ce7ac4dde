"""The 8-GPU job (``configs/gpu_node_qwen.toml``), its layout, and the GPU smoke script, on a machine without CUDA.

Checked: the shipped file refuses to load until its checkpoint placeholder is
filled, naming the checkpoint; with a checkpoint (Qwen2.5-7B's config.json,
no weights: loading reads only the config) it loads and validates: 2 cells x (TP 4 x PP 1) fill the node's 8 GPUs, each
cell's engine sits on its own GPUs, each cell's two tensor-parallel ranks
split the model (``cell_tp`` = the layout's ``tensor_parallel``), the task set
and harness resolve; both that layout and the small-model version the smoke
script runs (one GPU per cell) have no runnable problem, while ``run_job``
refuses a pipeline-parallel layout (with the reason) before touching its work
directory; a ``tp`` field that disagrees with the layout, a layout TP the
checkpoint cannot split, and impossible layouts are named (with the job
file). The smoke script is in ``test_gpu_smoke.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gyre.real.runtime.job import load_job_config, run_job
from gyre.real.runtime.layout import GpuLayout, layout_from_table

ROOT = Path(__file__).resolve().parents[3]
GPU_JOB = ROOT / "configs" / "gpu_node_qwen.toml"
SMOKE_LAYOUT = {"gpus_per_node": 2, "tensor_parallel": 1, "pipeline_parallel": 1, "engine_tensor_parallel": 1,
                "engine_mem_fraction": 0.2}


# Qwen2.5-7B-Instruct's config.json (the fields the bridge reads); loading a job reads only this file.
QWEN25_7B = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
             "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "hidden_act": "silu",
             "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
             "tie_word_embeddings": False, "use_sliding_window": False, "torch_dtype": "bfloat16"}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A checkpoint folder with a real Qwen2.5-7B config and no weights (nothing is downloaded)."""
    folder = tmp_path_factory.mktemp("qwen25-7b")
    (folder / "config.json").write_text(json.dumps(QWEN25_7B))
    return folder


def test_the_placeholder_checkpoint_is_named_until_filled():
    with pytest.raises(ValueError) as info:
        load_job_config(GPU_JOB)
    message = str(info.value)
    assert str(GPU_JOB) in message
    assert "FILL-ME/path/to/Qwen2.5-7B-Instruct: no config.json, the folder does not exist" in message


def test_the_gpu_job_loads_and_lays_out_one_node(checkpoint):
    job = load_job_config(GPU_JOB, model={"checkpoint": str(checkpoint), "dtype": "bfloat16"})
    layout = job.gpu_layout()
    assert (job.layout.device, job.schedule.nodes, layout.gpus_per_cell, layout.gpus_per_node) == ("cuda", 2, 4, 8)
    assert [layout.cell_gpus(c) for c in range(job.schedule.nodes)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert layout.engine_args(1)[:4] == ("--tp-size", "4", "--base-gpu-id", "4")
    assert job.layout.publication_route() == "memory"
    assert layout.runnable_problem() is None and job.cell_tp() == 4 and job.training.tp == 1
    model = job.model.hf_config(job.seed)
    assert (model.family, model.dtype, model.num_layers, model.num_query_groups, model.tie_embeddings) == (
        "qwen2", "bfloat16", 28, 4, False)
    assert job.harness.build().name == "mini-swe-agent"
    assert len(job.tasks.build(job.seed).specs) == 4 and job.scheduler().K == 2


def test_the_smoke_version_is_runnable_and_a_pipeline_layout_is_refused_before_anything_starts(checkpoint, tmp_path):
    model = {"checkpoint": str(checkpoint), "dtype": "bfloat16"}
    smoke = load_job_config(GPU_JOB, model=model, nodes=2, steps=4, layout=SMOKE_LAYOUT, harness="scripted")
    assert smoke.gpu_layout().runnable_problem() is None and smoke.scheduler().mu * 2 == smoke.steps
    assert smoke.cell_tp() == 1
    pipeline = dict(SMOKE_LAYOUT, gpus_per_node=8, pipeline_parallel=2, engine_tensor_parallel=2)
    staged = load_job_config(GPU_JOB, model=model, layout=pipeline, workdir=str(tmp_path / "run"))  # it loads
    with pytest.raises(ValueError, match="pipeline_parallel = 2: pipeline-parallel cells are not supported.*"
                                         "Megatron's pipeline schedule"):
        run_job(staged)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("overrides, message", [
    ({"tp": 2}, "job field tp = 2 disagrees with layout.tensor_parallel = 4"),
    ({"nodes": 1, "layout": {"tensor_parallel": 8, "engine_tensor_parallel": 8}},
     "training cells of tp = 8 ranks: model num_attention_heads = 28 is not divisible by tp = 8"),
    ({"nodes": 4, "layout": {"tensor_parallel": 2, "engine_tensor_parallel": 2}}, None),
])
def test_the_layouts_tp_must_split_the_checkpoint(checkpoint, overrides, message):
    model = {"checkpoint": str(checkpoint), "dtype": "bfloat16"}
    if message is None:  # Qwen2.5-7B: 28 heads, 4 query groups, FFN 18944, vocabulary 152064 split over 2
        assert load_job_config(GPU_JOB, model=model, **overrides).cell_tp() == 2
        return
    with pytest.raises(ValueError) as info:
        load_job_config(GPU_JOB, model=model, **overrides)
    assert message in str(info.value) and str(GPU_JOB) in str(info.value)


@pytest.mark.parametrize("table, cells, message", [
    ({"gpus_per_node": 8, "tensor_parallel": 4}, 4, "4 cells x 4 GPUs = 16 GPUs, more than layout.gpus_per_node = 8"),
    ({"tensor_parallel": 2, "engine_tensor_parallel": 1}, 2, "engine_tensor_parallel = 1 must equal the cell's 2"),
    ({"tensor_parallel": 0}, 1, "layout.tensor_parallel must be a positive integer"),
    ({"publication": "memory"}, 1, "layout: unknown key(s) ['publication']"),  # a job field, not a layout one
    ({"gpus": 8}, 1, "layout: unknown key(s) ['gpus']"),
    ({"nodes_per_cell": 2, "tensor_parallel": 3, "engine_tensor_parallel": 3}, 1, "3 GPUs must divide a node's 8"),
    ({"nodes_per_cell": 0}, 1, "layout.nodes_per_cell must be a positive integer"),
    ({"gpus_per_node": 2, "tensor_parallel": 4, "engine_tensor_parallel": 4}, 1, "does not fit on a node of 2"),
])
def test_impossible_layouts_are_named(table, cells, message):
    with pytest.raises(ValueError) as info:
        layout_from_table(table, cells)
    assert message in str(info.value)


def test_a_pipeline_cell_counts_all_its_gpus():
    layout = GpuLayout(gpus_per_node=8, tensor_parallel=2, pipeline_parallel=2, engine_tensor_parallel=4)
    layout.check(2)
    assert layout.cell_gpus(1) == [4, 5, 6, 7] and len(layout.describe(2)) == 2


def test_publication_auto_takes_the_path_measured_faster_and_a_bad_one_is_named(checkpoint):
    from gyre.real.runtime.job_file import job_from_table

    cuda = {"device": "cuda", "preset": "gyre-1", "model": {"checkpoint": str(checkpoint)}, "layout": SMOKE_LAYOUT}
    assert job_from_table(cuda).layout.publication_route() == "memory"  # NCCL from memory (docs/gpu.md)
    assert job_from_table({}).layout.publication_route() == "disk"  # on CPU the page cache makes disk faster (bench)
    assert job_from_table({"publication": "memory"}).layout.publication_route() == "memory"
    assert job_from_table({**cuda, "publication": "disk"}).layout.publication_route() == "disk"
    with pytest.raises(ValueError, match="job field publication must be one of"):
        job_from_table({"publication": "nccl"})


@pytest.mark.timeout(60)
def test_a_paper_scale_layout_prints_its_whole_plan_without_a_cluster(checkpoint, capsys):
    """4 cells of 48 nodes of 8 GPUs (the paper's 2.4T layout; a 7B config stands in for its model):
    one line per node with its ranks, local ranks and engines, the memory plan, and why it is not run."""
    import time

    from gyre.cli import main

    sets = ["nodes=4", f'model={{checkpoint = "{checkpoint}", dtype = "bfloat16"}}', "layout.nodes_per_cell=48",
            "layout.tensor_parallel=4", "layout.engine_tensor_parallel=4"]  # 28 heads: TP 4, as shipped
    t0 = time.perf_counter()
    code = main(["run", "--config", str(GPU_JOB), "--dry-run"] + [a for item in sets for a in ("--set", item)])
    elapsed = time.perf_counter() - t0
    out = capsys.readouterr().out
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == ("4 cells x 48 nodes x 8 GPUs = 1536 GPUs; a cell: TP 4 x PP 1 x DP 96, one engine TP 4 "
                        "per replica")
    nodes = [line for line in lines if " (job node " in line]
    assert len(nodes) == 192 and [int(n.split("(job node ")[1].split(")")[0]) for n in nodes] == list(range(192))
    assert nodes[-1] == ("cell 3 node 47 (job node 191): ranks 1528-1535 on cuda:0-7 (LOCAL_RANK 0-7, "
                         "CUDA_VISIBLE_DEVICES 0-7); engines e3.94 on cuda:0-3, e3.95 on cuda:4-7")
    assert any(line.startswith("memory per GPU (80 GiB): training ") for line in lines)
    assert lines[-1].startswith("not runnable: nodes_per_cell = 48: a cell of several nodes is planned")
    with capsys.disabled():
        print(f"\npaper-scale dry run: {elapsed:.2f} s, {len(lines)} lines")


def test_cells_beyond_one_node_are_refused_unless_a_cluster_places_them(checkpoint):
    from gyre.real.runtime.job_file import job_from_table

    table = {"gpus_per_node": 8, "tensor_parallel": 4, "engine_tensor_parallel": 4}
    with pytest.raises(ValueError, match="a \\[cluster\\] table spreads cells over several nodes"):
        layout_from_table(table, 4)
    assert layout_from_table(table, 4, placed=True).cell_gpus(3, placed=True) == [0, 1, 2, 3]
    job = job_from_table({"device": "cuda", "preset": "gyre-1", "nodes": 4, "model": {"checkpoint": str(checkpoint)},
                          "layout": table, "cluster": {"address": "10.0.0.1:6379"}})
    assert job.gpu_layout().engine_args(3, placed=True)[:4] == ("--tp-size", "4", "--base-gpu-id", "0")
    assert job.gpu_layout().describe(4, placed=True)[3].startswith("cell 3: GPUs [0, 1, 2, 3] of its node (TP 4")
