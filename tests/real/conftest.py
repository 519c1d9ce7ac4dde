"""Fixtures shared by the real-component tests (heavy stack: ``make test`` only)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def model(tmp_path_factory):
    """A folder with the tiny tokenizer and Qwen2 config every proxy and harness test serves."""
    from proxy_fixtures import build_tiny_tokenizer, shared_tiny_dir

    return build_tiny_tokenizer(shared_tiny_dir(tmp_path_factory))


@pytest.fixture(scope="module")
def megatron():
    """A one-process gloo world with Megatron's parallel state (what every cell sets up); the device setup."""
    import datetime

    import torch.distributed as dist
    from megatron.core import parallel_state

    from gyre.real.train.cpu_compat import prepare_device

    setup = prepare_device("cpu", threads=1)
    if not dist.is_initialized():
        store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=30))
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    return setup
