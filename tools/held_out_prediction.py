"""Held-out prediction of CPU demo runs: each run predicted from another run's calibrated costs.

    tools/isolated.sh .venv/bin/python tools/held_out_prediction.py --out runs/held-out --seeds 0,1,2

For each seed, runs ``gyre run --config configs/cpu_demo.toml --set seed=S`` into
``OUT/seed-S`` unless a finished run is already there (its ``summary.json``);
each run calibrates itself at its end (``costs.toml``, ``gyre.analysis.calibrate``).
Run each seed under the heavy-run lock (``flock /tmp/gyre-heavy.lock``) on a
shared machine, or pass ``--no-run`` to only compare folders already made.

Then every run is predicted from every other run's costs, exactly as
``gyre calibrate RUN_B --costs RUN_A/costs.toml`` does
(``gyre.analysis.sim_vs_real.compare_run``: B's own trace and schedule, A's
constants; nothing of B is fitted). Printed: one row per ordered pair, and the
medians over the runs predicted in a cycle (seed i from seed i-1), in the
measures docs/simulator.md section 7 states its aims in: the median of each step's own
relative wall-time error (aim 20 %), the share of steps whose training cells
agree (aim 80 %), and the total's error (aim 10 %). ``OUT/held_out.json``
keeps every figure.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "configs" / "cpu_demo.toml"


def run_demo(out: Path, seed: int, steps: int | None) -> Path:
    """A finished demo run for ``seed`` in ``out/seed-S`` (made unless there)."""
    work = out / f"seed-{seed}"
    if (work / "summary.json").exists():
        return work
    command = [sys.executable, "-m", "gyre.cli", "run", "--config", str(DEMO), "--set", f"seed={seed}",
               "--set", f'workdir="{work}"', "--set", f'model_dir="{out / "tokenizer"}"']
    if steps is not None:
        command += ["--set", f"steps={steps}"]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return work


def table(result: dict) -> str:
    lines = ["predicted | costs from | total real -> sim (error) | per-step error (of mean step) | "
             "median per-step relative error | same cells"]
    for p in result["pairs"]:
        lines.append(f"seed {p['predicted']} | seed {p['costs_from']} | {p['real_total_s']:.1f} -> "
                     f"{p['sim_total_s']:.1f} s ({100 * p['total_error']:+.1f} %) | {100 * p['step_error']:.1f} % | "
                     f"{100 * p['step_error_median']:.1f} % | {100 * p['same_cells_share']:.0f} % of {p['steps']}")
    m = result["medians"]
    cycle = ", ".join(f"seed {b} from seed {a}" for b, a in result["cycle"])
    lines.append(f"medians over {cycle}: median per-step relative error {100 * m['step_error_median']:.1f} %, "
                 f"per-step error of the mean step {100 * m['step_error']:.1f} %, "
                 f"same cells {100 * m['same_cells_share']:.0f} %, total error {100 * m['total_error']:+.1f} %")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder holding one run folder per seed")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (at least two)")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default: the demo's)")
    parser.add_argument("--no-run", action="store_true", help="compare the run folders already in OUT only")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    if len(set(seeds)) < 2:
        parser.error("--seeds needs at least two different seeds")
    args.out.mkdir(parents=True, exist_ok=True)
    runs = {s: (args.out / f"seed-{s}" if args.no_run else run_demo(args.out, s, args.steps)) for s in seeds}
    missing = [str(p) for p in runs.values() if not (p / "costs.toml").exists()]
    if missing:
        print(f"held_out_prediction: no calibrated run (costs.toml) in {', '.join(missing)}", file=sys.stderr)
        return 2
    from gyre.analysis.sim_vs_real import held_out

    result = held_out(runs)
    (args.out / "held_out.json").write_text(json.dumps(result, indent=2))
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
