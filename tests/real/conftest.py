"""Fixtures shared by the real-component tests (heavy stack: ``make test`` only)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def model(tmp_path_factory):
    """A folder with the tiny tokenizer and Qwen2 config every proxy and harness test serves."""
    from proxy_fixtures import build_tiny_tokenizer, shared_tiny_dir

    return build_tiny_tokenizer(shared_tiny_dir(tmp_path_factory))
