"""The repair task family: its data, its test-running evaluator, the workspace setup and the edit tool.

Checked, by actually running each repository's tests in a subprocess:
- the data's invariants: on the correct sources every test passes; with the
  bugs planted exactly the declared tests fail; the shipped
  ``configs/tasks/repair.jsonl`` is what the generator writes;
- the evaluator's rules (``harness.repair``): an untouched workspace scores
  the base share (1 - broken/total, from the declared broken tests), the
  reference fix scores 1.0, half a repair scores in between; edited or deleted
  test files are restored (no effect); a syntax error or a deleted module
  fails every test that imports it; a non-terminating test is cut at the
  timeout and the tests that finished still count; a workspace without the
  repository is no evaluable work (None); a runner that cannot start is an
  ``EvaluatorFailure``; the result is bound to the workspace's content hash,
  identical on a second evaluation, and the workspace is left untouched;
- ``workspace_setup`` copies, writes and runs setup commands, marks the
  setup done, then execs the harness; it exits 4 naming a failing setup
  command and leaves no mark;
- the scripted harness's edit tool applies exact, unique replacements only
  inside the workspace.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gyre.real.harness import repair
from gyre.real.harness.repair import RepairEvaluator, build_tasks, jsonl, planted
from gyre.real.harness.repair_repos import REPOS
from gyre.real.harness.scripted import apply_edits
from gyre.real.harness.tasks import EvaluatorFailure, artifact_version
from gyre.real.harness.taskset import load_taskset
from gyre.real.harness.workspace_setup import build

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = ROOT / "configs" / "tasks" / "repair.jsonl"
BY_NAME = {r.name: r for r in REPOS}


@pytest.fixture(scope="module")
def taskset():
    return load_taskset(SHIPPED, repair.EVALUATOR)


def workspace(tmp_path: Path, taskset, task_id: str) -> Path:
    ws = tmp_path / "exec-1" / "workspace"
    ws.mkdir(parents=True)
    assert build({"files": dict(taskset.by_id[task_id].files)}, ws) is None
    return ws


def fix(ws: Path, taskset, task_id: str, count: int | None = None) -> None:
    for edit in taskset.by_id[task_id].meta["fix"][:count]:
        path = ws / edit["path"]
        path.write_text(path.read_text().replace(edit["old"], edit["new"], 1))


def score(taskset, task_id: str, ws: Path) -> float:
    return taskset.evaluators[task_id].evaluate("x1", ws).score


def test_the_shipped_task_set_is_the_generators():
    assert SHIPPED.read_text() == jsonl(build_tasks())


@pytest.mark.parametrize("repo", REPOS, ids=lambda r: r.name)
def test_exactly_the_declared_tests_fail_with_the_bugs_planted(tmp_path, repo):
    evaluator = RepairEvaluator(**build_tasks()[REPOS.index(repo)]["evaluator_args"])
    for name, files in (("correct", repo.sources), ("buggy", planted(repo))):
        ws = tmp_path / name
        build({"files": {**files, **repo.tests}}, ws)
        outcomes = evaluator.outcomes(ws)
        assert set(outcomes) == set(evaluator.expected)
        failing = {t for t, o in outcomes.items() if o != "pass"}
        assert failing == (set() if name == "correct" else {t for b in repo.bugs for t in b.breaks})


@pytest.mark.parametrize("task_id", ["repair-textkit", "repair-statkit", "repair-spans", "repair-wordcount"])
def test_untouched_scores_the_base_share_and_the_fix_scores_one(tmp_path, taskset, task_id):
    ws = workspace(tmp_path, taskset, task_id)
    broken = {t for b in taskset.by_id[task_id].meta["breaks"] for t in b}
    total = len(taskset.evaluators[task_id].expected)
    first = taskset.evaluators[task_id].evaluate("x1", ws)
    assert first.valid and first.score == pytest.approx(1 - len(broken) / total) and first.score < 1
    assert first.binding.artifact_version == artifact_version(ws)
    fix(ws, taskset, task_id)
    assert score(taskset, task_id, ws) == 1.0


def test_half_a_repair_scores_in_between(tmp_path, taskset):
    ws = workspace(tmp_path, taskset, "repair-wordcount")
    fix(ws, taskset, "repair-wordcount", count=1)
    second_bug = taskset.by_id["repair-wordcount"].meta["breaks"][1]
    assert score(taskset, "repair-wordcount", ws) == pytest.approx(1 - len(second_bug) / 6)


def test_edited_or_deleted_tests_are_restored(tmp_path, taskset):
    ws = workspace(tmp_path, taskset, "repair-textkit")
    base = score(taskset, "repair-textkit", ws)
    (ws / "tests" / "test_slug.py").write_text("import unittest\nclass T(unittest.TestCase):\n"
                                               "    def test_leading(self): pass\n")
    assert score(taskset, "repair-textkit", ws) == base
    (ws / "tests" / "test_slug.py").unlink()
    assert score(taskset, "repair-textkit", ws) == base


def test_a_syntax_error_or_a_deleted_module_fails_its_tests(tmp_path, taskset):
    ws = workspace(tmp_path, taskset, "repair-spans")
    fix(ws, taskset, "repair-spans")
    (ws / "spans" / "merge.py").write_text("def merge(intervals):\n    return [\n")
    assert score(taskset, "repair-spans", ws) == 0.0
    (ws / "spans" / "merge.py").unlink()
    assert score(taskset, "repair-spans", ws) == 0.0


def test_a_hanging_test_is_cut_at_the_timeout_and_finished_tests_count(tmp_path, taskset):
    args = dict(build_tasks()[REPOS.index(BY_NAME["spans"])]["evaluator_args"], timeout_s=2.0)
    ws = workspace(tmp_path, taskset, "repair-spans")
    fix(ws, taskset, "repair-spans")
    merge = ws / "spans" / "merge.py"
    merge.write_text(merge.read_text().replace("    out = []\n", "    out = []\n    while intervals == []:\n"
                                                                     "        pass\n"))
    outcomes = RepairEvaluator(**args).outcomes(ws)
    assert "test_merge.MergeTests.test_empty" not in outcomes  # it hung: counted as not passed
    assert outcomes["test_merge.MergeTests.test_apart"] == "pass"  # ran before it (alphabetical order)
    assert RepairEvaluator(**args).evaluate("x1", ws).score == pytest.approx(1 / 4)


def test_evaluation_is_pure_and_leaves_the_workspace_untouched(tmp_path, taskset):
    ws = workspace(tmp_path, taskset, "repair-statkit")
    before = artifact_version(ws)
    a, b = (taskset.evaluators["repair-statkit"].evaluate("x1", ws) for _ in range(2))
    assert a == b and artifact_version(ws) == before
    assert not list(ws.rglob("__pycache__"))


def test_no_repository_is_no_evaluable_work_and_a_dead_runner_is_a_failure(tmp_path, taskset):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "TASK.md").write_text("prompt only")
    evaluator = taskset.evaluators["repair-spans"]
    assert evaluator.evaluate("x1", empty) is None
    ws = workspace(tmp_path, taskset, "repair-spans")
    dead = RepairEvaluator(evaluator.tests, evaluator.expected, evaluator.sources, evaluator.timeout_s,
                           runner=tmp_path / "missing_runner.py")  # the runner exits before its file
    with pytest.raises(EvaluatorFailure, match="left no results"):
        dead.evaluate("x1", ws)


@pytest.mark.parametrize("args, message", [
    ({"tests": {}, "expected": ["t.A.test"]}, "tests must map"),
    ({"tests": {"../t.py": ""}, "expected": ["t.A.test"]}, "inside the workspace"),
    ({"tests": {"t.py": ""}, "expected": []}, "expected must be a non-empty list"),
    ({"tests": {"t.py": ""}, "expected": ["u.A.test"]}, "name no test file"),
    ({"tests": {"t.py": ""}, "expected": ["t.A.test"], "timeout_s": 0}, "timeout_s must be > 0"),
])
def test_bad_evaluator_arguments_are_named(args, message):
    with pytest.raises(ValueError, match=message):
        RepairEvaluator(**args)


def test_workspace_setup_copies_writes_runs_and_execs(tmp_path):
    source = tmp_path / "src"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "a.txt").write_text("copied")
    ws = tmp_path / "ws"
    ws.mkdir()
    spec = tmp_path / "setup.json"
    spec.write_text('{"task_id": "t", "copy": "%s", "files": {"deep/er/b.txt": "written"}, '
                    '"setup": ["cat pkg/a.txt deep/er/b.txt > both.txt"], "timeout_s": 30}' % source)
    done = subprocess.run([sys.executable, "-m", "gyre.real.harness.workspace_setup", str(spec), "--",
                           sys.executable, "-c", "import pathlib; print(pathlib.Path('both.txt').read_text())"],
                          cwd=ws, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "copiedwritten"
    assert (tmp_path / "setup.done").exists()
    (tmp_path / "setup.done").unlink()
    spec.write_text('{"task_id": "t", "setup": ["exit 3"]}')
    failed = subprocess.run([sys.executable, "-m", "gyre.real.harness.workspace_setup", str(spec), "--", "true"],
                            cwd=ws, capture_output=True, text=True, timeout=60)
    assert failed.returncode == 4 and "setup command exited 3: 'exit 3'" in failed.stderr
    assert not (tmp_path / "setup.done").exists()  # the task set scores this execution as a total failure


def test_the_edit_tool_replaces_exact_unique_text_inside_the_workspace(tmp_path):
    (tmp_path / "m.py").write_text("a = 1\nb = 1\nb = 1\n")
    reply = ("Fixing.\n<<<EDIT m.py\na = 1\n===\na = 2\n>>>\n<<<EDIT m.py\nb = 1\n===\nb = 2\n>>>\n"
             "<<<EDIT ../m.py\na = 2\n===\na = 3\n>>>\n<<<EDIT gone.py\nx\n===\ny\n>>>")
    assert apply_edits(reply, tmp_path) == ["edit m.py: applied", "edit m.py: old text found 2 times, need exactly 1",
                                            "edit ../m.py: refused, outside the workspace",
                                            "edit gone.py: no such file"]
    assert (tmp_path / "m.py").read_text() == "a = 2\nb = 1\nb = 1\n"
    assert apply_edits("no edits here", tmp_path) == []
