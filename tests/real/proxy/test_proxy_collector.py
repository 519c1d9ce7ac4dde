"""``real/proxy/collector.py``: the proxy process's garbage-collector set-up and its counters.

Each case runs in a fresh interpreter: ``tune`` changes process-wide state that
the test process must keep as CPython sets it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gyre.real.proxy import collector

SCRIPT = """
import gc, json, sys
from gyre.real.proxy import collector
before = collector.stats()
collector.tune(sys.argv[1])
tuned = collector.stats()
for _ in range(200_000):  # cyclic garbage: only a collection frees it
    a = []; a.append(a)
gc.collect()  # one full collection, whatever the mode
after = collector.stats()
try:
    collector.tune(sys.argv[1])
    again = None
except RuntimeError as exc:
    again = str(exc)
print(json.dumps({"before": before, "tuned": tuned, "after": after, "again": again}))
"""


def _run(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_tuned_freezes_startup_objects_raises_the_young_threshold_and_counts_collections() -> None:
    out = _run("tuned")
    assert out["before"]["mode"] is None and out["before"]["frozen"] == 0
    assert out["tuned"]["mode"] == "tuned" and out["tuned"]["frozen"] > 1_000
    assert out["tuned"]["threshold0"] == collector.THRESHOLD0 and out["tuned"]["collections"] == 0
    after = out["after"]
    # 200k cycles at 50k objects per young collection: a few collections, plus the explicit one
    assert 2 <= after["collections"] <= 10, after
    assert after["seconds"] > 0 and 0 < after["longest_ms"] <= after["seconds"] * 1e3
    assert "already tuned" in out["again"]


def test_default_keeps_cpython_settings_and_still_counts() -> None:
    out = _run("default")
    assert out["tuned"]["frozen"] == 0 and out["tuned"]["threshold0"] == 700
    assert out["after"]["collections"] > 100  # 200k cycles at CPython's 700: hundreds of young collections
    assert "already tuned" in out["again"]


def test_an_unknown_mode_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="gc mode must be one of"):
        collector.tune("aggressive")
    assert collector.stats()["mode"] is None  # nothing was changed in this process
