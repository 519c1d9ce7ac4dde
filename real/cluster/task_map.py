"""Spreading independent evaluations over a Ray cluster: the mapper ``gyre plan --ray`` and ``gyre sweep --ray`` use.

``ray_mapper(address)`` connects to the cluster at ``address`` (a head's GCS
``HOST:PORT``, or ``auto``) and yields a ``RayMapper``: ``mapper(fn, items)``
runs ``fn(item)`` for every item as one Ray task each (one logical CPU) and
returns the results in the order of ``items``, as a local ``map`` would. The
simulator's evaluation functions are deterministic, so the same items give
the same results here as in local worker processes; what differs is only
where they ran (``RayMapper.nodes``: tasks per node id).

``fn`` travels by reference (module and name), so every node must have the
same ``gyre`` installed (``pip install -e '.[cluster]'`` on every node, as
``gyre run --cluster`` already requires). The connection is closed when the
context ends; the cluster itself is never stopped.

Invariants: results are in item order; a task that raises re-raises its
exception here (``ray.get``); Ray is imported only when a mapper is made.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any, Callable, Iterator


def _run_here(fn: Callable[[Any], Any], item: Any) -> tuple[Any, str]:
    import ray

    return fn(item), ray.get_runtime_context().get_node_id()


class RayMapper:
    """``mapper(fn, items)`` over Ray tasks; ``nodes`` counts the tasks each node ran."""

    def __init__(self, remote: Any) -> None:
        self._remote = remote
        self.nodes: Counter[str] = Counter()

    def __call__(self, fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        import ray

        pairs = ray.get([self._remote.remote(fn, item) for item in items])
        self.nodes.update(node for _, node in pairs)
        return [result for result, _ in pairs]


@contextlib.contextmanager
def ray_mapper(address: str) -> Iterator[RayMapper]:
    """Connect to the Ray cluster at ``address`` for the duration of the context (module docstring)."""
    try:
        import ray
    except ImportError:
        raise ValueError("--ray needs Ray: pip install -e '.[cluster]'") from None
    try:
        ray.init(address=address, namespace="gyre-plan", log_to_driver=False, logging_level="WARNING")
    except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ValueError... for a bad address
        raise ValueError(f"cannot connect to the Ray cluster at {address!r}: {type(exc).__name__}: {exc}") from None
    try:
        yield RayMapper(ray.remote(num_cpus=1)(_run_here))
    finally:
        ray.shutdown()
