"""Load: 384 concurrent streaming executions through one proxy process, no lost or duplicated record.

The proxy runs as its own process (``python -m gyre.real.proxy.cli``, records
fsynced); a fast scripted engine and the 384 clients share the test process.
Each execution runs a two-call tool loop, so 768 calls must leave exactly two
records per execution log, with unique request ids, each a full answer.
"""

from __future__ import annotations

import asyncio
import signal

import numpy as np
import pytest

try:
    from proxy_fixtures import (ScriptedEngine, ServerThread, build_tiny_tokenizer, shared_tiny_dir,
                                start_proxy_process, token_logprob, tool_loop_execution, tool_loop_script)
except ImportError:
    from .proxy_fixtures import (ScriptedEngine, ServerThread, build_tiny_tokenizer, shared_tiny_dir,
                                 start_proxy_process, token_logprob, tool_loop_execution, tool_loop_script)

EXECUTIONS = 384


async def _drive(url: str, keys: list[str]) -> list:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        return await asyncio.gather(*(tool_loop_execution(session, url, key) for key in keys),
                                    return_exceptions=True)


@pytest.mark.timeout(180)
def test_384_concurrent_streaming_executions(tmp_path_factory, tmp_path):
    from gyre.real.store.tito_log import ExecutionStore

    model = build_tiny_tokenizer(shared_tiny_dir(tmp_path_factory))
    engine = ScriptedEngine(model, tool_loop_script(command="echo hello"), chunk_tokens=2)
    keys = {f"load-key-{i}": f"load-{i:03d}" for i in range(EXECUTIONS)}
    with ServerThread(engine.application) as engine_thread:
        config = {"model_path": str(model), "records_dir": str(tmp_path / "records"), "fsync": True,
                  "admin_token": "admin-secret-token", "engines": [{"id": "e0", "url": engine_thread.url}],
                  "executions": keys}
        process, url = start_proxy_process(config, tmp_path / "proxy.json")
        try:
            results = asyncio.run(_drive(url, list(keys)))
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(20)
    failures = [r for r in results if isinstance(r, BaseException)]
    assert not failures, failures[:3]
    store = ExecutionStore(tmp_path / "records")
    assert store.executions() == sorted(keys.values())
    request_ids = set()
    for execution in keys.values():
        records = store.read(execution)
        assert len(records) == 2, execution
        for record in records:
            assert record.execution_id == execution and record.request_id not in request_ids
            request_ids.add(record.request_id)
            out = record.output_ids.tolist()
            np.testing.assert_allclose(record.output_logprobs, [token_logprob(t, k) for k, t in enumerate(out)])
        assert records[1].input_ids[: len(records[0].sequence)].tolist() == records[0].sequence.tolist()
    assert len(engine.requests) == 2 * EXECUTIONS
