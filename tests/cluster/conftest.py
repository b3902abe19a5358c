"""One local multi-node Ray cluster shaped like ``k8s/overlays/cpu``, with the
``serveConfigV2`` that overlay carries deployed through the head's dashboard.

Every node runs on this host and shares its 2 cores, so the overlay's Derender, which
scales on its CPU, is measured against the share of a core one replica can use here
(``on_shared_host``), not the core it reserves on a CPU node.

``SCALEOUT_CLUSTER_FULL=1`` (``make test-cluster``) runs every fault, with the
overlay's scaling options and Ray's timing as written. Without it (``make test``,
CI) the ramp and one fault run, and what the test waits on comes sooner, to keep CI
in its budget (``REDUCED_*``):

- an idle node goes after 10 s rather than the overlay's 30 s;
- Serve averages Derender's load over 11 s rather than its default 30 s (the least
  the graph takes: Serve refuses a window within its 10 s metrics interval) and
  scales it in after 5 s rather than the overlay's 20 s;
- Ray's GCS declares a node dead after 3 missed health checks 1 s apart rather than
  5 missed 3 s apart, so a lost node's replicas exit ~6 s after it, not ~17 s;
- the load goes on 19 s past the loss rather than 25 s.

What is checked is the same: the node's replicas exit and their streams end within
5 s of that, requests sent 15 s after it all succeed, and both scale in.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import pytest

from bench.harness.cluster import (
    LocalCluster,
    deploy_rayservice,
    local_cluster,
    set_client_env,
)
from bench.harness.cluster_shape import ClusterShape
from bench.harness.kustomize import on_shared_host, overlay, with_derender_scaling

FULL = os.environ.get("SCALEOUT_CLUSTER_FULL") == "1"
OVERLAY = "cpu"
REDUCED_IDLE_TIMEOUT_S = 10.0
REDUCED_DERENDER_SCALE_IN = {"look_back_period_s": 11.0, "downscale_delay_s": 5.0}
REDUCED_NODE_DEATH = {
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}
# How long the ramp's load goes on sending after a lost node's replicas have exited:
# past the 15 s after which every request must succeed, by 10 requests at 3/s.
AFTER_LOSS_S = 25.0 if FULL else 19.0


@dataclass
class ClusterGraph:
    cluster: LocalCluster
    base_url: str

    @property
    def model(self) -> str:
        return str(httpx.get(f"{self.base_url}/v1/models", timeout=30).json()["data"][0]["id"])


@pytest.fixture(scope="package")
def cluster_graph(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterGraph]:
    set_client_env()
    rayservice = on_shared_host(overlay(OVERLAY))
    work: Path = tmp_path_factory.mktemp("cluster")
    shape = ClusterShape.of(rayservice)
    ray_settings = {}
    if not FULL:
        shape = replace(shape, idle_timeout_s=min(shape.idle_timeout_s, REDUCED_IDLE_TIMEOUT_S))
        rayservice = with_derender_scaling(rayservice, REDUCED_DERENDER_SCALE_IN)
        ray_settings = REDUCED_NODE_DEATH
    with local_cluster(shape, work, ray_settings=ray_settings) as cluster:
        yield ClusterGraph(cluster, deploy_rayservice(cluster, rayservice))
