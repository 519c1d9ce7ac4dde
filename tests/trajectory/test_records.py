"""TITO record validation and binary codec (records.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from gyre.trajectory.records import ModelCall, Provenance, RecordError


def make(**overrides):
    fields = dict(execution_id="e1", request_id="r1", input_ids=[1, 2, 3], output_ids=[4, 5],
                  output_logprobs=[-0.5, -1.0], policy_version=3)
    fields.update(overrides)
    return ModelCall(**fields)


@pytest.mark.parametrize("overrides, message", [
    (dict(output_logprobs=[-0.5]), "one value per output token"),
    (dict(output_logprobs=[-0.5, 0.1]), "finite and <= 0"),
    (dict(output_logprobs=[-0.5, float("nan")]), "finite and <= 0"),
    (dict(output_logprobs=[float("-inf"), -1.0]), "finite and <= 0"),
    (dict(output_logprobs=[-0.5, float("inf")]), "finite and <= 0"),
    (dict(input_ids=np.array([1, -2], dtype=np.int32)), "outside"),
    (dict(input_ids=[1, 2**31]), "outside"),
    (dict(output_ids=np.array([4, 2**31], dtype=np.uint32)), "outside"),
    (dict(output_ids=np.array([True, False])), "integer token ids"),
    (dict(input_ids=[]), "input_ids must not be empty"),
    (dict(input_ids=[1, -2]), "outside"),
    (dict(output_ids=[1.5, 2.0]), "integer token ids"),
    (dict(execution_id=""), "execution_id"),
    (dict(request_id="a/b"), "request_id"),
    (dict(policy_version=-1), "policy_version"),
    (dict(policy_version=True), "policy_version"),
    (dict(started_at=2.0, finished_at=1.0), "finished_at"),
    (dict(input_provenance=[0, 1, 0]), "input_provenance may only contain EXTERNAL/EVALUATOR"),
    (dict(input_provenance=[0, 0]), "one value per token"),
    (dict(output_provenance=[0, 7]), "output_provenance may only contain"),
    (dict(role_hints={"system": 3}), "role_hints"),
    (dict(tool_calls=({"name": "x"},)), "tool_calls"),
    (dict(tool_calls=({"id": "c1", "raw": b"bytes"},)), "JSON-serializable"),
    (dict(role_hints=["system"]), "role_hints"),
])
def test_malformed_records_raise_naming_the_field(overrides, message):
    with pytest.raises(RecordError, match=message):
        make(**overrides)



class _Str(str):
    pass


@settings(max_examples=examples(200), deadline=None)
@given(ids=st.lists(st.sampled_from([0, 1, 7, 2**31 - 1, -1, 2**31, 2**40]), min_size=1, max_size=6),
       logprobs=st.lists(st.sampled_from([0.0, -0.5, -1e300, 0.1, float("nan"), float("inf"), float("-inf")]),
                         min_size=1, max_size=6),
       dtype=st.sampled_from([np.int64, np.uint64, np.int32]), pad=st.sampled_from([0, 1, 63, 64, 200]),
       at=st.integers(0, 1000))
def test_checks_say_the_same_on_short_and_long_arrays(ids, logprobs, dtype, pad, at):
    # arrays up to records.SMALL_ARRAY are checked in Python, longer ones by numpy reductions: the
    # verdict (and the message) must not depend on which, nor on where in the array a bad value lies
    ids = [i for i in ids if np.iinfo(dtype).min <= i <= np.iinfo(dtype).max] or [0]
    where = at % (pad + 1)
    id_array = np.array([1] * where + ids + [2] * (pad - where), dtype=dtype)
    lp_array = np.array([-0.25] * where + logprobs + [-0.75] * (pad - where))
    ids_ok = bool(((id_array.astype(object) >= 0) & (id_array.astype(object) < 2**31)).all())
    lp_ok = bool((np.isfinite(lp_array) & (lp_array <= 0)).all())
    for name, array, ok, message in (("input_ids", id_array, ids_ok, "outside"),
                                     ("output_logprobs", lp_array, lp_ok, "finite and <= 0")):
        fields = {"output_ids": np.zeros(len(lp_array), dtype=np.int32)} if name == "output_logprobs" else {
            "output_ids": [], "output_logprobs": []}
        if ok:
            make(**fields, **{name: array})
        else:
            with pytest.raises(RecordError, match=message):
                make(**fields, **{name: array})


@pytest.mark.parametrize("hints, ok", [
    ({"a": "b"}, True), ({_Str("a"): _Str("b")}, True), ({"a": b"b"}, False), ({1: "b"}, False),
    ({"a": "b", "c": None}, False), ({}, True),
])
def test_role_hints_accept_str_and_its_subclasses_only(hints, ok):
    if ok:
        assert make(role_hints=hints).role_hints == hints
    else:
        with pytest.raises(RecordError, match="role_hints"):
            make(role_hints=hints)


def test_arrays_are_read_only_and_derived_views_are_consistent():
    call = make(input_provenance=[0, 2, 0])
    assert not call.input_ids.flags.writeable and not call.output_logprobs.flags.writeable
    assert call.sequence.tolist() == [1, 2, 3, 4, 5]
    assert call.provenance.tolist() == [0, 2, 0, int(Provenance.SAMPLED), int(Provenance.SAMPLED)]


records = st.builds(
    lambda n_in, n_out, seed, prov, version, hints: _random_record(n_in, n_out, seed, prov, version, hints),
    st.integers(1, 40), st.integers(0, 40), st.integers(0, 2**32 - 1), st.booleans(), st.integers(0, 10**6),
    st.dictionaries(st.sampled_from(["system", "last_user", "x-openai-subagent"]), st.text(max_size=20)),
)


def _random_record(n_in, n_out, seed, with_prov, version, hints):
    rng = np.random.default_rng(seed)
    return ModelCall(
        execution_id="exec.1", request_id=f"req-{seed}", input_ids=rng.integers(0, 2**31, n_in),
        output_ids=rng.integers(0, 2**31, n_out), output_logprobs=-rng.exponential(1.0, n_out),
        policy_version=version, engine_id="engine-3", started_at=1.5, finished_at=2.25, role_hints=hints,
        tool_calls=({"id": "call_1", "name": "Read", "arguments": '{"a": 1}'},),
        input_provenance=rng.choice([0, 2], n_in) if with_prov else None,
        output_provenance=rng.choice([0, 1], n_out) if with_prov else None,
    )


@settings(max_examples=examples(60), deadline=None)
@given(records)
def test_binary_codec_round_trips_exactly(call):
    again = ModelCall.from_bytes(call.to_bytes())
    assert again == call
    assert again.output_logprobs.tobytes() == call.output_logprobs.tobytes()


def test_decoding_garbage_raises_record_error():
    payload = make().to_bytes()
    with pytest.raises(RecordError):
        ModelCall.from_bytes(payload[:-3])
    with pytest.raises(RecordError):
        ModelCall.from_bytes(b"\x05\x00\x00\x00{bad}")
