"""A local Ray cluster of two nodes for the cluster tests: the head and one more node process on this
machine (``ray.cluster_utils.Cluster``), shut down through its handle (never ``ray stop``, which would
stop every Ray on the machine) whatever the test raised."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator


@contextmanager
def two_ray_nodes(head: dict[str, Any], node: dict[str, Any]) -> Iterator[Any]:
    """The cluster (``.address`` to join it), its head started with ``head`` and its second node with
    ``node`` (``num_cpus``, ``num_gpus``, ``resources``), both up before it is yielded."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={**head, "include_dashboard": False})
    try:
        cluster.add_node(**node)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()
