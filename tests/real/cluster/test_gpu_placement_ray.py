"""GPU cells on Ray without a GPU: a two-node cluster whose nodes declare logical GPUs (``--num-gpus``).

A local Ray cluster of two nodes (``ray.cluster_utils.Cluster``: the head and one more
node process, 2 logical GPUs and 1 CPU each) runs on this machine inside the suite's
loopback-only network namespace (``tools/isolated.sh``). ``gyre run --dry-run`` of the
one-node GPU job (``configs/gpu_node_qwen.toml``) with a ``[cluster]`` table and 2 cells of
TP 2 on 2-GPU nodes (more GPUs than one node has, which only a placed job may ask for)
places the job for real and releases it. Checked: one cell per node, each cell holding its
node's two GPUs; every rank sees exactly its cell's GPUs (``CUDA_VISIBLE_DEVICES``) and selects
``cuda:LOCAL_RANK``, not its global rank; the engine sees the same GPUs and starts at GPU 0;
gloo, since no node here has CUDA; the memory plan is printed; every GPU is free again after.
A third cell that cannot fit is refused in one line naming what the cluster lacks. A rank's
device index is its rank in the cell when placed and the cell's block of GPUs on one node.
Skipped, with the reason, without Ray or outside a loopback-only namespace.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gyre.cli import main
from gyre.real.train.context import CellConfig

try:
    from ray_nodes import loopback_only, two_ray_nodes
except ImportError:
    from ..ray_nodes import loopback_only, two_ray_nodes

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[cluster]')")
pytestmark = [pytest.mark.timeout(300),
              loopback_only]
GPU_JOB = Path(__file__).resolve().parents[3] / "configs" / "gpu_node_qwen.toml"
# Qwen2.5-0.5B's config.json (the fields the bridge reads): loading the job reads only this file
QWEN25_05B = {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
              "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936, "hidden_act": "silu",
              "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
              "tie_word_embeddings": True, "use_sliding_window": False, "torch_dtype": "bfloat16"}


@pytest.fixture(scope="module")
def address():
    with two_ray_nodes({"num_cpus": 1, "num_gpus": 2}, {"num_cpus": 1, "num_gpus": 2}) as cluster:
        yield cluster.address


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen25-05b")
    (folder / "config.json").write_text(json.dumps(QWEN25_05B))
    return folder


def dry_run(address: str, checkpoint: Path, cells: int, capsys, wait_s: float = 30.0) -> tuple[int, str, str]:
    sets = [f"nodes={cells}", f'model={{checkpoint = "{checkpoint}", dtype = "bfloat16"}}',
            "layout.gpus_per_node=2", "layout.tensor_parallel=2", "layout.engine_tensor_parallel=2",
            'cluster.interface="lo"', "cluster.rank_cpus=0.25", "cluster.engine_cpus=0.25",
            f"cluster.start_timeout_s={wait_s}"]
    code = main(["run", "--config", str(GPU_JOB), "--dry-run", "--cluster", address]
                + [arg for item in sets for arg in ("--set", item)])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_dry_run_places_one_cell_per_logical_gpu_node_and_shows_each_process_its_gpus(address, checkpoint,
                                                                                      capsys):
    code, out, err = dry_run(address, checkpoint, 2, capsys)
    assert code == 0, err
    lines = out.splitlines()
    cells = [line for line in lines if line.startswith("cell ") and ": node " in line]
    assert len(cells) == 2 and len({line.split("node ")[1].split()[0] for line in cells}) == 2  # one per node
    assert all("GPUs 0,1 of its node" in line for line in cells)
    for cell in (0, 1):
        for rank in (0, 1):
            assert (f"cell {cell} rank {rank}: cuda:{rank}, gloo (no CUDA on this node" in out
                    and f"CUDA_VISIBLE_DEVICES=0,1 GLOO_SOCKET_IFNAME=lo LOCAL_RANK={rank} NCCL_SOCKET_IFNAME=lo"
                    in [line.split("env ")[1] for line in lines if line.startswith(f"cell {cell} rank {rank}:")][0])
        engine = [line for line in lines if line.startswith(f"cell {cell} engine e{cell}:")]
        assert len(engine) == 1 and "CUDA_VISIBLE_DEVICES=0,1 GLOO" in engine[0] and "LOCAL_RANK" not in engine[0]
        assert "sglang --tp-size 2 --base-gpu-id 0 " in engine[0] and "--enable-memory-saver" in engine[0]
    assert "memory per GPU (80 GiB): training " in out and "memory per GPU (80 GiB): rollout " in out
    assert "2 cells on 2 node(s)" in out
    ray.init(address=address, namespace="gyre-test")
    try:
        deadline = time.monotonic() + 30
        while ray.available_resources().get("GPU", 0) < 4 and time.monotonic() < deadline:
            time.sleep(0.2)  # placement groups are removed asynchronously
        assert ray.available_resources().get("GPU", 0) == 4  # everything released
    finally:
        ray.shutdown()


def test_cells_the_cluster_cannot_hold_are_refused_naming_what_it_lacks(address, checkpoint, capsys):
    code, out, err = dry_run(address, checkpoint, 3, capsys, wait_s=3.0)
    assert code == 2
    assert "placement: the cluster could not place ['cell" in err and "'GPU': 2" in err


def test_a_placed_rank_selects_its_rank_in_the_cell_and_one_node_its_block_of_gpus():
    one_node = CellConfig(cells=4, store_port=0, queue_root="", workdir="", tp=2)
    placed = CellConfig(cells=4, store_port=0, queue_root="", workdir="", tp=2, placed=True)
    assert [one_node.local_gpu(c, r) for c in range(4) for r in range(2)] == list(range(8))
    assert [placed.local_gpu(c, r) for c in range(4) for r in range(2)] == [0, 1] * 4


def environ(pid: int) -> dict[str, str]:
    """A process's environment as it was started (both nodes run on this machine)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_the_processes_a_placed_gpu_cell_starts_see_its_gpus_and_their_local_rank(address, tmp_path):
    from gyre.real.cluster.config import ClusterConfig
    from gyre.real.cluster.placement import Placement
    from gyre.real.engines.manager import EngineSpec
    from gyre.real.runtime.ports import free_port

    # stands in for SGLang's interpreter: writes what it was given, then waits; its environment file is
    # written aside and renamed, so the test never reads one half written
    fake = tmp_path / "fake-python"
    fake.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/$$.args\n"
                    f"env > {tmp_path}/$$.part && mv {tmp_path}/$$.part {tmp_path}/$$.env\nsleep 600\n")
    fake.chmod(0o755)
    placement = Placement(ClusterConfig(address=address, interface="lo", rank_cpus=0.25, engine_cpus=0.25))
    try:
        placement.open(cells=2, tp=2, engines={0: "e0", 1: "e1"}, gpus=2)
        cfg = placement.cell_config(CellConfig(cells=2, store_port=free_port(), queue_root=str(tmp_path / "q"),
                                               workdir=str(tmp_path), tp=2, timeout_s=600.0))  # no store: it waits
        assert cfg.placed and [cfg.local_gpu(c, r) for c in (0, 1) for r in (0, 1)] == [0, 1, 0, 1]
        ranks = {(c, r): placement.start_rank(cfg, c, r, f"gyre-cell{c}-rank{r}") for c in (0, 1) for r in (0, 1)}
        for (cell, rank), proc in ranks.items():
            env = environ(proc.pid)
            assert (env["CUDA_VISIBLE_DEVICES"], env["LOCAL_RANK"]) == ("0,1", str(rank)), (cell, rank)
        for cell in (0, 1):
            host, port = placement.engine_endpoint(f"e{cell}")
            placement.start_engine(EngineSpec(engine_id=f"e{cell}", model_path="/none", port=port, host=host),
                                   fake, tmp_path / f"e{cell}.log")
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("*.env"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        engines = [dict(line.split("=", 1) for line in f.read_text().splitlines() if "=" in line)
                   for f in tmp_path.glob("*.env")]
        assert len(engines) == 2 and all(e["CUDA_VISIBLE_DEVICES"] == "0,1" and "LOCAL_RANK" not in e for e in engines)
        assert all(e["NCCL_SOCKET_IFNAME"] == e["GLOO_SOCKET_IFNAME"] == "lo" for e in engines)
        described = placement.describe()["cells"]
        assert {c: described[c]["gpus"] for c in (0, 1)} == {0: ["0", "1"], 1: ["0", "1"]}
        assert described[0]["node_id"] != described[1]["node_id"]
    finally:
        placement.close()
