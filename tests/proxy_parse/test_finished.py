"""``Finished.deferred`` (``proxy.request``): text and thinking computed once, on first read."""

from __future__ import annotations

import pytest

from gyre.real.proxy.request import Finished


def test_a_deferred_finished_computes_its_text_once_on_first_read_and_equals_an_eager_one():
    calls = []

    def parts():
        calls.append(1)
        return "the text", "the thinking"

    values = dict(output_ids=[1, 2], logprobs=[-0.1, -0.2], tool_calls=[], stop_reason="stop", stop_sequence=None,
                  input_tokens=3, output_tokens=2, tokens=[])
    deferred = Finished.deferred(parts, **values)
    assert calls == [] and deferred.output_tokens == 2 and deferred.stop_reason == "stop"
    assert (deferred.thinking, deferred.text, deferred.text) == ("the thinking", "the text", "the text")
    assert calls == [1]
    assert deferred == Finished(text="the text", thinking="the thinking", **values)
    with pytest.raises(AttributeError):
        deferred.missing  # noqa: B018 - any other attribute is still an AttributeError
