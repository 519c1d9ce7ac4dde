"""Fast unit tests of the proxy's pure parts: output parsing, engine chunks, routing, retries, config."""

from __future__ import annotations

import argparse
import asyncio
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gyre.real.proxy.config import ProxyConfigError, EngineSpec, RetryPolicy, config_from_mapping, load_proxy_config
from gyre.real.proxy.engine_client import ChunkDecoder, EngineCallError, TokenChunk
from gyre.real.proxy.generation import Generation, Overloaded
from gyre.real.proxy.routing import Flight, Router, RoutingError
from gyre.real.proxy.toolcalls import OutputSplitter, _merged, format_tool_call, parse_output

pytestmark = pytest.mark.timeout(60)

# -- Qwen-style output parsing ------------------------------------------------------------

segments = st.one_of(
    st.text(alphabet="ab <>/\n{}\"", max_size=12),
    st.builds(format_tool_call, st.sampled_from(["Bash", "read"]),
              st.dictionaries(st.sampled_from(["command", "path"]), st.text(max_size=5), max_size=2)),
    st.just("<tool_call>not json</tool_call>"), st.just("<tool_call>{\"name\": \"x\""),
)


@settings(max_examples=200, deadline=None)
@given(think=st.one_of(st.none(), st.text(alphabet="ab <\n", max_size=10)), parts=st.lists(segments, max_size=4),
       cuts=st.lists(st.integers(0, 200), max_size=6))
def test_splitter_is_independent_of_how_the_stream_is_cut(think, parts, cuts):
    text = (f"<think>{think}</think>" if think is not None else "") + "".join(parts)
    whole = OutputSplitter()
    expected = whole.feed(text) + whole.finish()
    pieces, last = [], 0
    for cut in sorted(c for c in cuts if c <= len(text)) + [len(text)]:
        pieces.append(text[last:cut])
        last = cut
    splitter = OutputSplitter()
    events = [e for piece in pieces for e in splitter.feed(piece)] + splitter.finish()
    assert _merged(events) == _merged(expected)


def test_parse_output_thinking_text_and_calls():
    text = "<think>plan</think>\n\nRunning.\n" + format_tool_call("Bash", {"command": "ls"}) + "\n" + \
        format_tool_call("read", {"path": "a"})
    parsed = parse_output(text)
    assert (parsed.thinking, parsed.text) == ("plan", "Running.")
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("Bash", {"command": "ls"}), ("read", {"path": "a"})]
    broken = parse_output("x <tool_call>{oops}</tool_call>")
    assert broken.tool_calls == () and "<tool_call>{oops}</tool_call>" in broken.text
    assert parse_output("plan</think>answer", in_thinking=True).thinking == "plan"



def _split_whole(text: str, in_thinking: bool) -> tuple[str, str, tuple]:
    """What ``parse_output`` returns, taken from the splitter's events (no shortcut)."""
    splitter = OutputSplitter(in_thinking=in_thinking)
    events = splitter.feed(text) + splitter.finish()
    return ("".join(e.text for e in events if e.kind == "thinking").strip(),
            "".join(e.text for e in events if e.kind == "text"), tuple(e.call for e in events if e.call))


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(st.text(alphabet=" \n\tab.,<", max_size=16), st.text(max_size=16),
                      st.builds(lambda a, b: a + "<think>" + b, st.text(" \na", max_size=4),
                                st.text(" a", max_size=4))),
       in_thinking=st.booleans())
def test_parse_output_equals_the_splitter_with_or_without_a_tag(text, in_thinking):
    # ``parse_output`` answers a text with no ``<`` without the splitter (the recorder parses every
    # answer); whatever the text, it must say what the splitter's events say
    parsed = parse_output(text, in_thinking=in_thinking)
    assert (parsed.thinking, parsed.text, parsed.tool_calls) == _split_whole(text, in_thinking)


# -- SGLang stream chunks -----------------------------------------------------------------

def _sglang_chunks(ids, *, incremental):
    chunks = []
    for n in range(1, len(ids) + 1):
        part = ids[n - 1:n] if incremental else ids[:n]
        chunks.append({"output_ids": part, "meta_info": {
            "completion_tokens": n, "finish_reason": {"type": "stop"} if n == len(ids) else None,
            "output_token_logprobs": [[-0.1 * (k + 1), t, None] for k, t in enumerate(ids) if
                                      (k == n - 1 if incremental else k < n)]}})
    return chunks


@pytest.mark.parametrize("incremental", [False, True])
def test_chunk_decoder_handles_cumulative_and_incremental_streams(incremental):
    decoder = ChunkDecoder("e0")
    out = [decoder.decode(c) for c in _sglang_chunks([5, 6, 7], incremental=incremental)]
    assert [c.ids for c in out] == [(5,), (6,), (7,)]
    assert [c.logprobs for c in out] == [(-0.1,), (-0.2,), (pytest.approx(-0.3),)]
    assert out[-1].finish == {"type": "stop"}



@settings(max_examples=100, deadline=None, derandomize=True)
@given(ids=st.lists(st.integers(0, 150_000), min_size=1, max_size=60), cuts=st.lists(st.integers(1, 60), max_size=8))
def test_an_engine_doing_cumulative_work_sends_incremental_chunks(ids, cuts):
    """The bench's control engine (``ChunkWriter.delta_after_chunk``) sends the bytes of an
    incremental engine while it builds every cumulative chunk, as a cumulative engine does."""
    from proxy_fixtures import ChunkWriter

    plain, working, cumulative = (ChunkWriter("r", 0, 3) for _ in range(3))
    sent, bounds = 0, sorted({c for c in cuts if c < len(ids)} | {len(ids)})
    for bound in bounds:
        new, finish = ids[sent:bound], {"type": "length"} if bound == len(ids) else None
        assert working.delta_after_chunk(new, bound, finish) == plain.delta(new, bound, finish)
        cumulative.chunk(new, bound, finish)
        sent = bound
    assert (working.ids_text, working.logprobs_text) == (cumulative.ids_text, cumulative.logprobs_text)

def test_chunk_decoder_rejects_errors_and_inconsistent_chunks():
    with pytest.raises(EngineCallError):
        ChunkDecoder("e0").decode({"error": {"message": "boom"}})
    with pytest.raises(EngineCallError):
        ChunkDecoder("e0").decode({"output_ids": [1], "meta_info": {"completion_tokens": 2,
                                                                     "output_token_logprobs": [[-1, 1, None]]}})
    chunk = ChunkDecoder("e0").decode({"output_ids": [1], "meta_info": {"completion_tokens": 1,
                                                                         "output_token_logprobs": [[1e-9, 1, None]]}})
    assert chunk.logprobs == (0.0,)


# -- generation across moves and failures ------------------------------------------------

class FakeClient:
    """Serves ``answer`` token by token; ``plan`` lists per-submission behaviour."""

    def __init__(self, answer, plan):
        self.answer, self.plan, self.submissions, self.aborted = answer, list(plan), [], []

    async def stream(self, engine, rid, input_ids, sampling, attach=None, ids_json=None):
        action = self.plan.pop(0) if self.plan else "ok"
        self.submissions.append((engine.id, list(input_ids)))
        done = len(input_ids) - 2  # the prompt is two tokens
        for k, token in enumerate(self.answer[done:done + sampling["max_new_tokens"]]):
            if action == "fail" and k == 2:
                raise EngineCallError(engine.id, "reset")
            if action == "move" and k == 2:
                await asyncio.sleep(0.05)  # the source stalls, then the admin reroutes the execution
                self.router.reroute("x", "e1")
            finish = {"type": "stop"} if done + k + 1 == len(self.answer) else None
            yield TokenChunk((token,), (-0.5,), finish)
            await asyncio.sleep(0)

    async def abort(self, engine, rid):
        self.aborted.append((engine.id, rid))
        return True


def _run(router, client, attempts=3):
    generation = Generation(router, client, RetryPolicy(attempts=attempts, backoff_s=0), execution_id="x",
                            request_id="r", input_ids=[1, 2], sampling={"max_new_tokens": 50})

    async def consume():
        return [t for chunk in [c async for c in generation] for t in chunk.ids]

    return generation, asyncio.run(consume())


def _router():
    return Router([EngineSpec(id="e0", url="http://127.0.0.1:1"), EngineSpec(id="e1", url="http://127.0.0.1:2")])


def test_generation_continues_after_failures_without_gap_or_duplicate():
    answer = list(range(100, 110))
    router = _router()
    generation, tokens = _run(router, FakeClient(answer, ["fail", "fail", "ok"]))
    assert tokens == answer and generation.log.engines == ["e0", "e1", "e0"]
    assert router.engines["e0"].in_flight == router.engines["e1"].in_flight == 0


def test_generation_measures_the_stall_a_move_causes():
    answer = list(range(100, 110))
    router = _router()
    router.reroute("x", "e0")
    client = FakeClient(answer, ["move", "ok"])
    client.router = router
    generation, tokens = _run(router, client)
    assert tokens == answer and generation.log.engines == ["e0", "e1"] and generation.log.moves == 1
    [stall] = generation.log.move_stalls_s
    assert 0.05 <= stall < 5.0, stall
    failed, _ = _run(_router(), FakeClient(answer, ["fail", "ok"]))
    assert failed.log.move_stalls_s == [], "a failure is not a move"


def test_generation_gives_up_after_the_retry_budget():
    with pytest.raises(Overloaded):
        _run(_router(), FakeClient(list(range(10)), ["fail"] * 5), attempts=2)


def test_a_call_routed_to_a_held_engine_runs_elsewhere_and_its_route_waits_for_the_release():
    """A held engine (restarting) takes a route but no submission: the call goes to another engine without
    moving the route, and once released the engine serves its executions again."""
    router = _router()
    router.hold("e0")
    router.reroute("x", "e0")  # the core placed an execution on it: taken, not refused
    generation, tokens = _run(router, FakeClient([7, 8], ["ok"]))
    assert tokens == [7, 8] and generation.log.engines == ["e1"] and router.routes["x"] == "e0"
    assert router.snapshot()["engines"][0]["held"] is True
    router.hold("e0", held=False)
    generation, _ = _run(router, FakeClient([7, 8], ["ok"]))
    assert generation.log.engines == ["e0"]


def test_all_engines_draining_is_overload():
    router = _router()
    router.drain("e0")
    router.drain("e1")
    with pytest.raises(Overloaded):
        _run(router, FakeClient([1], []))


# -- the router as a state machine --------------------------------------------------------

class RouterMachine(RuleBasedStateMachine):
    """Random drains, reroutes and submissions; invariants from docs/scheduler.md#role-transitions."""

    def __init__(self):
        super().__init__()
        self.router = Router([EngineSpec(id=f"e{i}", url=f"http://127.0.0.1:{i + 1}") for i in range(3)])
        self.flights: list[Flight] = []

    @rule(execution=st.sampled_from(["a", "b", "c"]))
    def submit(self, execution):
        routed = self.router.engines.get(self.router.routes.get(execution, ""))
        engine = self.router.engine_for(execution)
        if engine is None:
            assert all(s.draining or s.held for s in self.router.engines.values())
            return
        assert not (engine.draining or engine.held)
        if routed is not None and routed.held:  # served elsewhere for now; the route waits for its release
            assert self.router.routes[execution] == routed.spec.id
        else:
            assert self.router.routes[execution] == engine.spec.id  # the route follows its requests
        flight = Flight(execution, f"r{len(self.flights)}")
        self.router.begin(flight, engine)
        self.flights.append(flight)

    @precondition(lambda self: self.flights)
    @rule(data=st.data())
    def finish(self, data):
        flight = self.flights.pop(data.draw(st.integers(0, len(self.flights) - 1)))
        self.router.end(flight, finished=True)

    @rule(engine=st.sampled_from(["e0", "e1", "e2"]), draining=st.booleans())
    def drain(self, engine, draining):
        self.router.drain(engine, draining)

    @rule(engine=st.sampled_from(["e0", "e1", "e2"]), held=st.booleans())
    def hold(self, engine, held):
        self.router.hold(engine, held)

    @rule(execution=st.sampled_from(["a", "b", "c"]), dest=st.sampled_from(["e0", "e1", "e2"]))
    def reroute(self, execution, dest):
        try:
            self.router.reroute(execution, dest)
        except RoutingError:
            assert self.router.engines[dest].draining  # a held engine still takes routes
            return
        assert self.router.routes[execution] == dest
        for flight in self.flights:
            if flight.execution_id == execution and flight.engine_id != dest:
                assert flight.moved, "every in-flight request elsewhere is moved"

    @invariant()
    def routes_name_known_engines_and_counts_match(self):
        assert set(self.router.routes.values()) <= set(self.router.engines)
        for engine_id, state in self.router.engines.items():
            assert state.in_flight == sum(1 for f in self.flights if f.engine_id == engine_id)


TestRouterMachine = RouterMachine.TestCase
TestRouterMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


# -- configuration and CLI ----------------------------------------------------------------

def test_config_files_and_errors(tmp_path):
    base = {"model_path": "m", "records_dir": "r", "admin_token": "long-enough-token",
            "engines": [{"id": "e0", "url": "http://127.0.0.1:1/"}]}
    (tmp_path / "p.json").write_text(json.dumps(base))
    config = load_proxy_config(tmp_path / "p.json")
    assert config.engines[0].url == "http://127.0.0.1:1" and config.fsync is True
    (tmp_path / "p.toml").write_text('model_path = "m"\nrecords_dir = "r"\nadmin_token = "long-enough-token"\n'
                                     '[[engines]]\nid = "e0"\nurl = "http://127.0.0.1:1"\n[retry]\nattempts = 2\n')
    assert load_proxy_config(tmp_path / "p.toml").retry.attempts == 2
    for change, needle in [({"bogus": 1}, "bogus"), ({"engines": []}, "engines"), ({"admin_token": "x"}, "admin_token"),
                           ({"retry": {"attempts": 0}}, "retry.attempts"),
                           ({"engines": [{"id": "e 0", "url": "http://x"}]}, "engines[].id"),
                           ({"engines": [{"id": "e0"}]}, "missing keys of engines[0]: ['url']"),
                           ({"engines": "e0"}, "engines must be a list of tables"),
                           ({"engines": ["e0"]}, "engines must be a list of tables"),
                           ({"retry": "fast"}, "retry must be a table of settings"),
                           ({"limits": [1]}, "limits must be a table of settings"),
                           ({"limits": {"client_write_timeout_s": "x"}}, "limits.client_write_timeout_s must be a number"),
                           ({"limits": {"max_body_bytes": None}}, "limits.max_body_bytes must be a number")]:
        with pytest.raises(ProxyConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")):
            config_from_mapping({**base, **change})
    for key in ("model_path", "records_dir", "admin_token"):  # named, not in Python's own wording
        with pytest.raises(ProxyConfigError, match=rf"missing configuration keys: \['{key}'\]"):
            config_from_mapping({k: v for k, v in base.items() if k != key})


def test_cli_registers_the_proxy_subcommand():
    from gyre.real.proxy import cli as proxy_cli

    parser = argparse.ArgumentParser()
    proxy_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["proxy", "--config", "x.json", "--port", "0"])
    assert args.func is proxy_cli.run and args.port == 0


@pytest.mark.parametrize("content", [None, "{not json", '{"bogus": 1}'])
def test_the_proxy_cli_names_a_bad_config_file_without_a_traceback(tmp_path, capsys, content):
    from gyre.real.proxy import cli as proxy_cli

    path = tmp_path / "proxy.json"
    if content is not None:
        path.write_text(content)
    assert proxy_cli.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gyre proxy: error: ") and (str(path) in err or "bogus" in err), err
    assert "Traceback" not in err


def test_a_second_proxy_on_a_records_folder_in_use_is_refused_naming_it(tmp_path, capsys, model):
    """Two proxies given one records folder would interleave its commit journal: the second exits with
    status 2 and names the folder, without a traceback, and writes nothing there."""
    from gyre.real.proxy import cli as proxy_cli
    from gyre.real.store.group_commit import GroupCommit
    from gyre.real.store.tito_log import ExecutionStore

    records = tmp_path / "records"
    first = GroupCommit(ExecutionStore(records, fsync=True))  # what the first proxy holds
    try:
        before = sorted(p.name for p in records.iterdir())
        path = tmp_path / "proxy.json"
        path.write_text(json.dumps({"model_path": str(model), "records_dir": str(records), "fsync": True, "admin_token": "t" * 24,
                                    "engines": [{"id": "e0", "url": "http://127.0.0.1:9"}]}))
        assert proxy_cli.main(["--config", str(path), "--port", "0"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("gyre proxy: error: ") and f"{records} is in use" in err, err
        assert "Traceback" not in err and sorted(p.name for p in records.iterdir()) == before
    finally:
        first.close()


def _listed(found):
    covered, ids = found
    assert ids.dtype == np.int32, ids.dtype  # an array, never a Python list (proxy hot path)
    return covered, ids.tolist()


def test_prefix_cache_reuses_the_longest_exact_text_prefix():
    from gyre.real.proxy.tokenize import PrefixCache

    sequences = {0: [1, 2, 3, 4], 1: [1, 2, 3, 4, 5, 6, 7]}
    cache = PrefixCache(sequences.__getitem__, size=2)
    cache.add("ab", "cd", 2, 0)  # prompt "ab" -> [1, 2], output "cd" -> [3, 4]
    assert _listed(cache.best_prefix("abcdXY")) == (4, [1, 2, 3, 4])
    assert _listed(cache.best_prefix("abZZ")) == (2, [1, 2])
    assert _listed(cache.best_prefix("xbcd")) == (0, [])
    cache.add("abcdef", "g", 6, 1)
    assert _listed(cache.best_prefix("abcdefgh")) == (7, [1, 2, 3, 4, 5, 6, 7])


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.text("ab", max_size=4), st.text("ab", max_size=3)), max_size=6),
       st.text("ab", max_size=8), st.integers(1, 4))
def test_prefix_cache_finds_what_a_scan_of_every_cached_text_finds(calls, text, size):
    """``best_prefix`` is the longest cached prompt or prompt + output that begins ``text``, the newest
    call's on a tie, among the last ``size`` calls (a plain scan with string comparisons)."""
    from gyre.real.proxy.tokenize import PrefixCache

    sequences = {key: list(range(100 * key, 100 * key + len(p) + len(o))) for key, (p, o) in enumerate(calls)}
    cache = PrefixCache(sequences.__getitem__, size=size)
    for key, (prompt, output) in enumerate(calls):
        cache.add(prompt, output, len(prompt), key)
    expected = (0, [])
    for key in reversed(range(len(calls))[-size:]):
        prompt, output = calls[key]
        for cached, ids in ((prompt + output, sequences[key]), (prompt, sequences[key][:len(prompt)])):
            if len(cached) > expected[0] and text.startswith(cached):
                expected = (len(cached), ids)
                break
    assert _listed(cache.best_prefix(text)) == expected


def test_chunks_of_one_read_merge_in_order():
    from gyre.real.proxy.engine_client import merge_chunks

    parts = [TokenChunk((1, 2), (-0.1, -0.2), None, "3"), TokenChunk((), (), None, None),
             TokenChunk((5,), (-0.5,), {"type": "stop"}, None)]
    merged = merge_chunks(parts)
    assert merged == TokenChunk((1, 2, 5), (-0.1, -0.2, -0.5), {"type": "stop"}, "3")
    assert merge_chunks(parts[:1]) is parts[0]


def test_request_ids_are_fixed_width_hex_and_unique_within_and_across_services():
    """24 hex digits (so request id + tool-call index never collide), none repeated by one service or
    by a second one (a restarted proxy): each has its own random prefix."""
    from types import SimpleNamespace

    from gyre.real.proxy.model_call import ChatService

    services = [ChatService(SimpleNamespace(policy_version=0), None, None, None, None) for _ in range(2)]
    ids = [service._request_id() for service in services for _ in range(3000)]
    assert all(len(i) == 24 and int(i, 16) >= 0 for i in ids)
    assert len(set(ids)) == len(ids)
    assert services[0]._request_id()[:16] != services[1]._request_id()[:16]
    for service in services:
        service.close()


_SAMPLING_OPTIONS = ([16, 64], [None, 1, 1.0, 0.5, True], [None, 1, 1.0], [None, 1, 40], [[], ["\n"], ["\n", "END"]],
                     [None, True, False, 1])


@settings(max_examples=100, deadline=None)
@given(changes=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 4)), min_size=1, max_size=12),
       keep=st.sampled_from([2, 64]))
def test_sampling_hints_are_the_json_of_each_call_s_own_settings(changes, keep):
    """The record's ``sampling`` and ``requested`` hints are kept per setting (``ChatService._sampling_json``):
    whatever came before (``1`` then ``1.0``, ``True`` then ``1``, a full cache), each call's hints are
    the sorted JSON of its own parameters. Each call changes one parameter of the call before it."""
    from types import SimpleNamespace

    from gyre.real.proxy import model_call
    from gyre.real.proxy.model_call import ChatRequest, ChatService

    service = ChatService(SimpleNamespace(policy_version=0, harness="h"), SimpleNamespace(stop_token_ids=[2]),
                          None, None, None)
    kept = model_call.SAMPLING_JSON_KEEP
    model_call.SAMPLING_JSON_KEEP = keep
    try:
        setting = [options[0] for options in _SAMPLING_OPTIONS]
        for field, pick in changes:
            setting[field] = _SAMPLING_OPTIONS[field][pick % len(_SAMPLING_OPTIONS[field])]
            max_tokens, temperature, top_p, top_k, stop, thinking = setting
            request = ChatRequest(api="anthropic", model="m", messages=[{"role": "user", "content": "hi"}],
                                  max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                                  stop=list(stop), thinking=thinking)
            hints: dict[str, str] = {}
            sampling = service.sampling(request)
            service._request_hints(hints, SimpleNamespace(request=request, reused_ids=0), sampling)
            assert hints["sampling"] == json.dumps(sampling, sort_keys=True)
            assert hints["requested"] == json.dumps(request.sampling_record(), sort_keys=True)
            assert len(service._sampling_json) <= keep
    finally:
        model_call.SAMPLING_JSON_KEEP = kept
        service.close()
