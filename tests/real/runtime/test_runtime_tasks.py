"""Task sets, harness and evaluator plug-ins, and their checks at job load (``harness.taskset``, ``harness.plugins``).

Checked: a JSONL task set round-trips through the loader for generated tasks
(Hypothesis: ids under both id rules, unicode prompts, nested file paths,
setup commands, evaluator arguments); a malformed line, an unknown key, a bad
or core-shaped id, a duplicate id, an unsafe path or a missing copy folder is
an error naming the file and the line; the task id rule agrees with the
proxy's ``valid_id``; ``task(query)`` is a pure function of (seed, query);
harness and evaluator specs resolve or fail naming the field; a job file with
a bad harness, evaluator or task set fails at load, naming the file; the
evaluator of an execution is the one of the task set up in its directory, and
an execution whose setup never finished has no evaluable work (None).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from hypothesis_budget import examples  # noqa: E402

from gyre.real.harness.plugins import resolve_class, resolve_harness  # noqa: E402
from gyre.real.harness.runner import MiniSweAgent, ScriptedHarness, Task  # noqa: E402
from gyre.real.harness.tasks import EvaluatorFailure  # noqa: E402
from gyre.real.harness.taskset import id_problem, load_taskset, read_specs  # noqa: E402
from gyre.real.proxy.config import valid_id  # noqa: E402
from gyre.real.runtime.job import load_job_config  # noqa: E402
from gyre.real.toy.tasks import EmitCharTask  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
TOY = "gyre.real.toy.tasks:EmitTokenTask"

ids = st.from_regex(r"[A-Za-z][A-Za-z0-9._:-]{0,30}", fullmatch=True).filter(lambda s: id_problem(s) is None)
paths = st.lists(st.from_regex(r"[a-z_][a-z0-9_]{0,6}(\.py)?", fullmatch=True), min_size=1, max_size=3).map("/".join)
tasks = st.builds(
    lambda i, prompt, files, setup, args: {"id": i, "prompt": prompt,
                                           "workspace": {"files": files, "setup": setup},
                                           "evaluator_args": args},
    ids, st.text(min_size=1).filter(str.strip), st.dictionaries(paths, st.text(), max_size=3),
    st.lists(st.text(min_size=1).filter(str.strip), max_size=2),
    st.fixed_dictionaries({}, optional={"target": st.text(min_size=1, max_size=5)}))


def write(tmp: Path, lines: list) -> Path:
    path = tmp / "tasks.jsonl"
    text = "".join((line if isinstance(line, str) else json.dumps(line, ensure_ascii=False)) + "\n" for line in lines)
    path.write_text(text, encoding="utf-8")
    return path


@settings(max_examples=examples(60))
@given(st.lists(tasks, min_size=1, max_size=5, unique_by=lambda t: t["id"]), st.integers(0, 3))
def test_generated_task_sets_round_trip(tmp_path_factory, generated, blanks):
    tmp = tmp_path_factory.mktemp("ts")
    path = write(tmp, [""] * blanks + generated)
    taskset = load_taskset(path, TOY)
    assert [s.task_id for s in taskset.specs] == [t["id"] for t in generated]
    for spec, task in zip(taskset.specs, generated):
        assert (spec.prompt, dict(spec.files), list(spec.setup)) == (
            task["prompt"], task["workspace"]["files"], task["workspace"]["setup"])
        assert spec.line == blanks + generated.index(task) + 1
        assert taskset.evaluators[spec.task_id].target == task["evaluator_args"].get("target", "gyre")


@settings(max_examples=examples(60))
@given(st.lists(tasks, min_size=2, max_size=5, unique_by=lambda t: t["id"]), st.data())
def test_a_broken_line_is_named_by_its_number(tmp_path_factory, generated, data):
    tmp = tmp_path_factory.mktemp("ts")
    bad = data.draw(st.integers(0, len(generated) - 1))
    breakage = data.draw(st.sampled_from(["json", "key", "id", "dup", "path", "prompt"]))
    lines: list = list(generated)
    if breakage == "json":
        lines[bad] = json.dumps(generated[bad])[:-1]
    elif breakage == "key":
        lines[bad] = dict(generated[bad], extra=1)
    elif breakage == "id":
        lines[bad] = dict(generated[bad], id=data.draw(st.sampled_from(["", ".hidden", "a/b", "q7", "x" * 129])))
    elif breakage == "dup":
        bad = max(bad, 1)
        lines[bad] = dict(generated[bad], id=generated[0]["id"])
    elif breakage == "path":
        lines[bad] = dict(generated[bad], workspace={"files": {data.draw(st.sampled_from(["../up", "/abs", ""])): ""}})
    else:
        lines[bad] = dict(generated[bad], prompt="  ")
    path = write(tmp, lines)
    with pytest.raises(ValueError) as info:
        read_specs(path)
    assert f"{path} line {bad + 1}:" in str(info.value)
    if breakage == "dup":
        assert "duplicate task id" in str(info.value) and "first on line 1" in str(info.value)


@given(st.text(max_size=140))
def test_the_task_id_rule_is_the_proxys(value):
    core_shaped = len(value) > 1 and value[0] in "xgq" and value[1:].isascii() and value[1:].isdigit()
    assert (id_problem(value) is None) == (valid_id(value) and not core_shaped)


def test_task_choice_is_a_pure_function_of_seed_and_query(tmp_path):
    path = write(tmp_path, [{"id": f"t{i}", "prompt": f"p{i}"} for i in range(5)])
    a, b, c = load_taskset(path, TOY, seed=1), load_taskset(path, TOY, seed=1), load_taskset(path, TOY, seed=2)
    picks = [a.task(f"q{g}").task_id for g in range(40)]
    assert picks == [b.task(f"q{g}").task_id for g in range(40)]
    assert picks != [c.task(f"q{g}").task_id for g in range(40)]
    assert set(picks) == {f"t{i}" for i in range(5)}  # 40 draws cover 5 tasks
    assert a.task("q3").prompt == a.by_id[a.task("q3").task_id].prompt


def test_copy_folders_resolve_beside_the_jsonl_and_must_exist(tmp_path):
    (tmp_path / "repo").mkdir()
    spec = read_specs(write(tmp_path, [{"id": "a", "prompt": "p", "workspace": {"copy": "repo"}}]))[0]
    assert spec.copy == str((tmp_path / "repo").resolve())
    with pytest.raises(ValueError, match=r"line 1: workspace.copy: 'nope' is not a directory"):
        read_specs(write(tmp_path, [{"id": "a", "prompt": "p", "workspace": {"copy": "nope"}}]))


def test_evaluator_arguments_the_class_refuses_are_named_by_line(tmp_path):
    path = write(tmp_path, [{"id": "a", "prompt": "p"}, {"id": "b", "prompt": "p", "evaluator_args": {"nope": 1}}])
    with pytest.raises(ValueError, match=r"line 2: job field evaluator_args: .*nope"):
        load_taskset(path, TOY)


@pytest.mark.parametrize("spec, message", [
    ("scripted-ish", "must be one of"),
    ("no_such_module_xyz:Thing", "module 'no_such_module_xyz' does not import"),
    ("gyre.real.harness.runner:Nope", "has no attribute 'Nope'"),
    ("gyre.real.harness.runner:", 'must be "module:Class"'),
    ("gyre.real.harness.runner:Task", "has no command() method"),
    ("gyre.real.harness.runner:asyncio", "is not a class"),
    ("a:b:c", 'must be "module:Class"'),
])
def test_a_bad_harness_is_named(spec, message):
    with pytest.raises(ValueError, match="job field harness") as info:
        resolve_harness(spec)
    assert message in str(info.value)


def test_harnesses_resolve_by_name_or_class_with_options():
    assert resolve_harness("scripted", {"calls": 3}) == ScriptedHarness(calls=3)
    assert resolve_harness("mini-swe-agent", {"binary": "/x/mini"}).binary == "/x/mini"
    assert resolve_harness("gyre.real.harness.runner:MiniSweAgent") == MiniSweAgent()
    with pytest.raises(ValueError, match=r"job field harness_options: 'codex' rejects options .*warp"):
        resolve_harness("codex", {"warp": 9})
    assert resolve_class("gyre.real.toy.tasks:EmitCharTask", "evaluator") is EmitCharTask
    with pytest.raises(ValueError, match="job field evaluator must be"):
        resolve_class("EmitCharTask", "evaluator")


def test_an_execution_is_scored_by_the_task_set_up_in_its_directory(tmp_path):
    path = write(tmp_path, [{"id": "one", "prompt": "p", "evaluator_args": {"target": "one"}},
                            {"id": "two", "prompt": "p", "evaluator_args": {"target": "two"}}])
    taskset = load_taskset(path, TOY)
    wrapped = taskset.harness(ScriptedHarness(calls=1))
    runs = {}
    for name in ("one", "two"):
        home = tmp_path / f"exec-{name}" / "home"
        (home.parent / "workspace").mkdir(parents=True)
        home.mkdir()
        argv, env = wrapped.command(Task(task_id=name, prompt="p"), "http://127.0.0.1:1", "k", home)
        assert argv[1:4] == ["-m", "gyre.real.harness.workspace_setup", str(home.parent / "setup.json")]
        assert argv[4] == "--" and "gyre.real.harness.scripted" in argv and env["OPENAI_API_KEY"] == "k"
        assert json.loads((home.parent / "setup.json").read_text())["task_id"] == name
        (home.parent / "workspace" / "answer.txt").write_text("one one two")
        assert taskset.evaluate("x1", home.parent / "workspace") is None  # setup never finished: placeholder
        (home.parent / "setup.done").write_text("ok\n")  # what workspace_setup writes when it finished
        runs[name] = taskset.evaluate("x1", home.parent / "workspace").score
    assert runs == {"one": pytest.approx(2 / 3), "two": pytest.approx(1 / 3)}
    (tmp_path / "exec-never" / "workspace").mkdir(parents=True)
    with pytest.raises(EvaluatorFailure, match="no task was set up"):
        taskset.evaluate("x9", tmp_path / "exec-never" / "workspace")


def job_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "job.toml"
    path.write_text("[job]\nsteps = 2\n" + body)
    return path


@pytest.mark.parametrize("body, message", [
    ("harness = 'nano-agent'\n", "job field harness must be one of"),
    ("harness = 'nowhere_mod:Agent'\n", "module 'nowhere_mod' does not import"),
    ("tasks = 'T'\n", "tasks and evaluator go together"),
    ("evaluator = 'gyre.real.toy.tasks:EmitTokenTask'\n", "tasks and evaluator go together"),
    ("tasks = 'T'\nevaluator = 'gyre.real.toy.tasks:Missing'\n", "has no attribute 'Missing'"),
    ("tasks = 'T'\nevaluator = 'gyre.real.runtime.job:JobConfig'\n", "has no evaluate() method"),
    ("tasks = 'BAD'\nevaluator = 'gyre.real.toy.tasks:EmitTokenTask'\n", "line 2: duplicate task id 'a'"),
    ("tasks = 'NONE'\nevaluator = 'gyre.real.toy.tasks:EmitTokenTask'\n", "No such file"),
    ("[job.harness_options]\nturbo = true\n", "'scripted' rejects options"),
    ("[job.harness_options]\nsleep_s = -1.0\n", "sleep_s must be a finite number of seconds >= 0, got -1.0"),
    ("[job.harness_options]\nretries = -1\n", "retries must be >= 0, got -1"),
    ("device = 'tpu'\n", "device must be cpu or cuda"),
    ("layout = {gpus_per_node = 8}\n", "layout applies to device = \"cuda\" only"),
    ("device = 'cuda'\n", "needs a [model] checkpoint"),
])
def test_a_bad_harness_evaluator_or_task_set_fails_at_load(tmp_path, body, message):
    good = write(tmp_path, [{"id": "a", "prompt": "p"}])
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "a", "prompt": "p"}) + "\n" + json.dumps({"id": "a", "prompt": "q"}) + "\n")
    body = body.replace("'T'", repr(str(good))).replace("'BAD'", repr(str(bad)))
    body = body.replace("'NONE'", repr(str(tmp_path / "none.jsonl")))
    path = job_file(tmp_path, body)
    with pytest.raises(ValueError) as info:
        load_job_config(path)
    assert message in str(info.value) and str(path) in str(info.value)


def test_the_shipped_repair_job_loads_with_its_task_set():
    job = load_job_config(ROOT / "configs" / "repair_cpu.toml")
    assert job.harness.build() == ScriptedHarness(calls=3, compact_every=0, subagent_at=())
    taskset = job.tasks.build(job.seed)
    assert [s.task_id for s in taskset.specs] == ["repair-textkit", "repair-statkit", "repair-spans",
                                                  "repair-wordcount"]
    assert type(taskset.evaluators["repair-spans"]).__name__ == "RepairEvaluator"
    assert isinstance(load_job_config(ROOT / "configs" / "cpu_demo.toml").tasks.build(0), EmitCharTask)
