"""``gyre.overrides``: one ``--set section.field=value`` syntax, errors naming the flag and the field.

Checked: the dotted form and the short form (the first section with that
field takes it); unknown sections and fields are named with the known ones;
any string from a command line either parses or raises ``OverrideError``
starting with the flag and the text (Hypothesis); TOML values are typed and a
bare word is text; ``gyre sim``'s ``--set`` gives the same schedule as before
for the short form and accepts the dotted one.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gyre.config import SchedulerConfig, parse_overrides
from gyre.overrides import OverrideError, check_type, parse_assignments, toml_value

SECTIONS = {"job": ("steps", "workdir", "B"), "schedule": ("phi", "B", "streaming"), "cluster": None}


def test_dotted_and_short_forms():
    got = parse_assignments("--set", ["schedule.phi=0.5", "steps = 8", "B=4", "schedule.B=2", "cluster.address=auto"],
                            SECTIONS)
    assert [(a.section, a.field, a.raw) for a in got] == [
        ("schedule", "phi", "0.5"), ("job", "steps", "8"), ("job", "B", "4"), ("schedule", "B", "2"),
        ("cluster", "address", "auto")]


@pytest.mark.parametrize("text, message", [
    ("warp=9", "--set warp=9: unknown field 'warp' (in no section: job, schedule, cluster)"),
    ("sched.phi=1", "--set sched.phi=1: unknown section 'sched'; sections: job, schedule, cluster"),
    ("schedule.warp=1", "--set schedule.warp=1: unknown field 'warp' in schedule; its fields: phi, B, streaming"),
    ("phi", "--set phi: expected section.field=value"),
    ("=3", "--set =3: expected section.field=value"),
    ("cluster.a.b=1", "unknown field 'a.b' in cluster"),
])
def test_errors_name_the_flag_and_the_field(text, message):
    with pytest.raises(OverrideError) as info:
        parse_assignments("--set", [text], SECTIONS)
    assert message in str(info.value)


@given(st.text(max_size=40))
def test_any_command_line_string_parses_or_is_named(text):
    try:
        [a] = parse_assignments("--set", [text], SECTIONS)
    except OverrideError as exc:
        assert str(exc).startswith(f"--set {text}:")
    else:
        assert a.section in SECTIONS and (SECTIONS[a.section] is None or a.field in SECTIONS[a.section])


def value(text: str, default):
    [a] = parse_assignments("--set", [text], SECTIONS)
    return check_type(a, toml_value(a), default)


def test_values_are_typed_and_a_bare_word_is_text():
    assert value("steps=8", 4) == 8 and value("phi=1", 0.5) == 1.0 and value("streaming=false", True) is False
    assert value("workdir=runs/x", "runs/cpu-demo") == "runs/x"   # once "Invalid value (at line 1, column 5)"
    assert value('workdir="a b"', "") == "a b"
    with pytest.raises(OverrideError, match=r"--set steps=abc: job.steps takes an integer, not 'abc'"):
        value("steps=abc", 4)
    with pytest.raises(OverrideError, match="takes an integer"):
        value("steps=true", 4)
    with pytest.raises(OverrideError, match="is not a TOML value"):
        value("workdir=[1,", "")


def test_gyre_sim_short_form_gives_the_schedule_it_gave_before():
    from gyre.sim.cli import _overrides

    pairs = ["phi=1.0", "streaming=off", "mu=2", "tau=0"]
    assert _overrides(pairs) == (parse_overrides(pairs), [])
    dotted, costs = _overrides([f"schedule.{p}" for p in pairs] + ["costs.publish_s=60"])
    assert dotted == parse_overrides(pairs) and costs == ["publish_s=60"]
    assert set(dotted) <= {f.name for f in dataclasses.fields(SchedulerConfig)}


def test_gyre_sim_prints_the_defaults_a_trace_json_supplies(tmp_path, capsys):
    import numpy as np
    import pandas as pd

    from gyre.cli import main
    from gyre.formats.trace_meta import TraceMeta, write_trace_meta
    from gyre.presets import ClusterShape

    rng = np.random.default_rng(4)
    path = tmp_path / "trace.csv"
    pd.DataFrame([{"query_id": q, "execution_index": i, "duration_s": float(rng.uniform(2, 6)),
                   "outcome": "completed"} for q in range(12) for i in range(8)]).to_csv(path, index=False)
    write_trace_meta(path, TraceMeta("gyre-1", ClusterShape(nodes=2, nodes_per_cell=1, per_node_capacity=8, N=8,
                                                            B=2), {"tau": 0.0}, "gyre run"))
    assert main(["sim", "--trace", str(path), "--steps", "2"]) == 0
    err = capsys.readouterr().err
    assert "has a trace.json (written by gyre run)" in err and "preset gyre-1 (from trace.json)" in err
    assert "{'tau': 0.0}" in err
    assert main(["sim", "--trace", str(path), "--steps", "2", "--preset", "async-1"]) == 0
    assert "preset async-1," in (err := capsys.readouterr().err) and "schedule from trace.json {}" in err
