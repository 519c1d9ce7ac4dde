"""A local Ray cluster of two nodes for the cluster tests: the head and one more node process on this
machine (``ray.cluster_utils.Cluster``), shut down through its handle (never ``ray stop``, which would
stop every Ray on the machine) whatever the test raised; and ``loopback_only``, the mark that skips a
test outside a loopback-only network namespace: Ray listens on every interface and advertises the
machine's address, so only there does a test stay on 127.0.0.1."""

from __future__ import annotations

import socket
from contextlib import contextmanager
from typing import Any, Iterator

import pytest

loopback_only = pytest.mark.skipif([name for _, name in socket.if_nameindex()] != ["lo"],
                                   reason="not in a loopback-only network namespace "
                                          "(run under tools/isolated.sh as root, as make test does)")


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
