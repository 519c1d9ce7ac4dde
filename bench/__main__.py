"""Run every benchmark: each ``bench/bench_*.py`` exposes ``main() -> dict``.

Benchmarks print their figures (ratios, throughput) and return them; this
runner prints one JSON summary at the end. ``python -m bench NAME`` runs one.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    here = Path(__file__).parent
    sys.path.insert(0, str(here.parent))
    names = sorted(m.name for m in pkgutil.iter_modules([str(here)]) if m.name.startswith("bench_"))
    if argv:
        names = [n for n in names if any(a in n for a in argv)]
    results = {}
    for name in names:
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        results[name] = importlib.import_module(f"bench.{name}").main()
        print(f"   ({time.perf_counter() - t0:.1f} s)", flush=True)
    print(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
