"""Trajectory processor benchmark on a synthetic docs/trajectories.md#trajectory-trees execution.

Figures (one seeded execution: 636 requests, ~1M unique tokens, main and
sub-agent compactions, retries, interleaved sub-agents):
- tree build: wall time (best of 3) and memory (tracemalloc: bytes held once
  built and closed, and peak while building; and the bytes of the token store:
  id int32 + provenance uint8 + behaviour log-probability float64 = 13 bytes
  per position);
- naive path expansion: every candidate trajectory (leaf path) stored
  separately, built without a tree (``_expand_paths``), same 13 bytes per
  token: wall time (best of 3), tracemalloc peak; and naive per-request storage,
  every request's full input + output sequence stored separately (what a
  record-by-record store without prefix sharing holds);
- admission (J_max = 5) plus materialization into token rows: median wall time
  over 21 seeds, with the number of rows and tokens materialized;
- the execution's record log: size with prefix-delta frames and without,
  write (no fsync) and read times.
Run: ``.venv/bin/python -m bench trajectory``.
"""

from __future__ import annotations

import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from gyre.trajectory.admission import admit_trajectories
from gyre.trajectory.harness_roles import ClaudeCodeRoles
from gyre.trajectory.rows import materialize
from gyre.real.store.tito_log import RecordLog, read_records
from gyre.trajectory.synthetic import ExecutionShape, synthetic_execution
from gyre.trajectory.tree import TrajectoryTree
from gyre.trajectory.tree_stats import tree_stats

BYTES_PER_TOKEN = 4 + 1 + 8
SEED = 2024


def _timed(fn, repeats: int = 3):
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def _memory(fn) -> tuple[int, int]:
    """(bytes still held by the result, peak bytes while building it), by tracemalloc."""
    tracemalloc.start()
    try:
        result = fn()
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del result
    return held, peak


def _build_tree(records) -> TrajectoryTree:
    tree = TrajectoryTree.from_records(records)
    tree.close()
    return tree


def _expand_paths(records) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Naive path expansion without a tree: one stored copy per trajectory.

    A request whose sequence extends a stored path replaces it by a longer
    copy (keeping the provenance its earlier outputs had there), one contained
    in a stored path adds nothing, any other one starts a new path. The final
    paths are exactly the tree's root-to-leaf paths.
    """
    paths: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for r in records:
        seq, prov = r.sequence, r.provenance
        logp = np.full(len(seq), np.nan)
        logp[len(r.input_ids):] = r.output_logprobs
        for i, (tokens, old_prov, old_logp) in enumerate(paths):
            n = min(len(tokens), len(seq))
            if not np.array_equal(tokens[:n], seq[:n]):
                continue
            if len(seq) > len(tokens):
                np.maximum(prov[:n], old_prov, out=prov[:n])
                logp[:n] = np.where(old_prov == 1, old_logp, logp[:n])
                paths[i] = (seq, prov, logp)
            break
        else:
            paths.append((seq, prov, logp))
    return paths


def _store_per_request(records) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    out = []
    for r in records:
        logp = np.full(len(r.input_ids) + len(r.output_ids), np.nan)
        logp[len(r.input_ids):] = r.output_logprobs
        out.append((r.sequence, r.provenance, logp))
    return out


def _admit_and_materialize(tree: TrajectoryTree, seed: int):
    admitted = admit_trajectories(tree, ClaudeCodeRoles(), np.random.default_rng(seed), j_max=5)
    return materialize(tree, admitted, advantage=1.0, group_id="bench")


def _admission_timing(tree: TrajectoryTree, seeds: int = 21) -> dict:
    times, rows = [], []
    for seed in range(seeds):
        start = time.perf_counter()
        rows = _admit_and_materialize(tree, seed)
        times.append(time.perf_counter() - start)
    return {
        "admission_materialization_jmax5_median_ms": round(1e3 * statistics.median(times), 2),
        "admitted_rows": len(rows),
        "materialized_tokens": sum(r.num_tokens for r in rows),
        "admitted_targets": sum(r.num_targets for r in rows),
    }


def _build_figures(records) -> dict:
    build_s, tree = _timed(lambda: _build_tree(records))
    stats = tree_stats(tree)
    expand_s, paths = _timed(lambda: _expand_paths(records))
    assert sum(len(p[0]) for p in paths) == stats.expanded_tokens and len(paths) == stats.leaves
    per_request_s, _ = _timed(lambda: _store_per_request(records), repeats=1)
    request_tokens = sum(len(r.input_ids) + len(r.output_ids) for r in records)
    tree_mem, naive_mem = _memory(lambda: _build_tree(records)), _memory(lambda: _expand_paths(records))
    mb = lambda n: round(n / 1e6, 2)  # noqa: E731
    return {
        "requests": stats.requests, "unique_tokens": stats.unique_tokens, "trainable_tokens": stats.trainable_tokens,
        "request_tokens_total": request_tokens, "nodes": stats.nodes, "leaves": stats.leaves,
        "path_nodes_min_max": [min(stats.path_nodes), max(stats.path_nodes)],
        "shared_prefix_nodes_top2": [p.depth_nodes for p in stats.shared_prefixes[:2]],
        "tree_build_s": round(build_s, 4), "tree_store_mb": mb(stats.unique_tokens * BYTES_PER_TOKEN),
        "tree_held_mb": mb(tree_mem[0]), "tree_build_peak_mb": mb(tree_mem[1]),
        "expanded_path_tokens": stats.expanded_tokens, "naive_path_expansion_s": round(expand_s, 4),
        "naive_path_expansion_mb": mb(stats.expanded_tokens * BYTES_PER_TOKEN),
        "naive_path_expansion_held_mb": mb(naive_mem[0]), "naive_path_expansion_peak_mb": mb(naive_mem[1]),
        "naive_per_request_s": round(per_request_s, 4),
        "naive_per_request_mb": round(request_tokens * BYTES_PER_TOKEN / 1e6, 1),
        "memory_ratio_paths_vs_tree": round(stats.expanded_tokens / stats.unique_tokens, 2),
        "memory_ratio_requests_vs_tree": round(request_tokens / stats.unique_tokens, 1),
    }, tree


def _record_log_figures(records) -> dict:
    with tempfile.TemporaryDirectory() as root:
        path = Path(root) / "bench.tito"
        start = time.perf_counter()
        with RecordLog(path, records[0].execution_id) as log:
            for record in records:
                log.append(record)
        write_s = time.perf_counter() - start
        start = time.perf_counter()
        assert len(read_records(path)) == len(records)
        read_s = time.perf_counter() - start
        size = path.stat().st_size
    full = sum(len(r.to_bytes()) + 12 for r in records)
    return {"record_log_mb": round(size / 1e6, 2), "record_log_without_deltas_mb": round(full / 1e6, 1),
            "record_log_write_s": round(write_s, 3), "record_log_read_s": round(read_s, 3)}


def main() -> dict:
    records = synthetic_execution(np.random.default_rng(SEED), ExecutionShape())
    figures, tree = _build_figures(records)
    figures.update(_admission_timing(tree))
    figures.update(_record_log_figures(records))
    width = max(map(len, figures))
    for name, value in figures.items():
        print(f"   {name:<{width}}  {value}")
    return figures


if __name__ == "__main__":
    main()
