"""The local cluster's shape from a RayService manifest, and the multinode bench's math."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from bench.harness.cluster_shape import HEAD_GROUP, ClusterShape
from bench.harness.kustomize import SHARED_HOST_DERENDER_CORES, on_shared_host, overlay
from bench.multinode.report import second_half, slope_per_minute
from deployments.config.graph_config import GraphConfig


def test_the_cpu_overlay_gives_the_node_groups_as_ray_resources() -> None:
    shape = ClusterShape.of(overlay("cpu"))
    assert shape.head_cpus == 0
    groups = {g.name: g for g in shape.groups}
    assert groups["engine"].resources == {"CPU": 0.0, "engine": 1.0}
    assert (groups["engine"].min_nodes, groups["engine"].max_nodes) == (1, 1)
    assert groups["cpu-text"].resources == {"CPU": 2.0}
    assert groups["cpu-text"].min_nodes < groups["cpu-text"].max_nodes
    assert shape.idle_timeout_s == 30


def test_the_autoscaler_config_has_every_group_and_a_head_without_cpus() -> None:
    shape = ClusterShape.of(overlay("cpu"))
    config = shape.autoscaling_config("127.0.0.1:1234")
    types = config["available_node_types"]
    assert set(types) == {"ray.head.default", "engine", "cpu-text"}
    assert types["ray.head.default"]["resources"] == {"CPU": 0.0}
    assert types["cpu-text"]["max_workers"] == 3
    assert config["provider"]["gcs_address"] == "127.0.0.1:1234"
    assert config["provider"]["module"].endswith("FakeMultiNodeProvider")
    assert config["idle_timeout_minutes"] == pytest.approx(0.5)


def test_a_node_is_told_apart_by_its_resources() -> None:
    shape = ClusterShape.of(overlay("cpu"))
    assert shape.group_of({"CPU": 0.0, "engine": 1.0, "memory": 1e9}) == "engine"
    assert shape.group_of({"CPU": 2.0, "memory": 1e9}) == "cpu-text"
    assert shape.group_of({"CPU": 2.0, "engine": 1.0}) == "?"  # no group offers both
    assert HEAD_GROUP not in {g.name for g in shape.groups}


def test_rss_slope_is_least_squares_over_the_second_half() -> None:
    points = [(0.0, 100.0), (5.0, 400.0), (10.0, 500.0), (15.0, 510.0), (20.0, 520.0)]
    half = second_half(points, 20)
    assert [x for x, _ in half] == [10.0, 15.0, 20.0]
    assert slope_per_minute(half) == pytest.approx(2.0)
    assert slope_per_minute(points[:1]) is None
    assert slope_per_minute([(1.0, 5.0), (1.0, 6.0)]) is None


def test_the_cpu_overlay_scales_its_cpu_tiers_on_cpu_and_a_shared_host_shrinks_the_cores() -> None:
    def derender_policy(rayservice: dict[str, Any]) -> dict[str, Any]:
        (app,) = yaml.safe_load(rayservice["spec"]["serveConfigV2"])["applications"]
        config = GraphConfig.from_args(app["args"])
        assert config.render.autoscaling is not None
        assert config.render.autoscaling.policy == "cpu"
        num_cpus = config.derender.num_cpus
        policy: dict[str, Any] = config.derender.to_serve(num_cpus)["autoscaling_config"]["policy"]
        return policy["policy_kwargs"]

    manifest = overlay("cpu")
    # On a CPU node a Derender replica may use the core it reserves.
    assert derender_policy(manifest) == {"target_utilization": 0.7, "cores_per_replica": 1.0}
    shared = derender_policy(on_shared_host(manifest))
    assert shared == {"target_utilization": 0.7, "cores_per_replica": SHARED_HOST_DERENDER_CORES}
