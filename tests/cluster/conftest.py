"""One local multi-node Ray cluster shaped like ``k8s/overlays/cpu``, with the
``serveConfigV2`` that overlay carries deployed through the head's dashboard.

``SCALEOUT_CLUSTER_FULL=1`` (``make test-cluster``) runs every fault, with the
overlay's autoscaler options as written; without it (``make test``, CI) the ramp
and one fault run, and an idle node goes after REDUCED_IDLE_TIMEOUT_S rather than
the overlay's 30 s (what is checked, that it goes, is the same), to keep CI in its
budget.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import pytest

from bench.harness.cluster import (
    ClusterShape,
    LocalCluster,
    deploy_rayservice,
    local_cluster,
    set_client_env,
)
from bench.harness.kustomize import overlay

FULL = os.environ.get("SCALEOUT_CLUSTER_FULL") == "1"
REDUCED_IDLE_TIMEOUT_S = 10.0
OVERLAY = "cpu"


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
    rayservice = overlay(OVERLAY)
    work: Path = tmp_path_factory.mktemp("cluster")
    shape = ClusterShape.of(rayservice)
    if not FULL:
        shape = replace(shape, idle_timeout_s=min(shape.idle_timeout_s, REDUCED_IDLE_TIMEOUT_S))
    with local_cluster(shape, work) as cluster:
        yield ClusterGraph(cluster, deploy_rayservice(cluster, rayservice))
