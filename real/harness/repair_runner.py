"""Run a repository's unittest files and record each test's outcome: ``python -I repair_runner.py ROOT OUT FILE...``.

Started by ``harness.repair`` as a separate process (standard library only,
``-I`` so nothing but ``ROOT`` is added to the import path), in a scratch copy
of the workspace. Each test file is imported from its path (module name: the
file's stem), its ``unittest.TestCase`` tests run one by one, and ``OUT`` (a
JSON object ``{test id: "pass" | "fail" | "error"}``, ids ``stem.Class.test``)
is rewritten after every test, so a run killed at its timeout still reports
the tests that finished. A file that does not import reports nothing (its
tests count as not passed). ``OUT`` is created (empty) before any repository
code runs: a missing ``OUT`` means the runner itself never started.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import sys
import unittest


def write(out: str, results: dict[str, str]) -> None:
    tmp = out + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(results, handle)
    os.replace(tmp, out)


def cases(suite: unittest.TestSuite):
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            yield from cases(item)
        else:
            yield item


def main(argv: list[str]) -> int:
    root, out, files = argv[0], argv[1], argv[2:]
    results: dict[str, str] = {}
    write(out, results)
    os.chdir(root)
    sys.path.insert(0, root)
    for path in files:
        stem = os.path.splitext(os.path.basename(path))[0]
        try:
            spec = importlib.util.spec_from_file_location(stem, os.path.join(root, path))
            module = importlib.util.module_from_spec(spec)
            sys.modules[stem] = module
            spec.loader.exec_module(module)
            suite = unittest.defaultTestLoader.loadTestsFromModule(module)
        except BaseException:  # noqa: BLE001 - a broken repository is scored, not raised
            continue
        for case in cases(suite):
            result = unittest.TestResult()
            try:
                case.run(result)
            except BaseException:  # noqa: BLE001
                results[case.id()] = "error"
            else:
                results[case.id()] = "pass" if result.wasSuccessful() and not result.skipped else (
                    "error" if result.errors else "fail")
            write(out, results)
    return 0


if __name__ == "__main__":
    sys.stdout = sys.stderr = io.StringIO()  # the repository's prints are not the runner's output
    sys.exit(main(sys.argv[1:]))
