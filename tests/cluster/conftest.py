"""One local multi-node Ray cluster shaped like ``k8s/overlays/cpu``, with the
``serveConfigV2`` that overlay carries deployed through the head's dashboard.

``SCALEOUT_CLUSTER_FULL=1`` (``make test-cluster``) runs every fault, with the
overlay's scaling options as written. Without it (``make test``, CI) the ramp and
one fault run, and the scale-in after the ramp comes sooner, to keep CI in its
budget: an idle node goes after 10 s rather than the overlay's 30 s, and Serve
averages Derender's load over 15 s rather than its default 30 s and scales it in
after 10 s rather than the overlay's 20 s (``REDUCED``). What is checked, that both
scale in, is the same.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bench.harness.cluster import (
    ClusterShape,
    LocalCluster,
    deploy_rayservice,
    local_cluster,
    set_client_env,
)
from bench.harness.kustomize import overlay

FULL = os.environ.get("SCALEOUT_CLUSTER_FULL") == "1"
OVERLAY = "cpu"
REDUCED_IDLE_TIMEOUT_S = 10.0
REDUCED_DERENDER_SCALE_IN = {"look_back_period_s": 15.0, "downscale_delay_s": 10.0}


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
        rayservice = with_derender_scaling(rayservice, REDUCED_DERENDER_SCALE_IN)
    with local_cluster(shape, work) as cluster:
        yield ClusterGraph(cluster, deploy_rayservice(cluster, rayservice))


def with_derender_scaling(rayservice: dict[str, Any], options: dict[str, float]) -> dict[str, Any]:
    """The manifest with ``options`` over its Derender autoscaling, in every application."""
    config = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    for app in config["applications"]:
        autoscaling = app["args"]["derender"]["autoscaling"]
        autoscaling.update(options)
    spec = {**rayservice["spec"], "serveConfigV2": yaml.safe_dump(config)}
    return {**rayservice, "spec": spec}
