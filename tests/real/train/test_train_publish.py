"""Publication to rollout engines against a loopback server that checks SGLang's request contracts.

The fake engine (127.0.0.1, port chosen at run time) implements the three
endpoints the publisher uses, with SGLang's field names and answers: for
``/update_weights_from_disk`` it checks that ``model_path`` exists, that
``config.json`` describes the Qwen2 model and that ``model.safetensors``
holds exactly the expected tensors, and keeps what it loaded. The real-engine
test (SGLang's CPU engine loading the checkpoint) belongs to the SGLang tier.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gyre.real.toy.microsteps import feed, toy_batch
from gyre.real.train.model import ModelConfig
from gyre.real.train.plane import PlaneConfig, TrainingPlane
from gyre.real.train.publish import (PublishError, hf_state_dict, init_update_group, publish_distributed,
                                     publish_from_disk, qwen2_config, save_hf_checkpoint)
from gyre.real.train.publish_memory import MemoryRoute

CFG = ModelConfig()


def megatron_named(cfg: ModelConfig, seed: int = 0) -> list[tuple[str, torch.Tensor]]:
    """Random tensors under the Megatron names and shapes of ``train.model.build_gpt``."""
    gen = torch.Generator().manual_seed(seed)
    h, f, v = cfg.hidden_size, cfg.ffn_hidden_size, cfg.vocab_size
    qkv = (cfg.num_attention_heads + 2 * cfg.num_query_groups) * cfg.head_dim
    shapes = [("embedding.word_embeddings.weight", (v, h))]
    for i in range(cfg.num_layers):
        p = f"decoder.layers.{i}."
        shapes += [(p + "input_layernorm.weight", (h,)), (p + "self_attention.linear_proj.weight", (h, h)),
                   (p + "self_attention.linear_qkv.weight", (qkv, h)), (p + "self_attention.linear_qkv.bias", (qkv,)),
                   (p + "pre_mlp_layernorm.weight", (h,)), (p + "mlp.linear_fc1.weight", (2 * f, h)),
                   (p + "mlp.linear_fc2.weight", (h, f))]
    shapes += [("decoder.final_layernorm.weight", (h,)), ("output_layer.weight", (v, h))]
    return [(n, torch.randn(s, generator=gen)) for n, s in shapes]


class FakeEngine(ThreadingHTTPServer):
    def __init__(self, expected_shapes: dict[str, tuple]):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.expected_shapes = expected_shapes
        self.loaded: list[dict] = []
        self.requests: list[tuple[str, dict]] = []
        self.refuse = False
        self.refuse_group = False  # an engine without in-memory weight updates
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802
        server: FakeEngine = self.server
        if self.headers.get("Content-Type") != "application/json":
            return self._answer(400, {"success": False, "message": "only application/json"})
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server.requests.append((self.path, body))
        if self.path == "/update_weights_from_disk":
            return self._answer(*self._load(server, body))
        if self.path == "/init_weights_update_group" and server.refuse_group:
            return self._answer(400, {"success": False, "message": "weight update groups are not supported"})
        if self.path in ("/init_weights_update_group", "/update_weights_from_distributed"):
            return self._answer(200, {"success": True, "message": "ok"})
        self._answer(404, {"detail": "Not Found"})

    def _load(self, server: FakeEngine, body: dict) -> tuple[int, dict]:
        path = Path(body.get("model_path", ""))
        if server.refuse or not path.is_dir():
            return 400, {"success": False, "message": f"cannot load {path}", "num_paused_requests": 0}
        config = json.loads((path / "config.json").read_text())
        tensors = load_file(str(path / "model.safetensors"))
        shapes = {k: tuple(v.shape) for k, v in tensors.items()}
        if config["model_type"] != "qwen2" or shapes != server.expected_shapes:
            return 400, {"success": False, "message": "unexpected checkpoint", "num_paused_requests": 0}
        server.loaded.append({"version": body["weight_version"], "tensors": tensors, "config": config})
        return 200, {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}

    def _answer(self, code: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture()
def engines():
    expected = {k: tuple(v.shape) for k, v in hf_state_dict(megatron_named(CFG), CFG).items()}
    servers = [FakeEngine(expected) for _ in range(2)]
    yield servers
    for s in servers:
        s.shutdown()
        s.server_close()


def test_checkpoint_is_atomic_and_complete(tmp_path):
    named = megatron_named(CFG)
    path = save_hf_checkpoint(tmp_path, named, CFG, 3)
    assert path.name == "v000003" and sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors"]
    assert json.loads((path / "config.json").read_text()) == qwen2_config(CFG)
    loaded = load_file(str(path / "model.safetensors"))
    expected = hf_state_dict(named, CFG)
    assert loaded.keys() == expected.keys() and all(torch.equal(loaded[k], expected[k]) for k in loaded)
    with pytest.raises(FileExistsError, match="version 3"):
        save_hf_checkpoint(tmp_path, named, CFG, 3)
    assert [p.name for p in tmp_path.iterdir()] == ["v000003"]  # no temporary folder left


def test_publish_from_disk_reaches_every_engine(tmp_path, engines):
    path = save_hf_checkpoint(tmp_path, megatron_named(CFG), CFG, 7)
    answers = publish_from_disk([e.url for e in engines], path, 7)
    assert all(a["success"] for a in answers)
    for engine in engines:
        (route, body), = engine.requests
        assert route == "/update_weights_from_disk"
        assert body == {"model_path": str(path), "load_format": None, "abort_all_requests": False,
                        "weight_version": "7"}
        assert engine.loaded[0]["version"] == "7"


def test_refusal_and_unreachable_engine_are_named(tmp_path, engines):
    path = save_hf_checkpoint(tmp_path, megatron_named(CFG), CFG, 1)
    engines[1].refuse = True
    with pytest.raises(PublishError, match=f"{engines[1].url}/update_weights_from_disk answered 400"):
        publish_from_disk([e.url for e in engines], path, 1)
    with pytest.raises(PublishError, match="unreachable"):
        publish_from_disk(["http://127.0.0.1:9"], path, 1, timeout=5)


def test_distributed_path_sends_metadata_in_broadcast_order(engines):
    named = list(hf_state_dict(megatron_named(CFG), CFG).items())
    init_update_group(engines[0].url, master_address="127.0.0.1", master_port=29999, rank_offset=1,
                      world_size=2, backend="gloo")
    sent: list[torch.Tensor] = []
    answers = publish_distributed(engines[0].url, named, 4, sent.append, bucket_bytes=64 << 10)
    metas = [body for route, body in engines[0].requests if route == "/update_weights_from_distributed"]
    assert len(answers) == len(metas) > 1
    assert [n for m in metas for n in m["names"]] == [n for n, _ in named]
    assert all(m["dtypes"] == ["float32"] * len(m["names"]) and m["weight_version"] == "4" for m in metas)
    assert [list(t.shape) for t in sent] == [s for m in metas for s in m["shapes"]]
    assert engines[0].requests[0][1]["rank_offset"] == 1


@pytest.mark.timeout(90)
def test_core_publishes_after_the_final_update(tmp_path, engines):
    with TrainingPlane(PlaneConfig(cells=2), tmp_path / "plane") as plane:
        for cell in (0, 1):
            plane.call(cell, "enter_training")
        feed(plane.queues, toy_batch(9, 0, 4))
        plane.call(0, "step", version=0, final=True)
        answer = plane.call(0, "publish", version=1, endpoints=[e.url for e in engines],
                            directory=str(tmp_path / "ckpt"))
        core = torch.load(plane.call(0, "dump", path=str(tmp_path / "core.pt"))["path"])
    like = megatron_named(CFG)
    assert core["names"] == [n for n, _ in like]
    expected = hf_state_dict(list(zip(core["names"], _views(core["weights"], like))), CFG)
    for engine in engines:
        got = engine.loaded[0]["tensors"]
        assert engine.loaded[0]["version"] == "1" and all(torch.equal(got[k], expected[k]) for k in expected)
    assert answer["path"].endswith("v000001")


def _views(flat: torch.Tensor, like: list[tuple[str, torch.Tensor]]) -> list[torch.Tensor]:
    out, offset = [], 0
    for _, t in like:
        out.append(flat[offset:offset + t.numel()].view(t.shape))
        offset += t.numel()
    assert offset == flat.numel()
    return out


@pytest.mark.timeout(60)  # each open ends as soon as the engine answers, not at the 30 s rendezvous timeout
def test_an_engine_refusing_the_weight_group_sends_the_run_to_disk_once_and_for_good(engines, caplog):
    engines[1].refuse_group = True
    route = MemoryRoute("127.0.0.1", logging.getLogger("gyre.test.route"), open_timeout=30.0)
    named = list(hf_state_dict(megatron_named(CFG), CFG).items())
    urls = {e.url: 1 for e in engines}
    with caplog.at_level(logging.WARNING, logger="gyre.test.route"):
        assert route.publish(urls, named, 1, torch.device("cpu")) is None
        assert route.publish(urls, named, 2, torch.device("cpu")) is None  # not asked again
    assert route.refused is not None and engines[1].url in route.refused and "not supported" in route.refused
    assert [r.getMessage() for r in caplog.records if "unavailable" in r.getMessage()] == [
        f"publication from memory unavailable ({route.refused}); publishing from disk from now on"]
    assert [path for path, _ in engines[1].requests] == ["/init_weights_update_group"]
    assert route.publisher is None


@pytest.mark.timeout(60)
def test_an_engine_that_does_not_answer_sends_only_that_publication_to_disk(caplog):
    route = MemoryRoute("127.0.0.1", logging.getLogger("gyre.test.route"), open_timeout=30.0)
    named = list(hf_state_dict(megatron_named(CFG), CFG).items())
    with caplog.at_level(logging.WARNING, logger="gyre.test.route"):
        assert route.publish({"http://127.0.0.1:9": 1}, named, 3, torch.device("cpu")) is None
    assert route.refused is None and route.publisher is None  # the next publication tries memory again
    messages = [r.getMessage() for r in caplog.records]
    assert any("version 3 from disk" in m and "9/init_weights_update_group unreachable" in m for m in messages)
